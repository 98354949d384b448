"""CheckpointManager: async, crash-safe, sharded checkpoints with retention and object-store upload.

    save(state_dict, step)   stage to host memory (the stall), then write in a background thread:
        1. rank 0 empties `.tmp-step_…`; every rank waits for it (barrier on a side gloo group)
        2. every rank writes its DCP shard, fsynced; the coordinator writes `.metadata`
        3. every rank reports its own files' sizes and xxh3-128 (hashed as written) to rank 0 (gather)
        4. rank 0, holding entries from every rank, writes `manifest.json` and fsyncs it
        5. rank 0 renames `.tmp-step_…` to `step_…` and fsyncs the root: this is the commit
        6. rank 0 moves `latest`, applies retention, queues the upload; all ranks learn the outcome

A crash before step 5 leaves only a hidden temporary directory, which is never loaded and is removed
on the next start; a crash after it leaves a whole, verifiable checkpoint. A re-save of an existing step moves the
old copy to a hidden `.superseded-step_…` first (`fsutil.replace_dir`); a crash before the new copy is in place
leaves it whole there, and the next start renames it back (`_restore_superseded`): the old copy or the new, never
neither.

Nothing that is not a complete checkpoint is deleted: where a save (step 5) or a restore from the store finds
something at `step_…` that is not a complete checkpoint (a damaged one, a folder without a manifest, a
file), it renames it to the visible `step_….set-aside-XXXXXXXX` and logs a warning; only an earlier
complete checkpoint of the same step is replaced by a new save.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gpufleet.runtime.checkpoint.errors import CheckpointError, CorruptCheckpointError
from gpufleet.runtime.checkpoint.fsutil import (
    atomic_write,
    fsync_dir,
    move_aside,
    remove_tree,
    replace_dir,
    restore,
    superseded_copies,
)
from gpufleet.runtime.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, hash_stream
from gpufleet.runtime.checkpoint.names import (
    LATEST_NAME,
    TMP_PREFIX,
    TRASH_PREFIX,
    join,
    parse_step,
    step_dirname,
)
from gpufleet.runtime.checkpoint.retention import delete_checkpoints, plan_retention, steps_to_delete
from gpufleet.runtime.checkpoint.store import (
    TransferPolicy,
    copy_checkpoint,
    install_checkpoint,
    list_checkpoints,
    open_url,
)
from gpufleet.runtime.checkpoint.uploads import Uploader
from gpufleet.runtime.checkpoint.verify import check_complete, verify_checkpoint

log = logging.getLogger(__name__)
BusyPolicy = Literal["wait", "skip"]
CLOSE_UPLOAD_TIMEOUT_S = 300.0
"""Judgement call: how long `close()` keeps retrying failed uploads by default; long enough to ride out a store's
brief outage, short enough that a job whose store is gone still exits (its checkpoints stay on local disk)."""


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


class CheckpointManager:
    """Crash-safe checkpoints under `root`; see the module docstring for the commit protocol.

    `if_busy` decides what `save()` does while the previous save is still being written: `"wait"`
    blocks until it is durable (the default; no save is lost), `"skip"` returns False at once and
    drops this one. Across ranks the decision is made together, so either every rank saves or none.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        keep_last: int = 3,
        keep_every: int | None = None,
        upload_to: str | None = None,
        storage_options: dict[str, Any] | None = None,
        transfer: TransferPolicy | None = None,
        if_busy: BusyPolicy = "wait",
        process_group: Any | None = None,
        verify_on_load: bool = True,
    ) -> None:
        if if_busy not in ("wait", "skip"):
            raise CheckpointError(f"if_busy must be 'wait' or 'skip', got {if_busy!r}")
        steps_to_delete([], keep_last, keep_every)  # validates both
        self.root = Path(root)
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.if_busy: BusyPolicy = if_busy
        self.verify_on_load = verify_on_load
        self.transfer = transfer or TransferPolicy()
        self._remote: tuple[Any, str] | None = (open_url(upload_to, storage_options)
                                                if upload_to else None)
        self._init_distributed(process_group)
        from gpufleet.runtime.checkpoint.staging import HostStager

        self._stager = HostStager()
        self._pending: threading.Thread | None = None
        self._error: BaseException | None = None
        self._last_committed: int | None = None
        self._found_damaged: dict[int, list[str]] = {}
        """Steps a load of this manager skipped as damaged (step -> why): never counted by retention."""
        self.last_stats: SaveStats | None = None
        self._uploader: Uploader | None = None
        self._closed = False
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            self._sweep()
            if self._remote is not None:
                self._uploader = Uploader(self._upload, retry_after_s=self.transfer.retry_after_s,
                                          retry_max_s=self.transfer.retry_max_s)
        self._barrier(self._ctl_group)

    # -- public API -------------------------------------------------------------------------------

    def save(self, state_dict: dict[str, Any], step: int, *, blocking: bool = False,
             metadata: dict[str, Any] | None = None) -> bool:
        """Stage `state_dict` to host memory and write it as checkpoint `step`.

        Returns False when the save was skipped (policy `"skip"` and a save still in flight), True
        otherwise. With `blocking=True` it returns once the checkpoint is committed and durable. A
        failure of an earlier background save is raised here as CheckpointError. A value that loading would
        refuse (`values.check_loadable`) raises UnloadableValueError naming its key, before anything is written.
        """
        self._check_open()
        step_dirname(step)
        self._check_loadable(state_dict)
        self._raise_pending_error()
        busy = self._pending is not None and self._pending.is_alive()
        if self.if_busy == "skip" and self._any_rank(busy):
            log.info("checkpoint step %d skipped: the previous save is still being written", step)
            return False
        self.wait()
        start_s = time.perf_counter()
        staged = self._stager.stage(state_dict)
        stage_s = time.perf_counter() - start_s
        thread = threading.Thread(target=self._write_guarded, args=(staged, step, stage_s, metadata),
                                  name=f"ckpt-save-{step}", daemon=True)
        self._pending = thread
        thread.start()
        if blocking:
            self.wait()
        return True

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the save in flight is committed and durable; raise its failure if it failed."""
        thread = self._pending
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                raise CheckpointError(f"checkpoint save still running after {timeout_s} s")
            self._pending = None
        self._raise_pending_error()

    def wait_uploads(self, timeout_s: float | None = None) -> None:
        """Block until every queued upload has been attempted (rank 0); raise if any failed since the last call.

        A step whose upload failed stays pending: later saves queue it again once its backoff has passed, and
        `close()` retries it (see `uploads.Uploader`).
        """
        if self._uploader is not None:
            self._uploader.wait(timeout_s)

    def close(self, upload_timeout_s: float | None = CLOSE_UPLOAD_TIMEOUT_S) -> None:
        """Finish the save in flight and the queued uploads, retrying failed uploads for up to `upload_timeout_s`
        (None: until every one lands or retention supersedes it), then stop background work.

        Raises CheckpointError naming the steps still not in the store after that; they stay on local disk.
        """
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            if self._uploader is not None:
                self._uploader.close(upload_timeout_s)

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def last_committed_step(self) -> int | None:
        """The newest step this manager has committed (after `wait()` it is durable)."""
        return self._last_committed

    @property
    def uploaded_steps(self) -> set[int]:
        """Steps this manager has copied to the store."""
        return set(self._uploader.uploaded) if self._uploader is not None else set()

    @property
    def failed_uploads(self) -> list[int]:
        """Steps whose upload failed and will be tried again (by a later save or `close()`)."""
        return self._uploader.failed_steps if self._uploader is not None else []

    def steps(self) -> list[int]:
        """Committed local steps (a manifest is present), oldest first; not checksummed."""
        return [s for s, path in self._local_dirs() if os.path.lexists(path / MANIFEST_NAME)]

    def load_latest(self, template: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]] | None:
        """The newest checkpoint whose manifest verifies, as `(step, state_dict)`, or None.

        Damaged or incomplete checkpoints are skipped with a warning naming them. When no local
        checkpoint verifies and `upload_to` is set, the newest complete one in the store is
        downloaded, verified and committed locally first. `template` (this rank's state dict) makes
        DCP reshard into its layout; without one a single process gets the whole state dict.

        A checkpoint found damaged while it is read may have written some of its values into `template`
        before the mismatch showed; the older checkpoint loaded next overwrites every key. If no
        checkpoint loads after that, CorruptCheckpointError (`partial_template` set) is raised, not None.
        """
        self._check_open()
        self.wait()
        if self.world_size == 1 and self.verify_on_load:
            return self._load_latest_verifying(template)
        choice = self._choose_latest() if self.rank == 0 else None
        step = self._broadcast(choice)
        if step is None:
            return None
        return step, self._read(step, template)

    def load(self, step: int, template: dict[str, Any] | None = None) -> dict[str, Any]:
        """Load checkpoint `step`, verified against its manifest when `verify_on_load`.

        In one process the files are checked while they are read: if this raises CorruptCheckpointError,
        `template` may already hold some values of the damaged checkpoint (`error.partial_template`); the
        exception is the signal, and the template must be loaded again or re-initialised. With several
        ranks, rank 0 verifies the whole checkpoint first and the template is untouched on failure.
        """
        self._check_open()
        self.wait()
        path = self.root / step_dirname(step)
        if self.world_size == 1 and self.verify_on_load:
            report = verify_checkpoint(_local_fs(), str(path), checksums=False)
            if not report.ok or report.manifest is None:
                raise CorruptCheckpointError(str(path), report.problems)
            return self._read(step, template, report.manifest.files)
        problem = None
        if self.rank == 0 and self.verify_on_load:
            report = verify_checkpoint(_local_fs(), str(path))
            problem = None if report.ok else "; ".join(report.problems)
        problem = self._broadcast(problem)
        if problem:
            raise CorruptCheckpointError(str(path), problem.split("; "))
        return self._read(step, template)

    # -- background save --------------------------------------------------------------------------

    def _write_guarded(self, staged: dict[str, Any], step: int, stage_s: float,
                       metadata: dict[str, Any] | None) -> None:
        try:
            self._write(staged, step, stage_s, metadata)
        except BaseException as error:  # surfaced to the caller by wait()/save()
            log.error("checkpoint step %d failed: %s", step, error)
            self._error = error

    def _write(self, staged: dict[str, Any], step: int, stage_s: float,
               metadata: dict[str, Any] | None) -> None:
        from gpufleet.runtime.checkpoint import dcp_io

        tmp = self.root / f"{TMP_PREFIX}{step_dirname(step)}"
        if self.rank == 0:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
        self._barrier(self._io_group)
        start_s = time.perf_counter()
        local_error: str | None = None
        entries: dict[str, FileEntry] = {}
        try:
            written = dcp_io.write(staged, tmp, self._io_group if self.world_size > 1 else None)
            entries = self._own_entries(tmp, written)
        except BaseException as error:  # DCP's CheckpointException derives from BaseException
            free_bytes = shutil.disk_usage(self.root).free
            local_error = (f"rank {self.rank}: {type(error).__name__}: {error} "
                           f"[{free_bytes} bytes free on {self.root}]")
        write_s = time.perf_counter() - start_s
        gathered = self._gather((entries, local_error))
        outcome: str | None = None
        commit_start_s = time.perf_counter()
        self._durable_at_s: float | None = None
        if self.rank == 0:
            try:
                outcome = self._commit(tmp, step, gathered, metadata)
            except Exception as error:
                outcome = f"commit: {type(error).__name__}: {error}"
        outcome = self._broadcast(outcome, group=self._io_group)
        if outcome is not None:
            self._barrier(self._io_group)  # every rank has stopped touching the temporary directory
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"checkpoint step {step} not saved ({outcome}); the previous ones are intact")
        self._last_committed = step
        size = sum(e.size_bytes for part in gathered or [] for e in part[0].values())
        end_s = time.perf_counter()
        durable_s = self._durable_at_s if self._durable_at_s is not None else end_s
        self.last_stats = SaveStats(step, stage_s, write_s, durable_s - commit_start_s, size,
                                    retain_s=end_s - durable_s)

    def _own_entries(self, tmp: Path, written: dict[str, FileEntry]) -> dict[str, FileEntry]:
        """Size and checksum of this rank's files, each fsynced (again) before it is reported.

        The checksums were computed from the bytes as DCP wrote them; a file without one (its bytes
        did not arrive in order) or whose size on disk differs is hashed by reading it back.
        """
        mine = sorted(tmp.glob(f"__{self.rank}_*.distcp"))
        if self.rank == 0:
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

    def _commit(self, tmp: Path, step: int, gathered: list[Any] | None,
                metadata: dict[str, Any] | None) -> str | None:
        import torch

        parts = gathered or []
        errors = [err for _, err in parts if err]
        if errors or len(parts) != self.world_size:
            shutil.rmtree(tmp, ignore_errors=True)
            return "; ".join(errors) or f"{len(parts)} of {self.world_size} ranks reported"
        files: dict[str, FileEntry] = {}
        for rank_entries, _ in parts:
            files.update(rank_entries)
        on_disk = {p.name for p in tmp.iterdir()}
        if on_disk != set(files):
            shutil.rmtree(tmp, ignore_errors=True)
            return f"files on disk {sorted(on_disk)} differ from those the ranks reported {sorted(files)}"
        manifest = Manifest(step=step, world_size=self.world_size, files=files,
                            framework={"name": "torch.distributed.checkpoint", "torch": torch.__version__},
                            user=dict(metadata or {}))
        atomic_write(tmp / MANIFEST_NAME, manifest.to_json())
        fsync_dir(tmp)
        final = self.root / step_dirname(step)
        if os.path.lexists(final) and not _is_complete_checkpoint(final):
            _set_aside(final, f"saving step {step}", "it is not a complete checkpoint")
        # an earlier complete save of this very step is superseded: deleted only once the new one is in place
        replace_dir(tmp, final)  # the commit: from here on, nothing may report this save as failed
        self._found_damaged.pop(step, None)  # a damaged copy of this step was set aside or replaced
        self._after_commit(step, final)
        return None

    def _after_commit(self, step: int, final: Path) -> None:
        """Move `latest`, apply retention, queue the upload: each failure is logged, none undoes the commit.

        Loading never reads `latest` (it lists the step folders), so a `latest` that could not be moved, or old
        checkpoints that could not be deleted, leave every committed checkpoint loadable.
        """
        try:
            atomic_write(self.root / LATEST_NAME, f"{final.name}\n".encode())
        except OSError as error:
            log.warning("checkpoint step %d is committed, but %s could not be updated: %s", step,
                        self.root / LATEST_NAME, error)
        self._durable_at_s = time.perf_counter()
        try:
            self._retain()
        except Exception as error:  # a committed save is never reported as failed
            log.warning("checkpoint step %d is committed, but retention failed: %s", step, error)
        if self._uploader is not None:
            self._uploader.submit(step)  # ...and any failed upload whose backoff has passed

    def _retain(self) -> None:
        """Delete old complete checkpoints; damaged ones are never counted towards `keep_last` nor deleted.

        One checkpoint that cannot be deleted (a permission refused) is logged and left; the others still go.
        """
        plan = plan_retention(_local_fs(), [(step, str(path)) for step, path in self._local_dirs()],
                              self.keep_last, self.keep_every, known_damaged=self._found_damaged)
        for path, problems in plan.damaged.values():
            log.warning("checkpoint %s is damaged (%s); retention leaves it in place and does not count it",
                        path, "; ".join(problems))
        failed = delete_checkpoints(_local_fs(), plan.delete)
        for step, path in plan.delete.items():
            if step in failed:
                log.warning("retention could not delete %s: %s; left in place", path, failed[step])
            elif self._uploader is not None:
                self._uploader.forget(step)  # a failed upload of it is superseded

    # -- upload and restore -----------------------------------------------------------------------

    def _upload(self, step: int) -> bool:
        """Copy local `step` to the store (the upload thread); False when retention deleted it meanwhile. Once it is
        there, the store's leftovers of older steps are removed (`_remove_remote_leftovers`)."""
        if self._remote is None:
            return False
        fs, base = self._remote
        local = self.root / step_dirname(step)
        if not local.exists():
            return False
        install_checkpoint(_local_fs(), str(local), fs, join(base, step_dirname(step)), self.transfer)
        try:
            self._remove_remote_leftovers(step)
        except Exception as error:  # the step is in the store: a leftover left in place is reported, not a failure
            log.warning("step %d is in the store, but its leftovers could not be removed: %s", step, error)
        return True

    def _remove_remote_leftovers(self, uploaded: int) -> None:
        """Remote retention of what no upload will finish: delete each prefix without a manifest (an upload cut off)
        of a step older than `uploaded` that is not queued or waiting for a retry here (e.g. one that local retention
        deleted before its upload could land). Complete checkpoints in the store are never touched."""
        if self._remote is None or self._uploader is None:
            return
        fs, base = self._remote
        in_flight = self._uploader.in_flight()
        leftovers = {info.step: info.path for info in list_checkpoints(fs, base) if info.is_folder
                     and not info.has_manifest and info.step < uploaded and info.step not in in_flight}
        failed = delete_checkpoints(fs, leftovers)
        for step, path in leftovers.items():
            if step in failed:
                log.warning("could not remove %s, an upload of step %d that was cut off: %s", path, step, failed[step])
            else:
                log.info("removed %s from the store: an upload of step %d that was cut off and is no longer pending "
                         "(retention deleted its local copy, or the process uploading it stopped)", path, step)

    def _restore_from_store(self) -> int | None:
        if self._remote is None:
            return None
        fs, base = self._remote
        for info in reversed(list_checkpoints(fs, base)):
            if not info.has_manifest:
                log.warning("remote checkpoint %s has no manifest (partial upload); skipped", info.path)
                continue
            tmp = self.root / f"{TMP_PREFIX}download-{step_dirname(info.step)}"
            if tmp.exists():
                shutil.rmtree(tmp)
            try:
                copy_checkpoint(fs, info.path, _local_fs(), str(tmp), self.transfer)
            except Exception as error:
                log.warning("download of %s failed: %s", info.path, error)
                shutil.rmtree(tmp, ignore_errors=True)
                continue
            report = verify_checkpoint(_local_fs(), str(tmp), step=info.step)
            if not report.ok:
                log.warning("downloaded checkpoint %s is damaged (%s); skipped", info.path,
                            "; ".join(report.problems))
                shutil.rmtree(tmp, ignore_errors=True)
                continue
            for path in tmp.iterdir():
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
            fsync_dir(tmp)
            final = self.root / step_dirname(info.step)
            if os.path.lexists(final):  # it did not load (damaged, incomplete, a file): kept, never deleted
                _set_aside(final, f"restoring step {info.step} from {info.path}", "it did not load")
            os.rename(tmp, final)
            fsync_dir(self.root)
            log.warning("restored checkpoint step %d from %s", info.step, info.path)
            return info.step
        return None

    # -- loading ----------------------------------------------------------------------------------

    def _choose_latest(self) -> int | None:
        """The newest local step that verifies in full (with `verify_on_load`; else whose manifest reads and is of
        that step), else the one restored from the store, else None; each skipped step is logged with why."""
        for step, path in reversed(self._local_dirs()):
            if self.verify_on_load:
                problems = verify_checkpoint(_local_fs(), str(path)).problems
            else:
                problems = _manifest_problems(path)
            if problems:
                self._skip(step, path, problems)
                continue
            return step
        return self._restore_from_store()

    def _load_latest_verifying(self, template: dict[str, Any] | None) -> tuple[int, dict[str, Any]] | None:
        """One process: the newest checkpoint that verifies, checked while it is read (each byte read once).

        Presence and sizes are checked first; then every file is hashed as it is read, and a mismatch
        skips the checkpoint with a warning. Values of a damaged checkpoint may by then have been written
        into `template`; the next checkpoint that loads overwrites every one of them (DCP fills every
        key of the template or fails). If none loads after that happened, CorruptCheckpointError is
        raised instead of returning None, so a partly written template is never mistaken for a fresh one.
        """
        damaged: list[str] = []
        for step, path in reversed(self._local_dirs()):
            report = verify_checkpoint(_local_fs(), str(path), checksums=False)
            if not report.ok or report.manifest is None:
                self._skip(step, path, report.problems)
                continue
            try:
                return step, self._read(step, template, report.manifest.files)
            except CorruptCheckpointError as error:
                self._skip(step, path, error.problems)
                if error.partial_template:
                    damaged.extend(error.problems)
        restored = self._restore_from_store()  # verified in full after the download
        if restored is not None:
            return restored, self._read(restored, template)
        if damaged:
            failure = CorruptCheckpointError(str(self.root), [
                *damaged, "no intact checkpoint is left, and the template was partly overwritten by a damaged "
                          "one: re-initialise it before training from scratch"])
            failure.partial_template = True
            raise failure
        return None

    def _skip(self, step: int, path: Path, problems: list[str]) -> None:
        """Say which checkpoint a load passed over, and why; a damaged one (its manifest is there) is remembered so
        that retention never counts it."""
        log.warning("checkpoint %s is damaged or incomplete and was skipped: %s", path, "; ".join(problems))
        if os.path.lexists(path / MANIFEST_NAME):
            self._found_damaged[step] = list(problems)

    def _read(self, step: int, template: dict[str, Any] | None,
              expected: dict[str, FileEntry] | None = None) -> dict[str, Any]:
        from gpufleet.runtime.checkpoint import dcp_io

        group = self._ctl_group if self.world_size > 1 else None
        return dcp_io.read(self.root / step_dirname(step), template, group, expected)

    def _local_dirs(self) -> list[tuple[int, Path]]:
        found = []
        if self.root.is_dir():
            for path in self.root.iterdir():
                step = parse_step(path.name)
                if step is not None and path.is_dir() and not path.is_symlink():
                    found.append((step, path))
        return sorted(found)

    def _sweep(self) -> None:
        """Remove what crashed saves and deletions left behind (hidden temporary and trash dirs), after putting back
        any checkpoint a re-save had moved aside and not yet replaced (`_restore_superseded`)."""
        self._restore_superseded()
        for path in self.root.iterdir():
            if path.name.startswith((TMP_PREFIX, TRASH_PREFIX)) and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif path.name.startswith((f"{LATEST_NAME}.tmp-", f"{MANIFEST_NAME}.tmp-")):
                path.unlink(missing_ok=True)

    def _restore_superseded(self) -> None:
        """A re-save killed between its two renames (`fsutil.replace_dir`) left the old checkpoint whole under
        `.superseded-step_…` and nothing at `step_…`: rename it back. Where `step_…` is a complete checkpoint (the new
        copy arrived) the superseded one is deleted; where something else stands there, that is set aside first."""
        for name, path in superseded_copies(self.root):
            final = self.root / name
            if parse_step(name) is None:
                continue
            if os.path.lexists(final) and _is_complete_checkpoint(final):
                remove_tree(path)
                continue
            if os.path.lexists(final):
                _set_aside(final, f"restoring the superseded copy of {name}", "it is not a complete checkpoint")
            restore(path, final)
            log.warning("restored %s from %s: a re-save of it was interrupted before its new copy was in place",
                        final, path.name)

    # -- distributed plumbing ---------------------------------------------------------------------

    def _init_distributed(self, process_group: Any | None) -> None:
        import torch.distributed as dist

        self._io_group: Any = None
        self._ctl_group: Any = None
        if process_group is None and not (dist.is_available() and dist.is_initialized()):
            self.rank, self.world_size = 0, 1
            return
        ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        # Two side groups on gloo: one used only by the background writer, one only by the caller's
        # thread, so collectives of the two threads never interleave on one group.
        self._io_group = dist.new_group(ranks=ranks, backend="gloo")
        self._ctl_group = dist.new_group(ranks=ranks, backend="gloo")

    def _barrier(self, group: Any | None) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier(group=group)

    def _gather(self, item: Any) -> list[Any] | None:
        if self.world_size == 1:
            return [item]
        import torch.distributed as dist

        out: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(item, out, dst=dist.get_global_rank(self._io_group, 0), group=self._io_group)
        return out

    def _broadcast(self, item: Any, group: Any = None) -> Any:
        if self.world_size == 1:
            return item
        import torch.distributed as dist

        group = group or self._ctl_group
        box = [item]
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
        return box[0]

    def _any_rank(self, flag: bool) -> bool:
        if self.world_size == 1:
            return flag
        import torch
        import torch.distributed as dist

        value = torch.tensor([int(flag)])
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self._ctl_group)
        return bool(value.item())

    def _raise_pending_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            if isinstance(error, CheckpointError):
                raise error
            raise CheckpointError(f"background checkpoint save failed: {error}") from error

    def _check_loadable(self, state_dict: dict[str, Any]) -> None:
        """Refuse, on every rank alike, a state dict that some rank could save but never load back."""
        from gpufleet.runtime.checkpoint.values import check_loadable

        refusal: CheckpointError | None = None
        try:
            check_loadable(state_dict)
        except CheckpointError as error:
            refusal = error
        if refusal is not None and self.world_size > 1:
            log.error("rank %d: %s", self.rank, refusal)
        if self._any_rank(refusal is not None):
            raise refusal or CheckpointError("another rank's state dict holds a value that loading would refuse "
                                             "(its log names the key); nothing was saved")

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("this CheckpointManager is closed")


def _manifest_problems(path: Path) -> list[str]:
    """Why the manifest of the checkpoint at `path` does not read as one of its step (empty: it does)."""
    from gpufleet.runtime.checkpoint.verify import read_manifest

    try:
        read_manifest(_local_fs(), str(path))
    except CorruptCheckpointError as error:
        return error.problems
    except CheckpointError as error:  # a bad file name listed in it
        return [str(error)]
    return []


def _is_complete_checkpoint(path: Path) -> bool:
    """Whether `path` is a real folder holding a complete checkpoint (`check_complete`), and nothing else."""
    return path.is_dir() and not path.is_symlink() and check_complete(_local_fs(), str(path)).ok


def _set_aside(path: Path, doing: str, why: str) -> None:
    """Move what stands where a checkpoint must go to a visible name, whole, and say so."""
    aside = move_aside(path)
    log.warning("%s: %s was in the way (%s); moved aside, whole, to %s (nothing deleted: look at it, then delete "
                "it)", doing, path, why, aside)


def _local_fs() -> Any:
    from fsspec.implementations.local import LocalFileSystem

    return LocalFileSystem()


