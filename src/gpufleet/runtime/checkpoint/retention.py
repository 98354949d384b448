"""Which committed checkpoints retention may delete: a pure function, tested on its own."""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.runtime.checkpoint.errors import CheckpointError


def steps_to_delete(steps: Iterable[int], keep_last: int, keep_every: int | None = None) -> list[int]:
    """The steps to delete: all but the newest `keep_last`, sparing multiples of `keep_every`.

    Only committed (manifest-bearing) checkpoints may be passed in: a half-written newer checkpoint
    must never count towards `keep_last`.
    """
    if keep_last < 1:
        raise CheckpointError(f"keep_last must be at least 1 (the newest checkpoint is never deleted), got {keep_last}")
    if keep_every is not None and keep_every < 1:
        raise CheckpointError(f"keep_every must be a positive number of steps, got {keep_every}")
    ordered = sorted(set(steps), reverse=True)
    old = ordered[keep_last:]
    return sorted(s for s in old if not (keep_every and s % keep_every == 0))
