"""The manager's local root: its step folders, the start-up sweep, what stands in a checkpoint's way, and retention.

Nothing that is not a complete checkpoint is deleted: what stands where a checkpoint must go and is not one (a
damaged one, a folder without a manifest, a file) is renamed to the visible `step_….set-aside-XXXXXXXX` and a
warning names it (`set_aside`). The sweep on start removes only hidden leftovers of crashed saves and deletions,
after renaming back any checkpoint a re-save had moved aside and not yet replaced (`restore_superseded`).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpufleet.runtime.checkpoint.fsutil import move_aside, remove_tree, restore, superseded_copies
from gpufleet.runtime.checkpoint.manifest import MANIFEST_NAME
from gpufleet.runtime.checkpoint.names import LATEST_NAME, TMP_PREFIX, TRASH_PREFIX, parse_step, step_dirname
from gpufleet.runtime.checkpoint.retention import delete_checkpoints, plan_retention
from gpufleet.runtime.checkpoint.verify import check_complete

log = logging.getLogger(__name__)


def local_fs() -> Any:
    """The local disk as an fsspec file system (what `verify`, `retention` and copies take)."""
    from fsspec.implementations.local import LocalFileSystem

    return LocalFileSystem()


class LocalRoot:
    """The folder under which one manager keeps `step_…` checkpoints."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def step_path(self, step: int) -> Path:
        return self.path / step_dirname(step)

    def hidden(self, name: str) -> Path:
        """A hidden temporary folder `.tmp-NAME` under the root: never listed or loaded, removed by the sweep."""
        return self.path / f"{TMP_PREFIX}{name}"

    def step_dirs(self) -> list[tuple[int, Path]]:
        """Every real folder named `step_…` (not a file, not a link), as `(step, path)`, oldest first."""
        found = []
        if self.path.is_dir():
            for path in self.path.iterdir():
                step = parse_step(path.name)
                if step is not None and path.is_dir() and not path.is_symlink():
                    found.append((step, path))
        return sorted(found)

    def committed_steps(self) -> list[int]:
        """Steps whose folder holds a manifest, oldest first (not checked further)."""
        return [step for step, path in self.step_dirs() if os.path.lexists(path / MANIFEST_NAME)]

    def open(self) -> None:
        """Create the root if needed, then sweep it (rank 0, once per manager)."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.sweep()

    def sweep(self) -> None:
        """Remove what crashed saves and deletions left behind (hidden temporary and trash dirs), after putting back
        any checkpoint a re-save had moved aside and not yet replaced (`restore_superseded`)."""
        self.restore_superseded()
        for path in self.path.iterdir():
            if path.name.startswith((TMP_PREFIX, TRASH_PREFIX)) and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif path.name.startswith((f"{LATEST_NAME}.tmp-", f"{MANIFEST_NAME}.tmp-")):
                path.unlink(missing_ok=True)

    def restore_superseded(self) -> None:
        """A re-save killed between its two renames (`fsutil.replace_dir`) left the old checkpoint whole under
        `.superseded-step_…` and nothing at `step_…`: rename it back. Where `step_…` is a complete checkpoint (the new
        copy arrived) the superseded one is deleted; where something else stands there, that is set aside first."""
        for name, path in superseded_copies(self.path):
            final = self.path / name
            if parse_step(name) is None:
                continue
            if os.path.lexists(final) and is_complete_checkpoint(final):
                remove_tree(path)
                continue
            if os.path.lexists(final):
                set_aside(final, f"restoring the superseded copy of {name}", "it is not a complete checkpoint")
            restore(path, final)
            log.warning("restored %s from %s: a re-save of it was interrupted before its new copy was in place",
                        final, path.name)

    def retain(self, keep_last: int, keep_every: int | None, known_damaged: Mapping[int, list[str]]) -> list[int]:
        """Delete old complete checkpoints; returns the steps deleted. Damaged ones (`known_damaged` included: found
        damaged by a load) are never counted towards `keep_last` nor deleted; one that cannot be deleted (a
        permission refused) is logged and left while the others still go."""
        plan = plan_retention(local_fs(), [(step, str(path)) for step, path in self.step_dirs()],
                              keep_last, keep_every, known_damaged=known_damaged)
        for path, problems in plan.damaged.values():
            log.warning("checkpoint %s is damaged (%s); retention leaves it in place and does not count it",
                        path, "; ".join(problems))
        failed = delete_checkpoints(local_fs(), plan.delete)
        for step, path in plan.delete.items():
            if step in failed:
                log.warning("retention could not delete %s: %s; left in place", path, failed[step])
        return [step for step in plan.delete if step not in failed]


def is_complete_checkpoint(path: Path) -> bool:
    """Whether `path` is a real folder holding a complete checkpoint (`check_complete`), and nothing else."""
    return path.is_dir() and not path.is_symlink() and check_complete(local_fs(), str(path)).ok


def set_aside(path: Path, doing: str, why: str) -> None:
    """Move what stands where a checkpoint must go to a visible name, whole, and say so."""
    aside = move_aside(path)
    log.warning("%s: %s was in the way (%s); moved aside, whole, to %s (nothing deleted: look at it, then delete "
                "it)", doing, path, why, aside)


def clear_the_way(path: Path, doing: str, why: str) -> None:
    """Set aside whatever stands at `path` unless it is a complete checkpoint (which the caller may replace)."""
    if os.path.lexists(path) and not is_complete_checkpoint(path):
        set_aside(path, doing, why)
