"""`gpufleet burnin`: a small GPT trained with FSDP2 and CheckpointManager, deterministic across restarts."""
