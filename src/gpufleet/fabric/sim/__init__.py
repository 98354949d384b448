"""The flow-level collective simulator, by concern (gpufleet.fabric.simulate is its public face).

records: algorithms, phases and results; maxmin: the max-min fair solver; phases: each algorithm's phases;
work: what a simulation costs and its limits; run: solving phases, whole collectives, ranks for a span.
"""
