"""Which checkpoints retention may delete.

`steps_to_delete` is the pure rule; `plan_retention` applies it to the checkpoints found under a root,
counting only those that are complete (`check_complete`, the one definition `list` uses) and, on
request, whose every byte matches its checksum. Damaged checkpoints are never deleted and never counted:
a damaged newer checkpoint cannot push a good older one out of the kept set. `delete_checkpoints` is the one
executor: the manager's retention, its removal of leftovers in the store and `gpufleet ckpt prune` all delete through
it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet.runtime.checkpoint.errors import CheckpointError
from gpufleet.runtime.checkpoint.fsutil import is_local, remove_tree
from gpufleet.runtime.checkpoint.manifest import MANIFEST_NAME
from gpufleet.runtime.checkpoint.names import join
from gpufleet.runtime.checkpoint.verify import check_complete, verify_checkpoint

if TYPE_CHECKING:
    from gpufleet.runtime.checkpoint.remote import StoreFileSystem


def steps_to_delete(steps: Iterable[int], keep_last: int, keep_every: int | None = None) -> list[int]:
    """The steps to delete: all but the newest `keep_last`, sparing multiples of `keep_every`.

    Only complete checkpoints may be passed in: a half-written or damaged newer checkpoint must never
    count towards `keep_last` (`plan_retention` does the sorting).
    """
    if keep_last < 1:
        raise CheckpointError(f"keep_last must be at least 1 (the newest checkpoint is never deleted), got {keep_last}")
    if keep_every is not None and keep_every < 1:
        raise CheckpointError(f"keep_every must be a positive number of steps, got {keep_every}")
    ordered = sorted(set(steps), reverse=True)
    old = ordered[keep_last:]
    return sorted(s for s in old if not (keep_every and s % keep_every == 0))


@dataclass
class RetentionPlan:
    """What retention does under one root: `delete` and `keep` are good checkpoints (step -> path)."""

    delete: dict[int, str] = field(default_factory=dict)
    keep: dict[int, str] = field(default_factory=dict)
    damaged: dict[int, tuple[str, list[str]]] = field(default_factory=dict)
    """Manifest present but the checkpoint is not whole: step -> (path, problems). Never deleted."""
    incomplete: dict[int, str] = field(default_factory=dict)
    """No manifest (a save or a copy that never committed). Never counted; deleted only on request."""


def plan_retention(fs: StoreFileSystem, checkpoints: Sequence[tuple[int, str]], keep_last: int,
                   keep_every: int | None = None, *, checksums: bool = False,
                   known_damaged: Mapping[int, list[str]] | None = None) -> RetentionPlan:
    """Sort `(step, path)` checkpoints into delete / keep / damaged / incomplete.

    Every checkpoint is checked with `check_complete`. With `checksums`, the newest complete ones are
    also read in full, newest first, until `keep_last` of them verify: only those count as kept, so bit
    rot in a newer checkpoint cannot cost an older good one. Damaged checkpoints are left alone. Steps in
    `known_damaged` (step -> problems: found damaged by a load that read their bytes) are damaged without
    further checks, so a checkpoint that failed to load never counts towards `keep_last`.
    """
    steps_to_delete([], keep_last, keep_every)  # validates both
    plan = RetentionPlan()
    good: dict[int, str] = {}
    for step, path in sorted(checkpoints):
        if known_damaged and step in known_damaged:
            plan.damaged[step] = (path, list(known_damaged[step]))
            continue
        report = check_complete(fs, path)
        if report.ok:
            good[step] = path
        elif fs.exists(join(path, MANIFEST_NAME)):
            plan.damaged[step] = (path, report.problems)
        else:
            plan.incomplete[step] = path
    if checksums:
        verified = 0
        for step in sorted(good, reverse=True):
            if verified == keep_last:
                break
            report = verify_checkpoint(fs, good[step])
            if report.ok:
                verified += 1
            else:
                plan.damaged[step] = (good.pop(step), report.problems)
    doomed = set(steps_to_delete(good, keep_last, keep_every))
    for step, path in good.items():
        (plan.delete if step in doomed else plan.keep)[step] = path
    plan.damaged = dict(sorted(plan.damaged.items()))
    return plan


def delete_checkpoints(fs: StoreFileSystem, doomed: Mapping[int, str]) -> dict[int, str]:
    """Delete each checkpoint in `doomed` (step -> path) on the file system `fs`; returns step -> why for those that
    could not be deleted (an OSError: a permission refused), after still deleting the others.

    Crash semantics: on a local disk each goes by `fsutil.remove_tree` (renamed to a hidden `.trash-…` first, so a
    half-deleted checkpoint never keeps its name); in a store by `store.delete_checkpoint` (the manifest first, so a
    half-deleted one is at once no longer complete, only a leftover without a manifest).
    """
    from gpufleet.runtime.checkpoint.store import delete_checkpoint

    failed: dict[int, str] = {}
    for step, path in sorted(doomed.items()):
        try:
            if is_local(fs):
                remove_tree(Path(path))
            else:
                delete_checkpoint(fs, path)
        except OSError as error:
            failed[step] = error.strerror or str(error)
    return failed
