"""Typed errors of the checkpoint runtime."""

from __future__ import annotations

from gpufleet.errors import GpufleetError, InputError


class CheckpointError(GpufleetError):
    """A checkpoint could not be saved, committed, loaded or transferred."""


class CheckpointNameError(CheckpointError, InputError):
    """A checkpoint name or a file path inside one is malformed or would leave the root."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint failed verification; `problems` lists each bad file and why."""

    def __init__(self, where: str, problems: list[str]) -> None:
        self.where = where
        self.problems = list(problems)
        self.partial_template = False
        """Set when values of this checkpoint had already been written into the caller's template."""
        super().__init__(f"checkpoint {where} failed verification: {'; '.join(self.problems)}")


class TransferError(CheckpointError):
    """An upload or download to object storage failed after every retry."""


class StoreUnreachableError(TransferError):
    """The store did not answer (connection refused or timed out, HTTP 5xx) until the retries or the deadline ran
    out: not damage, not a refusal; trying again later may succeed."""


class UnloadableValueError(CheckpointError, InputError):
    """A state dict holds a value that loading (weights-only) would refuse; `key` names where it is."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)
