"""Durable file-system steps: fsync a file (a directory: gpufleet.fsio.fsync_dir, imported here), atomic
replace (of a file or a directory), delete by rename first, move aside; and reading a small file that may be
anything (a pipe, a folder, huge) safely.

Each function says what a crash (a kill, or a power loss) at any point inside it leaves behind; the test that kills
a writer at every file-system operation of a save (tests/runtime/test_crashpoints.py) holds them to it."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet.fsio import fsync_dir, read_regular_file
from gpufleet.runtime.checkpoint.names import SET_ASIDE_MARK, SUPERSEDED_PREFIX, TRASH_PREFIX

if TYPE_CHECKING:
    from gpufleet.runtime.checkpoint.remote import StoreFileSystem


def is_local(fs: StoreFileSystem) -> bool:
    """Whether the fsspec file system `fs` is the local disk (where a directory rename is atomic)."""
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def read_small_file(path: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes` (gpufleet.fsio.read_regular_file: a pipe or a
    device is refused at once, never read forever). Raises OSError (a folder is fsio.NotARegularFile, an OSError)
    or ValueError. Reads only: no crash semantics to speak of."""
    return read_regular_file(path, max_bytes)


def fsync_file(path: Path) -> None:
    """Flush one file's data and metadata to the device. Crash semantics: none of its own (it changes nothing); once it
    returns, the file's bytes survive a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a crash leaves either the old file or the new one, never a mix.

    The bytes go to a hidden sibling `NAME.tmp-XXXXXXXX` (created, written, fsynced), which then replaces `path` in
    one rename, made durable by fsyncing the folder. A crash before the rename leaves the old `path` and at most that
    sibling (empty, partial or whole; `CheckpointManager` removes it on start); after the rename, the new file.
    """
    tmp = path.with_name(f"{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def remove_tree(path: Path) -> None:
    """Delete a directory so that no crash leaves it half-deleted under its own name.

    The directory is first renamed to a hidden trash name (atomic), the rename made durable, and only then are its
    files removed. A crash before the rename leaves it whole; after it, a hidden `.trash-…` folder, whole or partly
    deleted, that `CheckpointManager` removes on start and that nothing lists or loads.
    """
    trash = path.with_name(f"{TRASH_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}")
    os.rename(path, trash)
    fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)


def replace_dir(new: Path, final: Path) -> None:
    """Put the directory `new` at `final` (a sibling), replacing whatever directory is there, and delete the old one
    only once the new one is durably in place.

    With nothing at `final`: one rename, then the parent fsynced. Otherwise the old `final` is renamed to the hidden
    `.superseded-NAME-XXXXXXXX` (durably: the parent fsynced), `new` renamed to `final` (durably), the superseded
    copy renamed to a `.trash-…` name and only then deleted. Crash semantics: at every point either `final` holds the
    old or the new directory, or (between the two renames) the old one lies whole under its `.superseded-` name with
    nothing at `final`; `superseded_copies` finds it and the next `CheckpointManager` start renames it back. A
    half-deleted old copy only ever bears a `.trash-` name. A symlink at `final` is moved and unlinked, never
    followed.
    """
    if not os.path.lexists(final):
        os.rename(new, final)
        fsync_dir(final.parent)
        return
    superseded = final.with_name(f"{SUPERSEDED_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}")
    os.rename(final, superseded)
    fsync_dir(final.parent)
    os.rename(new, final)
    fsync_dir(final.parent)
    if superseded.is_symlink() or not superseded.is_dir():
        superseded.unlink(missing_ok=True)
    else:
        remove_tree(superseded)


def superseded_copies(parent: Path) -> list[tuple[str, Path]]:
    """The copies `replace_dir` moved aside under `parent` and has not yet deleted, as `(name they replaced, path)`,
    sorted. Reads only."""
    found = []
    for path in parent.iterdir():
        if path.name.startswith(SUPERSEDED_PREFIX) and path.is_dir() and not path.is_symlink():
            name = path.name[len(SUPERSEDED_PREFIX):].rsplit("-", 1)[0]
            found.append((name, path))
    return sorted(found)


def restore(path: Path, final: Path) -> None:
    """Rename `path` back to `final` (a sibling that must not exist), durably. Crash semantics: one rename, then the
    parent fsynced; a crash leaves the directory whole under one name or the other."""
    os.rename(path, final)
    fsync_dir(final.parent)


def move_aside(path: Path) -> Path:
    """Rename `path` (a folder or a file) to a visible sibling `NAME.set-aside-XXXXXXXX`, durably; delete nothing.

    For what stands where a checkpoint must go but is not one to delete: it stays whole, for a person to judge.
    Crash semantics: one rename, then the parent fsynced; a crash leaves it whole under one name or the other.
    """
    aside = path.with_name(f"{path.name}{SET_ASIDE_MARK}{uuid.uuid4().hex[:8]}")
    os.rename(path, aside)
    fsync_dir(path.parent)
    return aside
