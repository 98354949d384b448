"""Failure rates, checkpoint size and interval, goodput: how often a job of N GPUs is interrupted and
what fraction of its wall time is useful work.

`failures` turns published interruption counts into a per-GPU rate; `checkpoint_interval` sizes and times a
checkpoint and gives Young's and Daly's intervals; `goodput` is Daly's exponential-failure model of
wall time with checkpoints and restarts; `estimate` ties them together for one job.
"""
