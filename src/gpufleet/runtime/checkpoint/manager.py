"""CheckpointManager: async, crash-safe, sharded checkpoints with retention and object-store upload.

The manager is the public face; each concept it combines has its own module:

    save(state_dict, step)   stage to host memory (`staging`, the only stall), then, in a background thread, write
                             and commit on local disk (`commit`: manifest, then one rename is the commit)
    after each commit        `latest` moved (`commit`), old checkpoints deleted (`local_root.LocalRoot.retain`), the
                             step queued for upload (`uploads.Uploader`, copying through `mirror.StoreMirror`)
    load_latest() / load()   the newest checkpoint that verifies (`loading`), restored from the store when no
                             local one does (`mirror`)
    start-up                 hidden leftovers of crashed saves swept, an interrupted re-save put back (`local_root`)

The store is a `remote.StoreRoot`: the file system and root given (`upload_to=StoreRoot(fs, root)`: any fsspec file
system, an in-memory one that fails on purpose in tests), or the one `upload_to`'s URL names, opened with
`storage_options` (`s3://` through s3fs, `file://`, a path). Nothing that is not a complete checkpoint is deleted:
whatever stands where a checkpoint must go and is not one is renamed to a visible `step_….set-aside-XXXXXXXX`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Literal

from gpufleet.runtime.checkpoint.commit import SaveStats, write_and_commit
from gpufleet.runtime.checkpoint.errors import CheckpointError
from gpufleet.runtime.checkpoint.loading import Loader
from gpufleet.runtime.checkpoint.local_root import LocalRoot, local_fs
from gpufleet.runtime.checkpoint.mirror import StoreMirror
from gpufleet.runtime.checkpoint.names import step_dirname
from gpufleet.runtime.checkpoint.ranks import Ranks
from gpufleet.runtime.checkpoint.remote import StoreRoot, store_root
from gpufleet.runtime.checkpoint.retention import steps_to_delete
from gpufleet.runtime.checkpoint.store import TransferPolicy
from gpufleet.runtime.checkpoint.uploads import Uploader

__all__ = ["CLOSE_UPLOAD_TIMEOUT_S", "BusyPolicy", "CheckpointManager", "SaveStats", "StoreRoot"]
log = logging.getLogger(__name__)
BusyPolicy = Literal["wait", "skip"]
CLOSE_UPLOAD_TIMEOUT_S = 300.0
"""Judgement call: how long `close()` keeps retrying failed uploads by default; long enough to ride out a store's
brief outage, short enough that a job whose store is gone still exits (its checkpoints stay on local disk)."""
_local_fs = local_fs  # the local disk as an fsspec file system, under the name callers have imported it by


class CheckpointManager:
    """Crash-safe checkpoints under `root`; see `commit` for the commit protocol.

    `if_busy` decides what `save()` does while the previous save is still being written: `"wait"`
    blocks until it is durable (the default; no save is lost), `"skip"` returns False at once and
    drops this one. Across ranks the decision is made together, so either every rank saves or none.
    `upload_to` is where committed checkpoints are copied: a URL (opened with `storage_options`) or a
    `StoreRoot` (a file system already open, and the root in it).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        keep_last: int = 3,
        keep_every: int | None = None,
        upload_to: str | StoreRoot | None = None,
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
        store = store_root(upload_to, storage_options)
        self._ranks = Ranks.join(process_group)
        self.rank, self.world_size = self._ranks.rank, self._ranks.world_size
        from gpufleet.runtime.checkpoint.staging import HostStager

        self._stager = HostStager()
        self._local = LocalRoot(self.root)
        self._mirror = StoreMirror(store, self._local, self.transfer) if store is not None else None
        self._pending: threading.Thread | None = None
        self._error: BaseException | None = None
        self._last_committed: int | None = None
        self._found_damaged: dict[int, list[str]] = {}
        """Steps a load of this manager skipped as damaged (step -> why): never counted by retention."""
        self._loader = Loader(self._local, self._ranks, verify_on_load=verify_on_load, restore=self._restore,
                              damaged=self._found_damaged)
        self.last_stats: SaveStats | None = None
        self._uploader: Uploader | None = None
        self._closed = False
        if self._ranks.first:
            self._local.open()
            if self._mirror is not None:
                self._uploader = Uploader(self._upload, retry_after_s=self.transfer.retry_after_s,
                                          retry_max_s=self.transfer.retry_max_s)
        self._ranks.barrier(self._ranks.ctl_group)

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
        if self.if_busy == "skip" and self._ranks.any_rank(busy):
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
        return self._local.committed_steps()

    def load_latest(self, template: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]] | None:
        """The newest checkpoint whose manifest verifies, as `(step, state_dict)`, or None.

        Damaged or incomplete checkpoints are skipped with a warning naming them. When no local
        checkpoint verifies and `upload_to` is set, the newest complete one in the store is
        downloaded, verified and committed locally first; a store that does not answer then raises
        StoreUnreachableError (never None: the store may hold checkpoints). `template` (this rank's state
        dict) makes DCP reshard into its layout; without one a single process gets the whole state dict.

        A checkpoint found damaged while it is read may have written some of its values into `template`
        before the mismatch showed; the older checkpoint loaded next overwrites every key. If no
        checkpoint loads after that, CorruptCheckpointError (`partial_template` set) is raised, not None.
        """
        self._check_open()
        self.wait()
        return self._loader.latest(template)

    def load(self, step: int, template: dict[str, Any] | None = None) -> dict[str, Any]:
        """Load checkpoint `step`, verified against its manifest when `verify_on_load`.

        In one process the files are checked while they are read: if this raises CorruptCheckpointError,
        `template` may already hold some values of the damaged checkpoint (`error.partial_template`); the
        exception is the signal, and the template must be loaded again or re-initialised. With several
        ranks, rank 0 verifies the whole checkpoint first and the template is untouched on failure.
        """
        self._check_open()
        self.wait()
        return self._loader.step(step, template)

    # -- background work ----------------------------------------------------------------------------

    def _write_guarded(self, staged: dict[str, Any], step: int, stage_s: float,
                       metadata: dict[str, Any] | None) -> None:
        try:
            stats = write_and_commit(staged, step, root=self._local, ranks=self._ranks, stage_s=stage_s,
                                     metadata=metadata, on_commit=self._on_commit)
        except BaseException as error:  # surfaced to the caller by wait()/save()
            log.error("checkpoint step %d failed: %s", step, error)
            self._error = error
            return
        self._last_committed = step
        self.last_stats = stats

    def _on_commit(self, step: int) -> None:
        """After step `step` is committed (rank 0): retention, then the upload queue; a failure of retention is
        logged, never reported as a failed save."""
        self._found_damaged.pop(step, None)  # a damaged copy of this step was set aside or replaced
        try:
            deleted = self._local.retain(self.keep_last, self.keep_every, self._found_damaged)
        except Exception as error:
            log.warning("checkpoint step %d is committed, but retention failed: %s", step, error)
            deleted = []
        if self._uploader is not None:
            for gone in deleted:
                self._uploader.forget(gone)  # a failed upload of it is superseded
            self._uploader.submit(step)  # ...and any failed upload whose backoff has passed

    def _upload(self, step: int) -> bool:
        """One upload, for the upload thread (`mirror.StoreMirror.upload`)."""
        if self._mirror is None or self._uploader is None:
            return False
        return self._mirror.upload(step, self._uploader.in_flight)

    def _restore(self) -> int | None:
        return self._mirror.restore_latest() if self._mirror is not None else None

    # -- checks -------------------------------------------------------------------------------------

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
        if self._ranks.any_rank(refusal is not None):
            raise refusal or CheckpointError("another rank's state dict holds a value that loading would refuse "
                                             "(its log names the key); nothing was saved")

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("this CheckpointManager is closed")
