"""The manager's copy of its checkpoints in a store (a `StoreRoot`: any fsspec file system, handed in or opened from
the URL): each committed step uploaded, the leftovers of uploads cut off removed, and the newest complete step
restored when no local one loads.

An upload is `store.install_checkpoint`: data files first, each checked after it lands, then all of them again by one
listing, and the manifest last (the store's commit mark). A restore downloads into a hidden temporary folder,
verifies every byte, fsyncs it and renames it into place, setting aside (never deleting) whatever stood there. A
store that does not answer raises StoreUnreachableError from a restore rather than being taken for an empty store:
a job must not start from scratch because its store was down.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from gpufleet.runtime.checkpoint.errors import StoreUnreachableError
from gpufleet.runtime.checkpoint.fsutil import fsync_dir, fsync_file
from gpufleet.runtime.checkpoint.local_root import LocalRoot, local_fs, set_aside
from gpufleet.runtime.checkpoint.names import step_dirname
from gpufleet.runtime.checkpoint.reach import is_unreachable
from gpufleet.runtime.checkpoint.remote import StoreRoot
from gpufleet.runtime.checkpoint.retention import delete_checkpoints
from gpufleet.runtime.checkpoint.store import (
    CheckpointInfo,
    TransferPolicy,
    copy_checkpoint,
    install_checkpoint,
    list_checkpoints,
    with_retries,
)
from gpufleet.runtime.checkpoint.verify import verify_checkpoint

log = logging.getLogger(__name__)


class StoreMirror:
    """Uploads to and restores from `store` for the checkpoints under `local`, copying as `policy` says."""

    def __init__(self, store: StoreRoot, local: LocalRoot, policy: TransferPolicy) -> None:
        self.store = store
        self.local = local
        self.policy = policy

    # -- upload (the upload thread) -------------------------------------------------------------------------------

    def upload(self, step: int, in_flight: Callable[[], set[int]]) -> bool:
        """Copy local `step` to the store; False when it is gone locally (retention deleted it meanwhile). Once it is
        there, the store's leftovers of older steps not `in_flight` are removed (`remove_leftovers`)."""
        local = self.local.step_path(step)
        if not local.exists():
            return False
        install_checkpoint(local_fs(), str(local), self.store.fs, self.store.path(step_dirname(step)), self.policy)
        try:
            self.remove_leftovers(step, in_flight())
        except Exception as error:  # the step is in the store: a leftover left in place is reported, not a failure
            log.warning("step %d is in the store, but its leftovers could not be removed: %s", step, error)
        return True

    def remove_leftovers(self, uploaded: int, in_flight: set[int]) -> None:
        """Remote retention of what no upload will finish: delete each prefix without a manifest (an upload cut off)
        of a step older than `uploaded` that is not in `in_flight` (queued or waiting for a retry here; e.g. one that
        local retention deleted before its upload could land). Complete checkpoints in the store are never
        touched."""
        leftovers = {info.step: info.path for info in list_checkpoints(self.store.fs, self.store.root)
                     if info.is_folder and not info.has_manifest and info.step < uploaded
                     and info.step not in in_flight}
        failed = delete_checkpoints(self.store.fs, leftovers)
        for step, path in leftovers.items():
            if step in failed:
                log.warning("could not remove %s, an upload of step %d that was cut off: %s", path, step, failed[step])
            else:
                log.info("removed %s from the store: an upload of step %d that was cut off and is no longer pending "
                         "(retention deleted its local copy, or the process uploading it stopped)", path, step)

    # -- restore ------------------------------------------------------------------------------------------------

    def restore_latest(self) -> int | None:
        """Download the newest store checkpoint that has a manifest and verifies, commit it locally, and return its
        step; None when the store holds none. Each one skipped (no manifest, a failed download, damage) is logged
        with why; a store that does not answer raises StoreUnreachableError."""
        for info in reversed(self._listed()):
            if not info.has_manifest:
                log.warning("remote checkpoint %s has no manifest (partial upload); skipped", info.path)
                continue
            tmp = self._download(info)
            if tmp is not None:
                self._commit_download(tmp, info)
                return info.step
        return None

    def _listed(self) -> list[CheckpointInfo]:
        """Every `step_…` prefix in the store, oldest first, listed with the policy's retries."""
        return with_retries(lambda: list_checkpoints(self.store.fs, self.store.root), f"list {self.store}",
                            self.policy)

    def _download(self, info: CheckpointInfo) -> Path | None:
        """`info`'s checkpoint copied into a hidden local folder and verified in full; None (nothing left behind)
        when the copy failed or the copy is damaged."""
        tmp = self.local.hidden(f"download-{step_dirname(info.step)}")
        if tmp.exists():
            shutil.rmtree(tmp)
        try:
            copy_checkpoint(self.store.fs, info.path, local_fs(), str(tmp), self.policy)
        except Exception as error:
            shutil.rmtree(tmp, ignore_errors=True)
            _raise_if_unreachable(error, info)
            log.warning("download of %s failed: %s", info.path, error)
            return None
        report = verify_checkpoint(local_fs(), str(tmp), step=info.step)
        if not report.ok:
            log.warning("downloaded checkpoint %s is damaged (%s); skipped", info.path, "; ".join(report.problems))
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        return tmp

    def _commit_download(self, tmp: Path, info: CheckpointInfo) -> None:
        """Make the verified download `tmp` durable and rename it to its step's name, setting aside (never deleting)
        what stood there: it did not load."""
        for path in tmp.iterdir():
            fsync_file(path)
        fsync_dir(tmp)
        final = self.local.step_path(info.step)
        if os.path.lexists(final):
            set_aside(final, f"restoring step {info.step} from {info.path}", "it did not load")
        os.rename(tmp, final)
        fsync_dir(self.local.path)
        log.warning("restored checkpoint step %d from %s", info.step, info.path)


def _raise_if_unreachable(error: Exception, info: CheckpointInfo) -> None:
    """A download that failed because the store did not answer is StoreUnreachableError: an older step would not
    answer either, and "no checkpoint" would be a lie that starts the job from scratch."""
    if isinstance(error, StoreUnreachableError):
        raise error
    if is_unreachable(error):
        raise StoreUnreachableError(f"download of {info.path}: the store did not answer: {error}") from error
