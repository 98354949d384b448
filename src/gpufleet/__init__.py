"""gpufleet: plan, build and run GPU clusters for large-model training."""

__version__ = "0.1.0"
