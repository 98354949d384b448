"""Crash-safe async checkpointing: `CheckpointManager`, manifests, verification, object-store copies.

Importing this package does not import torch; `CheckpointManager` pulls it in when created.
"""

from gpufleet.runtime.checkpoint.errors import (
    CheckpointError,
    CheckpointNameError,
    CorruptCheckpointError,
    StoreUnreachableError,
    TransferError,
    UnloadableValueError,
)
from gpufleet.runtime.checkpoint.manager import CheckpointManager, SaveStats
from gpufleet.runtime.checkpoint.manifest import CHECKSUM, MANIFEST_NAME, FileEntry, Manifest
from gpufleet.runtime.checkpoint.remote import StoreFileSystem, StoreRoot
from gpufleet.runtime.checkpoint.retention import RetentionPlan, plan_retention, steps_to_delete
from gpufleet.runtime.checkpoint.store import (
    CheckpointInfo,
    TransferPolicy,
    install_checkpoint,
    list_checkpoints,
    open_url,
)
from gpufleet.runtime.checkpoint.verify import VerifyReport, check_complete, verify_checkpoint

__all__ = [
    "CHECKSUM",
    "MANIFEST_NAME",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointNameError",
    "CorruptCheckpointError",
    "FileEntry",
    "Manifest",
    "RetentionPlan",
    "SaveStats",
    "StoreFileSystem",
    "StoreRoot",
    "StoreUnreachableError",
    "TransferError",
    "TransferPolicy",
    "UnloadableValueError",
    "VerifyReport",
    "check_complete",
    "install_checkpoint",
    "list_checkpoints",
    "open_url",
    "plan_retention",
    "steps_to_delete",
    "verify_checkpoint",
]
