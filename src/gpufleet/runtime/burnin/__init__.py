"""The burn-in job: a small GPT trained under FSDP2 with CheckpointManager and StepMonitor, run as
`torchrun --nproc-per-node N -m gpufleet burnin ...`, that resumes bit for bit after a killed worker; and the few
measurements of a host (GEMM, collectives, memory, disk) that turn it into a catalog entry the planner can price.

Importing this package does not import torch.
"""

from gpufleet.runtime.burnin.config import MODEL_ID, BurninConfig, ModelShape

__all__ = ["MODEL_ID", "BurninConfig", "ModelShape"]
