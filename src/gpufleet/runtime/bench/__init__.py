"""Benchmarks that measure what the model assumes: collectives (nccl-tests' algbw/busbw), GEMMs at a model's own
shapes, memory bandwidth, checkpoint-disk throughput. `disk` needs no torch; the others import it when run."""
