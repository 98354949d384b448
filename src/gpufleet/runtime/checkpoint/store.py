"""Checkpoints on any fsspec file system: list, copy (upload/download) with retries, delete.

The copy protocol mirrors the local commit: every data file first, each checked by size after it
lands, and the manifest last. A reader that sees a manifest therefore sees a whole checkpoint; a copy
cut off at any point leaves a directory without a manifest, which is never listed as complete.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from gpufleet.runtime.checkpoint.errors import CheckpointError, CorruptCheckpointError, TransferError
from gpufleet.runtime.checkpoint.manifest import CHUNK_BYTES, MANIFEST_NAME, Manifest, chunks
from gpufleet.runtime.checkpoint.names import parse_step
from gpufleet.runtime.checkpoint.verify import read_manifest

log = logging.getLogger(__name__)
T = TypeVar("T")
MIN_PART_BYTES = 5 * 1024 * 1024  # S3's smallest multipart part


@dataclass(frozen=True)
class TransferPolicy:
    """How to copy to or from object storage."""

    part_bytes: int = 16 * 1024 * 1024
    max_attempts: int = 5
    backoff_s: float = 0.5
    backoff_max_s: float = 10.0
    max_bytes_per_s: float | None = None

    def __post_init__(self) -> None:
        if self.part_bytes < MIN_PART_BYTES:
            raise CheckpointError(f"part_bytes must be at least {MIN_PART_BYTES} (S3's minimum part), "
                                  f"got {self.part_bytes}")
        if self.max_attempts < 1:
            raise CheckpointError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.max_bytes_per_s is not None and self.max_bytes_per_s <= 0:
            raise CheckpointError(f"max_bytes_per_s must be positive, got {self.max_bytes_per_s}")


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint directory found under a root: complete means its manifest is present."""

    step: int
    path: str
    complete: bool


def open_url(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """An fsspec file system and the path inside it for `url` (`s3://…`, `gs://…`, `file://…`, a path)."""
    import fsspec.core

    try:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except (ValueError, ImportError) as error:
        raise CheckpointError(f"cannot open {url!r}: {error}") from error
    return fs, str(path).rstrip("/")


def join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}"


def list_checkpoints(fs: Any, root: str) -> list[CheckpointInfo]:
    """Every `step_…` directory under `root`, oldest first; other names are ignored."""
    fs.invalidate_cache()
    try:
        entries = fs.ls(root, detail=False)
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        name = str(entry).rstrip("/").rsplit("/", 1)[-1]
        step = parse_step(name)
        if step is not None:
            path = join(root, name)
            found.append(CheckpointInfo(step, path, bool(fs.exists(join(path, MANIFEST_NAME)))))
    return sorted(found, key=lambda info: info.step)


def with_retries(action: Callable[[], T], what: str, policy: TransferPolicy,
                 on_retry: Callable[[], None] | None = None) -> T:
    """Run `action`, retrying with exponential backoff and jitter; TransferError after the last try."""
    for attempt in range(1, policy.max_attempts + 1):
        try:
            return action()
        except Exception as error:  # network, HTTP 5xx, connection refused: all retried alike
            if attempt == policy.max_attempts:
                raise TransferError(f"{what} failed after {attempt} attempts: {error}") from error
            delay_s = min(policy.backoff_s * 2 ** (attempt - 1), policy.backoff_max_s)
            delay_s *= 0.5 + random.random() / 2
            log.warning("%s failed (attempt %d/%d, retrying in %.2f s): %s",
                        what, attempt, policy.max_attempts, delay_s, error)
            time.sleep(delay_s)
            if on_retry is not None:
                on_retry()
    raise AssertionError("unreachable")


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


def copy_file(src_fs: Any, src: str, dst_fs: Any, dst: str, expected_bytes: int,
              policy: TransferPolicy, throttle: _Throttle) -> None:
    """One streamed copy (multipart on object stores), checked by size; an abort discards the upload."""
    with src_fs.open(src, "rb") as source:
        sink = dst_fs.open(dst, "wb", block_size=policy.part_bytes)
        try:
            for block in chunks(source, min(policy.part_bytes, CHUNK_BYTES)):
                sink.write(block)
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
    landed = int(dst_fs.info(dst)["size"])
    if landed != expected_bytes:
        raise OSError(f"{dst}: {landed} bytes arrived, {expected_bytes} sent")


def copy_checkpoint(src_fs: Any, src: str, dst_fs: Any, dst: str, policy: TransferPolicy) -> Manifest:
    """Copy one committed checkpoint, data files first and the manifest last; skip if already there."""
    manifest = read_manifest(src_fs, src)
    try:
        if read_manifest(dst_fs, dst).to_json() == manifest.to_json():
            return manifest
    except (CorruptCheckpointError, FileNotFoundError):
        pass
    throttle = _Throttle(policy.max_bytes_per_s)

    def reset() -> None:
        dst_fs.invalidate_cache()

    dst_fs.makedirs(dst, exist_ok=True)
    for name, entry in sorted(manifest.files.items()):
        with_retries(lambda name=name, entry=entry: copy_file(  # type: ignore[misc]
            src_fs, join(src, name), dst_fs, join(dst, name), entry.size_bytes, policy, throttle),
            f"copy {join(src, name)} -> {join(dst, name)}", policy, reset)
    manifest_bytes = int(src_fs.info(join(src, MANIFEST_NAME))["size"])
    with_retries(lambda: copy_file(src_fs, join(src, MANIFEST_NAME), dst_fs, join(dst, MANIFEST_NAME),
                                   manifest_bytes, policy, throttle),
                 f"copy {join(src, MANIFEST_NAME)}", policy, reset)
    return manifest


def delete_checkpoint(fs: Any, path: str) -> None:
    """Delete a checkpoint on an fsspec store: the manifest first, so it stops being complete at once."""
    with contextlib.suppress(FileNotFoundError):
        fs.rm(join(path, MANIFEST_NAME))
    fs.rm(path, recursive=True)
    fs.invalidate_cache()
