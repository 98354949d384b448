"""One save, written and committed on local disk (the background half of `CheckpointManager.save`):

    1. rank 0 empties `.tmp-step_…`; every rank waits for it (barrier on the writer's side group)
    2. every rank writes its DCP shard, fsynced; the coordinator writes `.metadata`
    3. every rank reports its own files' sizes and xxh3-128 (hashed as written) to rank 0 (gather)
    4. rank 0, holding entries from every rank, writes `manifest.json` and fsyncs it
    5. rank 0 renames `.tmp-step_…` to `step_…` and fsyncs the root: this is the commit
    6. rank 0 moves `latest` and hands the step to `on_commit` (retention, the upload queue); all ranks learn the
       outcome

A crash before step 5 leaves only a hidden temporary directory, which is never loaded and is removed on the next
start (`LocalRoot.sweep`); a crash after it leaves a whole, verifiable checkpoint. A re-save of an existing step moves
the old copy to a hidden `.superseded-step_…` first (`fsutil.replace_dir`), which the next start renames back if the
new copy never arrived. Whatever else stands at `step_…` (not a complete checkpoint) is set aside, never deleted.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.runtime.checkpoint.errors import CheckpointError
from gpufleet.runtime.checkpoint.fsutil import atomic_write, fsync_dir, replace_dir
from gpufleet.runtime.checkpoint.local_root import LocalRoot, clear_the_way
from gpufleet.runtime.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, hash_stream
from gpufleet.runtime.checkpoint.names import LATEST_NAME, step_dirname
from gpufleet.runtime.checkpoint.ranks import Ranks

log = logging.getLogger(__name__)
Report = tuple[dict[str, FileEntry], str | None]
"""What one rank tells rank 0 after writing: its files' entries, or why it could not write them."""


@dataclass(frozen=True)
class SaveStats:
    """Timings of the last finished save, in seconds, and its size.

    `write_s` covers DCP writing every shard with fsync and the per-file checksums; `commit_s` runs
    from the gather to the moment the commit is durable (manifest, rename, fsyncs, `latest`).
    """

    step: int
    stage_s: float
    write_s: float
    commit_s: float
    size_bytes: int
    retain_s: float = 0.0
    """Retention after the commit (deleting older checkpoints); not part of `write_s + commit_s`."""


class NotSaved(Exception):
    """Why rank 0 did not commit (a rank failed, files on disk differ): the save fails on every rank."""


def write_and_commit(staged: dict[str, Any], step: int, *, root: LocalRoot, ranks: Ranks, stage_s: float,
                     metadata: dict[str, Any] | None, on_commit: Callable[[int], None]) -> SaveStats:
    """Write `staged` as checkpoint `step` under `root` and commit it (every rank calls this); its timings.

    Raises CheckpointError on every rank when any rank failed to write or the commit failed; the previous
    checkpoints are intact and the temporary directory is removed.
    """
    tmp = root.hidden(step_dirname(step))
    _fresh_folder(tmp, ranks)
    start_s = time.perf_counter()
    report = _write_own_files(staged, tmp, ranks, root.path)
    write_s = time.perf_counter() - start_s
    gathered = ranks.gather(report)
    commit_start_s = time.perf_counter()
    outcome, durable_at_s = _commit_on_first_rank(tmp, step, gathered, metadata, root, ranks, on_commit)
    outcome = ranks.broadcast(outcome, group=ranks.io_group)
    if outcome is not None:
        ranks.barrier(ranks.io_group)  # every rank has stopped touching the temporary directory
        if ranks.first:
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"checkpoint step {step} not saved ({outcome}); the previous ones are intact")
    size_bytes = sum(entry.size_bytes for entries, _ in gathered or [] for entry in entries.values())
    end_s = time.perf_counter()
    durable_s = durable_at_s if durable_at_s is not None else end_s
    return SaveStats(step, stage_s, write_s, durable_s - commit_start_s, size_bytes, retain_s=end_s - durable_s)


def _fresh_folder(tmp: Path, ranks: Ranks) -> None:
    """Step 1: rank 0 empties `tmp`; every rank waits until it has."""
    if ranks.first:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    ranks.barrier(ranks.io_group)


def _write_own_files(staged: dict[str, Any], tmp: Path, ranks: Ranks, root: Path) -> Report:
    """Steps 2-3 on this rank: its DCP shard written and fsynced, then its files' entries; or why it failed."""
    from gpufleet.runtime.checkpoint import dcp_io

    try:
        written = dcp_io.write(staged, tmp, ranks.io_group if ranks.world_size > 1 else None)
        return _own_entries(tmp, ranks.rank, written), None
    except BaseException as error:  # DCP's CheckpointException derives from BaseException
        free_bytes = shutil.disk_usage(root).free
        return {}, f"rank {ranks.rank}: {type(error).__name__}: {error} [{free_bytes} bytes free on {root}]"


def _own_entries(tmp: Path, rank: int, written: dict[str, FileEntry]) -> dict[str, FileEntry]:
    """Size and checksum of this rank's files, each fsynced (again) before it is reported.

    The checksums were computed from the bytes as DCP wrote them; a file without one (its bytes
    did not arrive in order) or whose size on disk differs is hashed by reading it back.
    """
    mine = sorted(tmp.glob(f"__{rank}_*.distcp"))
    if rank == 0:
        mine.append(tmp / ".metadata")
    entries = {}
    for path in mine:
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
            entry = written.get(path.name)
            if entry is None or os.fstat(handle.fileno()).st_size != entry.size_bytes:
                entry = hash_stream(handle)
            entries[path.name] = entry
    return entries


def _commit_on_first_rank(tmp: Path, step: int, gathered: list[Report] | None, metadata: dict[str, Any] | None,
                          root: LocalRoot, ranks: Ranks,
                          on_commit: Callable[[int], None]) -> tuple[str | None, float | None]:
    """Steps 4-6 on rank 0: `(None, when the commit was durable)`, or `(why not, None)`. Other ranks: `(None,
    None)`, until the broadcast tells them."""
    if not ranks.first:
        return None, None
    try:
        files = _agreed_files(tmp, gathered, ranks.world_size)
        _commit(tmp, Manifest(step=step, world_size=ranks.world_size, files=files, framework=_framework(),
                              user=dict(metadata or {})), root)
    except NotSaved as refusal:
        return str(refusal), None
    except Exception as error:
        return f"commit: {type(error).__name__}: {error}", None
    return None, _after_commit(root, step, on_commit)  # the commit is done: nothing here may report it failed


def _agreed_files(tmp: Path, gathered: list[Report] | None, world_size: int) -> dict[str, FileEntry]:
    """Every rank's entries, merged, when every rank wrote and the files on disk are exactly those; else NotSaved
    (the temporary directory removed)."""
    parts = gathered or []
    errors = [error for _, error in parts if error]
    if errors or len(parts) != world_size:
        shutil.rmtree(tmp, ignore_errors=True)
        raise NotSaved("; ".join(errors) or f"{len(parts)} of {world_size} ranks reported")
    files: dict[str, FileEntry] = {}
    for rank_entries, _ in parts:
        files.update(rank_entries)
    on_disk = {path.name for path in tmp.iterdir()}
    if on_disk != set(files):
        shutil.rmtree(tmp, ignore_errors=True)
        raise NotSaved(f"files on disk {sorted(on_disk)} differ from those the ranks reported {sorted(files)}")
    return files


def _framework() -> dict[str, Any]:
    import torch

    return {"name": "torch.distributed.checkpoint", "torch": torch.__version__}


def _commit(tmp: Path, manifest: Manifest, root: LocalRoot) -> None:
    """Write `manifest` into `tmp`, durably, then rename `tmp` into place: the commit."""
    atomic_write(tmp / MANIFEST_NAME, manifest.to_json())
    fsync_dir(tmp)
    final = root.step_path(manifest.step)
    clear_the_way(final, f"saving step {manifest.step}", "it is not a complete checkpoint")
    # an earlier complete save of this very step is superseded: deleted only once the new one is in place
    replace_dir(tmp, final)


def _after_commit(root: LocalRoot, step: int, on_commit: Callable[[int], None]) -> float:
    """Move `latest`, then hand the step to `on_commit`; each failure is logged, none undoes the commit. Returns when
    the commit was durable (`latest` moved).

    Loading never reads `latest` (it lists the step folders), so a `latest` that could not be moved, or old
    checkpoints that could not be deleted, leave every committed checkpoint loadable.
    """
    latest = root.path / LATEST_NAME
    try:
        atomic_write(latest, f"{step_dirname(step)}\n".encode())
    except OSError as error:
        log.warning("checkpoint step %d is committed, but %s could not be updated: %s", step, latest, error)
    durable_at_s = time.perf_counter()
    try:
        on_commit(step)
    except Exception as error:  # a committed save is never reported as failed
        log.warning("checkpoint step %d is committed, but what follows a commit failed: %s", step, error)
    return durable_at_s
