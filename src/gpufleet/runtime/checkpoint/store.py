"""Checkpoints on any fsspec file system: list, copy (upload/download) with retries, delete.

The copy protocol mirrors the local commit: every data file first, each checked by size after it
lands, then all of them again by one listing (a store may lose what it acknowledged: `landed`), and the manifest
last. A reader that sees a manifest therefore sees a whole checkpoint; a copy
cut off at any point leaves a directory without a manifest, which is never listed as complete.
`install_checkpoint` adds the rest: it never writes over another checkpoint, nor over anything that is not a copy
of the one it installs, and on a local disk it copies into a hidden temporary sibling that is renamed into place
only once whole and durable.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gpufleet.errors import GpufleetError
from gpufleet.extras import missing_extra
from gpufleet.runtime.checkpoint.errors import (
    CheckpointError,
    CorruptCheckpointError,
    StoreUnreachableError,
    TransferError,
)
from gpufleet.runtime.checkpoint.fsutil import fsync_dir, fsync_file, is_local, replace_dir
from gpufleet.runtime.checkpoint.landed import not_landed
from gpufleet.runtime.checkpoint.manifest import CHUNK_BYTES, MANIFEST_NAME, Manifest, chunks
from gpufleet.runtime.checkpoint.names import SET_ASIDE_MARK, TMP_PREFIX, join, parse_step
from gpufleet.runtime.checkpoint.reach import is_unreachable
from gpufleet.runtime.checkpoint.verify import (
    NOT_A_FOLDER,
    check_complete,
    foreign_files,
    read_manifest,
    verify_checkpoint,
)

if TYPE_CHECKING:
    from tenacity import RetryCallState

    from gpufleet.runtime.checkpoint.remote import StoreFileSystem

log = logging.getLogger(__name__)
T = TypeVar("T")
MIN_PART_BYTES = 5 * 1024 * 1024  # S3's smallest multipart part


@dataclass(frozen=True)
class TransferPolicy:
    """How to copy to or from object storage.

    Each store request that fails transiently is tried up to `max_attempts` times with exponential backoff and
    jitter (`backoff_s` doubling up to `backoff_max_s`), and, with `deadline_s`, for no longer than that since its
    first failure. A background upload that still fails is tried again `retry_after_s` later (doubling up to
    `retry_max_s`) by a later save or `close()`. The defaults are judgement calls.
    """

    part_bytes: int = 16 * 1024 * 1024
    max_attempts: int | None = 5
    """None: no count limit (`deadline_s` then decides)."""
    backoff_s: float = 0.5
    backoff_max_s: float = 10.0
    max_bytes_per_s: float | None = None
    deadline_s: float | None = None
    retry_after_s: float = 5.0
    retry_max_s: float = 300.0

    def __post_init__(self) -> None:
        if self.part_bytes < MIN_PART_BYTES:
            raise CheckpointError(f"part_bytes must be at least {MIN_PART_BYTES} (S3's minimum part), "
                                  f"got {self.part_bytes}")
        if self.max_attempts is None and self.deadline_s is None:
            raise CheckpointError("max_attempts=None needs a deadline_s, or a failing request is retried forever")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise CheckpointError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.max_bytes_per_s is not None and self.max_bytes_per_s <= 0:
            raise CheckpointError(f"max_bytes_per_s must be positive, got {self.max_bytes_per_s}")
        for name in ("deadline_s", "retry_after_s", "retry_max_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise CheckpointError(f"{name} must be a positive number of seconds, got {value}")


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint directory found under a root, and whether its manifest is present (the commit mark).

    Whether it is whole (the manifest intact, every file there at its size) is `verify.check_complete`.
    """

    step: int
    path: str
    has_manifest: bool
    is_folder: bool = True
    """False for a file named like a checkpoint: not one, never read, copied or deleted (`has_manifest` is False)."""


def open_url(url: str, storage_options: dict[str, Any] | None = None) -> tuple[StoreFileSystem, str]:
    """An fsspec file system and the path inside it for `url` (`s3://…`, `gs://…`, `file://…`, a path)."""
    import fsspec.core

    try:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as error:  # s3fs (the runtime extra), or a back end no extra installs (gcsfs)
        raise (missing_extra(error, f"opening {url}") or CheckpointError(f"cannot open {url!r}: {error}")) from error
    except ValueError as error:
        raise CheckpointError(f"cannot open {url!r}: {error}") from error
    path = str(path)
    return fs, path.rstrip("/") or path  # "/" stays "/"; "s3://" gives "" (no bucket)


def bounded_storage_options(url: str, deadline_s: float) -> dict[str, Any]:
    """fsspec options that keep one request to the store at `url` from outlasting `deadline_s`: for S3, connect and
    read timeouts within it and botocore's own retries off (`with_retries` does the retrying, within the deadline);
    nothing for other stores. Judgement call: a connect timeout of at most 5 s (a store that answers at all answers
    a connection in well under a second)."""
    if not url.startswith(("s3://", "s3a://")):
        return {}
    return {"config_kwargs": {"connect_timeout": min(5.0, deadline_s), "read_timeout": max(1.0, deadline_s),
                              "retries": {"mode": "standard", "total_max_attempts": 1}}}


def _credentials_errors() -> tuple[type[BaseException], ...]:
    try:
        from botocore.exceptions import NoCredentialsError, PartialCredentialsError
    except ImportError:
        return ()
    return (NoCredentialsError, PartialCredentialsError)


def _store_errors() -> tuple[type[BaseException], ...]:
    try:
        from botocore.exceptions import BotoCoreError
    except ImportError:
        return ()
    return (BotoCoreError,)


@contextlib.contextmanager
def store_errors(url: str) -> Iterator[None]:
    """Turn what a store or a disk raises (missing credentials, a refused connection, an OSError) into one
    CheckpointError that names `url` and says what to do: StoreUnreachableError when the store did not answer."""
    try:
        yield
    except GpufleetError:
        raise
    except _credentials_errors() as error:
        raise CheckpointError(
            f"no credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE "
            f"(a profile in ~/.aws/credentials) ({type(error).__name__})") from error
    except _store_errors() as error:
        kind = StoreUnreachableError if is_unreachable(error) else CheckpointError
        raise kind(f"cannot reach the store for {url}: {error}") from error
    except OSError as error:
        if is_unreachable(error):
            raise StoreUnreachableError(f"cannot reach the store for {url}: {error}") from error
        where = error.filename if error.filename else url
        raise CheckpointError(f"{where}: {error.strerror or error}") from error


def _root_entries(fs: StoreFileSystem, root: str) -> list[tuple[str, bool]]:
    """`(name, is_folder)` of everything directly under `root`, freshly listed; none when `root` does not exist."""
    fs.invalidate_cache()
    try:
        entries = fs.ls(root, detail=True)
    except FileNotFoundError:
        return []
    return [(str(entry["name"]).rstrip("/").rsplit("/", 1)[-1], entry["type"] == "directory") for entry in entries]


def list_checkpoints(fs: StoreFileSystem, root: str) -> list[CheckpointInfo]:
    """Everything named `step_…` under `root`, oldest first (a file so named too, with `is_folder` False); other
    names are ignored."""
    found = []
    for name, is_folder in _root_entries(fs, root):
        step = parse_step(name)
        if step is not None:
            path = join(root, name)
            has_manifest = is_folder and bool(fs.exists(join(path, MANIFEST_NAME)))
            found.append(CheckpointInfo(step, path, has_manifest, is_folder))
    return sorted(found, key=lambda info: info.step)


def list_set_aside(fs: StoreFileSystem, root: str) -> list[str]:
    """What checkpoint code moved aside under `root` (`step_….set-aside-XXXXXXXX`): not checkpoints, kept whole for a
    person to review; sorted by name."""
    found = []
    for name, _ in _root_entries(fs, root):
        base, mark, _ = name.partition(SET_ASIDE_MARK)
        if mark and parse_step(base) is not None:
            found.append(join(root, name))
    return sorted(found)


PERMANENT = (GpufleetError, FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
"""Failures no retry can change (a refusal, a missing or forbidden object; missing credentials too): raised at
once, never retried."""


class _SinceFirstFailure:
    """The policy's deadline, counted from a request's first failure (not its first try: a first try that was slow
    to fail still gets a second), for tenacity's stop and wait of one `with_retries` call."""

    def __init__(self, deadline_s: float | None) -> None:
        self.deadline_s = deadline_s
        self.first_failure_s: float | None = None

    def spent_s(self, state: RetryCallState) -> float:
        now = state.outcome_timestamp if state.outcome_timestamp is not None else time.monotonic()
        if self.first_failure_s is None or state.attempt_number == 1:
            self.first_failure_s = now
        return now - self.first_failure_s

    def left_s(self, state: RetryCallState) -> float | None:
        return None if self.deadline_s is None else self.deadline_s - self.spent_s(state)


def with_retries(action: Callable[[], T], what: str, policy: TransferPolicy,
                 on_retry: Callable[[], None] | None = None) -> T:
    """Run `action`, retrying what may be transient with exponential backoff and jitter, within the policy's
    attempts and deadline (tenacity does the retrying). After the last try: StoreUnreachableError when the store did
    not answer (`reach.is_unreachable`), else TransferError; a PERMANENT failure is raised as it is, at once.

    The policy, as before tenacity: try `n` waits `backoff_s * 2**(n-1)` capped at `backoff_max_s`, times a uniform
    factor in [0.5, 1] ("equal jitter": half fixed, half random), and never past the deadline, so the last try lands
    on it; the deadline counts from the first failure. Any Exception not PERMANENT is retried (network, HTTP 5xx, a
    refused connection, a short object); a BaseException (KeyboardInterrupt) is never caught.
    """
    from tenacity import (
        Retrying,
        retry_if_exception_type,
        retry_if_not_exception_type,
        stop_after_attempt,
        stop_never,
        wait_exponential,
        wait_random_exponential,
    )

    permanent: tuple[type[BaseException], ...] = PERMANENT + _credentials_errors()
    deadline = _SinceFirstFailure(policy.deadline_s)
    half_s, half_max_s = policy.backoff_s / 2, policy.backoff_max_s / 2
    # x/2 + uniform(0, x/2) for x = min(backoff_s * 2**(n-1), backoff_max_s): x * uniform(0.5, 1)
    backoff = (wait_exponential(multiplier=half_s, max=half_max_s)
               + wait_random_exponential(multiplier=half_s, max=half_max_s))

    def wait(state: RetryCallState) -> float:
        left_s = deadline.left_s(state)
        return backoff(state) if left_s is None else max(0.0, min(backoff(state), left_s))

    attempts = stop_never if policy.max_attempts is None else stop_after_attempt(policy.max_attempts)

    def stop(state: RetryCallState) -> bool:
        left_s = deadline.left_s(state)
        return attempts(state) or (left_s is not None and left_s <= 0)

    def before(state: RetryCallState) -> None:
        if state.attempt_number > 1 and on_retry is not None:
            on_retry()

    def before_sleep(state: RetryCallState) -> None:
        assert state.outcome is not None and state.next_action is not None
        log.warning("%s failed (attempt %d%s, retrying in %.2f s): %s", what, state.attempt_number,
                    f"/{policy.max_attempts}" if policy.max_attempts else "", state.next_action.sleep,
                    state.outcome.exception())

    def give_up(state: RetryCallState) -> T:
        assert state.outcome is not None
        error = state.outcome.exception()
        assert error is not None
        kind = StoreUnreachableError if is_unreachable(error) else TransferError
        raise kind(f"{what} failed after {state.attempt_number} attempt(s) over {deadline.spent_s(state):.0f} s: "
                   f"{error}") from error

    retrying = Retrying(
        retry=retry_if_exception_type(Exception) & retry_if_not_exception_type(permanent),
        stop=stop, wait=wait, before=before, before_sleep=before_sleep, retry_error_callback=give_up)
    return retrying(action)


class _Throttle:
    """Sleeps so that bytes sent never run ahead of `max_bytes_per_s`."""

    def __init__(self, max_bytes_per_s: float | None) -> None:
        self.max_bytes_per_s = max_bytes_per_s
        self.start_s = time.monotonic()
        self.sent_bytes = 0

    def account(self, nbytes: int) -> None:
        self.sent_bytes += nbytes
        if self.max_bytes_per_s:
            ahead_s = self.sent_bytes / self.max_bytes_per_s - (time.monotonic() - self.start_s)
            if ahead_s > 0:
                time.sleep(ahead_s)


def copy_file(src_fs: StoreFileSystem, src: str, dst_fs: StoreFileSystem, dst: str, expected_bytes: int,
              policy: TransferPolicy, throttle: _Throttle) -> str:
    """One streamed copy (multipart on object stores), checked by size; an abort discards the upload. Returns the MD5
    of the bytes sent (what a store's single-part ETag must equal: `landed.not_landed`); "" on a local disk, which
    reports none. A store that acknowledged the write and then does not hold the object (restarted empty, or not yet
    consistent) raises a plain OSError, as a short object does: worth sending again, not a refusal."""
    md5 = None if is_local(dst_fs) else hashlib.md5(usedforsecurity=False)
    with src_fs.open(src, "rb") as source:
        sink = dst_fs.open(dst, "wb", block_size=policy.part_bytes)
        try:
            for block in chunks(source, min(policy.part_bytes, CHUNK_BYTES)):
                sink.write(block)
                if md5 is not None:
                    md5.update(block)
                throttle.account(len(block))
        except BaseException:
            discard = getattr(sink, "discard", None)
            with contextlib.suppress(Exception):
                if callable(discard):
                    discard()  # abort the multipart upload rather than commit a truncated object
            with contextlib.suppress(Exception):
                sink.closed = True  # never let a later garbage collection close (and commit) it
            raise
        sink.close()
    dst_fs.invalidate_cache(dst)
    try:
        landed = int(dst_fs.info(dst)["size"])
    except FileNotFoundError:
        raise OSError(f"{dst}: the store acknowledged {expected_bytes} bytes and does not hold them") from None
    if landed != expected_bytes:
        raise OSError(f"{dst}: {landed} bytes arrived, {expected_bytes} sent")
    return "" if md5 is None else md5.hexdigest()


PROOF_ROUNDS = 3
"""Judgement call: how many times one copy re-sends files that a listing shows the store lost before it gives up
(TransferError: the uploader tries the step again later)."""


def copy_checkpoint(src_fs: StoreFileSystem, src: str, dst_fs: StoreFileSystem, dst: str,
                    policy: TransferPolicy) -> Manifest:
    """Copy one committed checkpoint into `dst`, data files first and the manifest last.

    Before the manifest (the commit mark) is written, one fresh listing of `dst` must show every data file at its
    size, and at its MD5 where the store reports one (`landed.not_landed`): a file the store acknowledged and then
    lost is sent again, up to PROOF_ROUNDS times, after which TransferError is raised with no manifest written.
    Writes straight into `dst`, which should be new (a temporary directory, or a store prefix that
    `install_checkpoint` checked): use `install_checkpoint` to copy into a root.
    """
    manifest = read_manifest(src_fs, src)
    throttle = _Throttle(policy.max_bytes_per_s)
    md5_by_name: dict[str, str] = {}

    def reset() -> None:
        dst_fs.invalidate_cache()

    def send(names: list[str]) -> None:
        for name in names:
            size_bytes = manifest.files[name].size_bytes
            md5_by_name[name] = with_retries(lambda name=name, size_bytes=size_bytes: copy_file(  # type: ignore[misc]
                src_fs, join(src, name), dst_fs, join(dst, name), size_bytes, policy, throttle),
                f"copy {join(src, name)} -> {join(dst, name)}", policy, reset)

    dst_fs.makedirs(dst, exist_ok=True)
    send(sorted(manifest.files))
    for round_number in itertools.count(1):
        lost = with_retries(lambda: not_landed(dst_fs, dst, manifest.files, md5_by_name), f"list {dst}", policy)
        if not lost:
            break
        said = "; ".join(f"{name}: {why}" for name, why in lost.items())
        if round_number > PROOF_ROUNDS:
            raise TransferError(f"{dst}: the store does not keep what it acknowledged after {PROOF_ROUNDS} re-sends "
                                f"({said}); no manifest written, the copy is not complete")
        log.warning("%s: the store no longer holds files it acknowledged (%s); sending them again", dst, said)
        send(sorted(lost))
    manifest_bytes = int(src_fs.info(join(src, MANIFEST_NAME))["size"])
    with_retries(lambda: copy_file(src_fs, join(src, MANIFEST_NAME), dst_fs, join(dst, MANIFEST_NAME),
                                   manifest_bytes, policy, throttle),
                 f"copy {join(src, MANIFEST_NAME)}", policy, reset)
    return manifest


_LEFT_AS_IS = "not overwritten (move it away first, or copy to another root)"


def _some(names: list[str], shown: int = 3) -> str:
    """`a, b, c and 4 more`: a few names, for a one-line message."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _existing(fs: StoreFileSystem, path: str, manifest: Manifest) -> tuple[str, str | None]:
    """What is at `path` already, as `(state, refusal)`: what installing `manifest`'s checkpoint there may do.

    absent; same (this checkpoint, every byte verified: nothing to do); repair (this checkpoint's manifest and nothing
    it does not list, but files missing or failing their checksums: replaced); partial (no manifest, and every file
    there is one of this checkpoint's, byte for byte: a copy cut off earlier, replaced); refused (a file, a folder
    holding anything this checkpoint does not, a manifest that cannot be read, a different checkpoint, a symbolic link
    on a local disk: never touched), with `refusal` saying which.
    """
    fs.invalidate_cache()
    if is_local(fs) and os.path.islink(path):  # never followed, replaced or deleted (a broken one included)
        return "refused", f"{path} is a symbolic link, not a checkpoint folder; {_LEFT_AS_IS}"
    if not fs.exists(path):
        return "absent", None
    step = manifest.step
    if not fs.isdir(path):
        return "refused", f"{path} is {NOT_A_FOLDER}; {_LEFT_AS_IS}"
    if not fs.exists(join(path, MANIFEST_NAME)):
        foreign = foreign_files(fs, path, manifest, check_bytes=True)
        if foreign:
            return "refused", (f"{path} has no manifest and holds files unlike those of checkpoint step {step} "
                               f"({_some(foreign)}); {_LEFT_AS_IS}")
        return "partial", None
    try:
        theirs = read_manifest(fs, path)
    except CorruptCheckpointError:
        return "refused", (f"{path} already holds a damaged checkpoint of step {step} (see `gpufleet ckpt verify`); "
                           f"not overwritten (delete it first, or copy to another root)")
    if theirs.to_json() != manifest.to_json():
        return "refused", (f"{path} already holds a different checkpoint of step {step}; not overwritten "
                           f"(delete it first, or copy to another root)")
    unlisted = foreign_files(fs, path, manifest, check_bytes=False)
    if unlisted:
        return "refused", (f"{path} holds checkpoint step {step} and files its manifest does not list "
                           f"({_some(unlisted)}); {_LEFT_AS_IS}")
    return ("same" if verify_checkpoint(fs, path).ok else "repair"), None


def install_checkpoint(src_fs: StoreFileSystem, src: str, dst_fs: StoreFileSystem, dst: str,
                       policy: TransferPolicy) -> tuple[Manifest, bool]:
    """Copy the committed checkpoint `src` to `dst`, never over anything but a copy of it; `(manifest, copied)`.

    `copied` is False when `dst` already holds this very checkpoint and every byte passes its checksum. A copy of
    this checkpoint whose files are missing or fail their checksums is replaced by the good source (a repair), as
    is a folder without a manifest whose every file is one of this checkpoint's, byte for byte (a copy cut off
    earlier): neither holds anything the source lacks. Anything else at `dst` is refused with CheckpointError and
    left untouched: a file, a folder holding anything this checkpoint does not, a manifest that cannot be read, a
    different checkpoint. On a local disk the copy goes into a hidden temporary sibling, is checked and fsynced,
    and `dst` is inspected again just before the copy is renamed into place (so a folder written during the copy is
    refused; the check and the rename are not atomic, so a write in the last moment is not detected): a crash
    leaves `dst` as it was (when a damaged or cut-off copy is being replaced, there is an
    instant between moving it aside and renaming the new copy in when `dst` is absent and the old copy lies whole
    under a hidden `.superseded-` name, which the next CheckpointManager start renames back: `fsutil.replace_dir`).
    An object store has no rename: there the manifest, written last, is the commit, and an interrupted copy leaves a
    prefix without one, which a retry completes. An OSError (a permission refused, a busy device) is raised as
    CheckpointError naming the path, so a caller copying many steps can go on.
    """
    try:
        return _install(src_fs, src, dst_fs, dst, policy)
    except OSError as error:
        where = error.filename if error.filename else dst
        raise CheckpointError(f"{where}: {error.strerror or error}") from error


def _install(src_fs: StoreFileSystem, src: str, dst_fs: StoreFileSystem, dst: str,
             policy: TransferPolicy) -> tuple[Manifest, bool]:
    """`install_checkpoint`, letting an OSError through."""
    manifest = read_manifest(src_fs, src)
    state, refusal = with_retries(lambda: _existing(dst_fs, dst, manifest), f"inspect {dst}", policy)
    if refusal is not None:
        raise CheckpointError(refusal)
    if state == "same":
        return manifest, False
    if not is_local(dst_fs):
        if state != "absent":
            delete_checkpoint(dst_fs, dst)
        copy_checkpoint(src_fs, src, dst_fs, dst, policy)
        return manifest, True
    final = Path(dst)
    # one temporary name per step: a copy killed earlier (SIGKILL skips the cleanup below) is cleared here,
    # so killed attempts never pile up checkpoint-sized hidden folders
    tmp = final.with_name(f"{TMP_PREFIX}copy-{final.name}")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        copy_checkpoint(src_fs, src, dst_fs, str(tmp), policy)
        report = check_complete(dst_fs, str(tmp))
        if not report.ok:
            raise CheckpointError(f"copy of {src} did not arrive whole: {'; '.join(report.problems)}")
        for path in sorted(tmp.rglob("*"), reverse=True):
            (fsync_dir if path.is_dir() else fsync_file)(path)
        fsync_dir(tmp)
        _rename_into_place(dst_fs, tmp, final, state, manifest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return manifest, True


def _rename_into_place(fs: StoreFileSystem, tmp: Path, final: Path, state: str, manifest: Manifest) -> None:
    """Rename the whole copy `tmp` to `final`, which must still be as `_existing` found it (`state`).

    A damaged or cut-off copy at `final` goes out of the way by one rename, the new one in by the next, and the old
    one is deleted only after (`fsutil.replace_dir`: between the two renames the old one lies whole under a hidden
    `.superseded-` name, which the next CheckpointManager start renames back).
    """
    if state == "absent":
        if os.path.lexists(final):
            raise CheckpointError(f"{final} appeared while copying; {_LEFT_AS_IS}")
        os.rename(tmp, final)
        fsync_dir(final.parent)
        return
    now, _ = _existing(fs, str(final), manifest)
    if now != state:
        raise CheckpointError(f"{final} changed while copying; {_LEFT_AS_IS}")
    replace_dir(tmp, final)


def delete_checkpoint(fs: StoreFileSystem, path: str) -> None:
    """Delete a checkpoint on an fsspec store: the manifest first, so it stops being complete at once."""
    with contextlib.suppress(FileNotFoundError):
        fs.rm(join(path, MANIFEST_NAME))
    fs.rm(path, recursive=True)
    fs.invalidate_cache()
