"""Which checkpoint a manager loads, and loading it: the newest local one that verifies, each damaged or incomplete
one skipped with a warning (and remembered, so that retention never counts it), the store's newest as the last
resort (`restore`).

In one process the checksums are checked while the files are read (each byte read once, `dcp_io.read`); with
several ranks rank 0 verifies the chosen checkpoint in full first and broadcasts its choice. A store that does not
answer during the choice is raised as StoreUnreachableError on every rank, never taken for "no checkpoint".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.runtime.checkpoint.errors import CheckpointError, CorruptCheckpointError, StoreUnreachableError
from gpufleet.runtime.checkpoint.local_root import LocalRoot, local_fs
from gpufleet.runtime.checkpoint.manifest import MANIFEST_NAME, FileEntry
from gpufleet.runtime.checkpoint.ranks import Ranks
from gpufleet.runtime.checkpoint.verify import read_manifest, verify_checkpoint

log = logging.getLogger(__name__)
Loaded = tuple[int, dict[str, Any]]


class Loader:
    """Loads from `root` across `ranks`; `restore()` brings the store's newest complete step home (None: none), and
    `damaged` (step -> problems) collects what a load found damaged, for retention to leave uncounted."""

    def __init__(self, root: LocalRoot, ranks: Ranks, *, verify_on_load: bool, restore: Callable[[], int | None],
                 damaged: dict[int, list[str]]) -> None:
        self.root = root
        self.ranks = ranks
        self.verify_on_load = verify_on_load
        self.restore = restore
        self.damaged = damaged

    def latest(self, template: dict[str, Any] | None) -> Loaded | None:
        """`CheckpointManager.load_latest`."""
        if self.ranks.world_size == 1 and self.verify_on_load:
            return self._latest_verifying(template)
        step = self._agreed_choice()
        if step is None:
            return None
        return step, self.read(step, template)

    def step(self, step: int, template: dict[str, Any] | None) -> dict[str, Any]:
        """`CheckpointManager.load`."""
        path = self.root.step_path(step)
        if self.ranks.world_size == 1 and self.verify_on_load:
            report = verify_checkpoint(local_fs(), str(path), checksums=False)
            if not report.ok or report.manifest is None:
                raise CorruptCheckpointError(str(path), report.problems)
            return self.read(step, template, report.manifest.files)
        problem = None
        if self.ranks.first and self.verify_on_load:
            report = verify_checkpoint(local_fs(), str(path))
            problem = None if report.ok else "; ".join(report.problems)
        problem = self.ranks.broadcast(problem)
        if problem:
            raise CorruptCheckpointError(str(path), problem.split("; "))
        return self.read(step, template)

    def read(self, step: int, template: dict[str, Any] | None,
             expected: dict[str, FileEntry] | None = None) -> dict[str, Any]:
        from gpufleet.runtime.checkpoint import dcp_io

        group = self.ranks.ctl_group if self.ranks.world_size > 1 else None
        return dcp_io.read(self.root.step_path(step), template, group, expected)

    def _agreed_choice(self) -> int | None:
        """Rank 0's choice (`_choose`), on every rank; a store that did not answer it raises on every rank."""
        choice: tuple[int | None, str | None] = (None, None)
        if self.ranks.first:
            try:
                choice = (self._choose(), None)
            except StoreUnreachableError as error:
                if self.ranks.world_size == 1:
                    raise
                choice = (None, str(error))
        step, unreachable = self.ranks.broadcast(choice)
        if unreachable is not None:
            raise StoreUnreachableError(unreachable)
        return step

    def _choose(self) -> int | None:
        """The newest local step that verifies in full (with `verify_on_load`; else whose manifest reads and is of
        that step), else the one restored from the store, else None; each skipped step is logged with why."""
        for step, path in reversed(self.root.step_dirs()):
            if self.verify_on_load:
                problems = verify_checkpoint(local_fs(), str(path)).problems
            else:
                problems = _manifest_problems(path)
            if problems:
                self._skip(step, path, problems)
                continue
            return step
        return self.restore()

    def _latest_verifying(self, template: dict[str, Any] | None) -> Loaded | None:
        """One process: the newest checkpoint that verifies, checked while it is read (each byte read once).

        Presence and sizes are checked first; then every file is hashed as it is read, and a mismatch
        skips the checkpoint with a warning. Values of a damaged checkpoint may by then have been written
        into `template`; the next checkpoint that loads overwrites every one of them (DCP fills every
        key of the template or fails). If none loads after that happened, CorruptCheckpointError is
        raised instead of returning None, so a partly written template is never mistaken for a fresh one.
        """
        damaged: list[str] = []
        for step, path in reversed(self.root.step_dirs()):
            report = verify_checkpoint(local_fs(), str(path), checksums=False)
            if not report.ok or report.manifest is None:
                self._skip(step, path, report.problems)
                continue
            try:
                return step, self.read(step, template, report.manifest.files)
            except CorruptCheckpointError as error:
                self._skip(step, path, error.problems)
                if error.partial_template:
                    damaged.extend(error.problems)
        restored = self.restore()  # verified in full after the download
        if restored is not None:
            return restored, self.read(restored, template)
        if damaged:
            raise _partly_overwritten(str(self.root.path), damaged)
        return None

    def _skip(self, step: int, path: Path, problems: list[str]) -> None:
        """Say which checkpoint a load passed over, and why; a damaged one (its manifest is there) is remembered so
        that retention never counts it."""
        log.warning("checkpoint %s is damaged or incomplete and was skipped: %s", path, "; ".join(problems))
        if os.path.lexists(path / MANIFEST_NAME):
            self.damaged[step] = list(problems)


def _partly_overwritten(where: str, problems: list[str]) -> CorruptCheckpointError:
    failure = CorruptCheckpointError(where, [
        *problems, "no intact checkpoint is left, and the template was partly overwritten by a damaged "
                   "one: re-initialise it before training from scratch"])
    failure.partial_template = True
    return failure


def _manifest_problems(path: Path) -> list[str]:
    """Why the manifest of the checkpoint at `path` does not read as one of its step (empty: it does)."""
    try:
        read_manifest(local_fs(), str(path))
    except CorruptCheckpointError as error:
        return error.problems
    except CheckpointError as error:  # a bad file name listed in it
        return [str(error)]
    return []
