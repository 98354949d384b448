"""Durable file-system steps: fsync a file (a directory: gpufleet.fsio.fsync_dir, imported here), atomic
replace (of a file or a directory), delete by rename first, move aside; and reading a small file that may be
anything (a pipe, a folder, huge) safely."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from gpufleet.fsio import fsync_dir, read_regular_file
from gpufleet.runtime.checkpoint.names import SET_ASIDE_MARK, TRASH_PREFIX


def is_local(fs: Any) -> bool:
    """Whether the fsspec file system `fs` is the local disk (where a directory rename is atomic)."""
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def read_small_file(path: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes` (gpufleet.fsio.read_regular_file: a pipe or a
    device is refused at once, never read forever). Raises OSError (a folder is fsio.NotARegularFile, an OSError)
    or ValueError. Reads only: no crash semantics to speak of."""
    return read_regular_file(path, max_bytes)


def fsync_file(path: Path) -> None:
    """Flush one file's data and metadata to the device."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a crash leaves either the old file or the new one, never a mix."""
    tmp = path.with_name(f"{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def remove_tree(path: Path) -> None:
    """Delete a directory so that no crash leaves it half-deleted under its own name.

    The directory is first renamed to a hidden trash name (atomic), the rename made durable, and only
    then are its files removed.
    """
    trash = path.with_name(f"{TRASH_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}")
    os.rename(path, trash)
    fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)


def replace_dir(new: Path, final: Path) -> None:
    """Put the directory `new` at `final` (a sibling), replacing whatever directory is there, and delete the old one
    only once the new one is durably in place.

    The old `final` is renamed to a hidden trash name, `new` renamed to `final`, the parent fsynced, and only then is
    the trash deleted: a crash at any point leaves the old or the new directory under `final` except in the instant
    between the two renames (never during the slow delete). A symlink at `final` is moved and unlinked, never followed.
    """
    if not os.path.lexists(final):
        os.rename(new, final)
        fsync_dir(final.parent)
        return
    trash = final.with_name(f"{TRASH_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}")
    os.rename(final, trash)
    os.rename(new, final)
    fsync_dir(final.parent)
    if trash.is_symlink() or not trash.is_dir():
        trash.unlink(missing_ok=True)
    else:
        shutil.rmtree(trash, ignore_errors=True)


def move_aside(path: Path) -> Path:
    """Rename `path` (a folder or a file) to a visible sibling `NAME.set-aside-XXXXXXXX`, durably; delete nothing.

    For what stands where a checkpoint must go but is not one to delete: it stays whole, for a person to judge.
    """
    aside = path.with_name(f"{path.name}{SET_ASIDE_MARK}{uuid.uuid4().hex[:8]}")
    os.rename(path, aside)
    fsync_dir(path.parent)
    return aside
