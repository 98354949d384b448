"""The two low-level file-system steps every layer shares: read a bounded regular file, flush a folder.

Standard library only, so that the model half, emit/, the runtime and the cache can all use it without an import
arrow pointing the wrong way. Callers turn its typed errors into their own (a one-line InputError for a user's
file, a checkpoint's damage, a skipped cache entry).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words ("a named pipe"), from its st_mode."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


class NotARegularFile(OSError):
    """The path is a folder, a pipe, a device or a socket; `kind` says which, in words."""

    def __init__(self, path: str | Path, kind: str) -> None:
        super().__init__(errno.EISDIR if kind == "a folder" else errno.EINVAL, f"is {kind}, not a regular file",
                         str(path))
        self.kind = kind


class FileTooLarge(OSError):
    """The file holds more than `max_bytes` (`grew`: it was within bounds when opened and grew while read)."""

    def __init__(self, path: str | Path, size_bytes: int, max_bytes: int, *, grew: bool = False) -> None:
        what = "grew past" if grew else f"is {size_bytes} bytes, more than"
        super().__init__(errno.EFBIG, f"{what} the {max_bytes} bytes allowed", str(path))
        self.size_bytes = size_bytes
        self.max_bytes = max_bytes
        self.grew = grew


def read_regular_file(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path` (links followed), refusing anything else before reading it.

    Opened without blocking, so a named pipe or a device is refused at once instead of read forever (even one
    swapped in after an earlier check: the test is made on the open descriptor); then it must be a regular file of
    at most `max_bytes`, and no more than `max_bytes` are read even if it grows meanwhile. Raises NotARegularFile,
    FileTooLarge, or the OSError the open or read raised (FileNotFoundError, PermissionError, ...); ValueError for a
    name holding a NUL character. Reads only: no crash semantics to speak of.
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(path, file_kind(info.st_mode))
        if info.st_size > max_bytes:
            raise FileTooLarge(path, info.st_size, max_bytes)
        with open(descriptor, "rb", closefd=False) as handle:  # through open(): a test can inject read errors
            data = handle.read(max_bytes + 1)
    finally:
        os.close(descriptor)
    if len(data) > max_bytes:
        raise FileTooLarge(path, len(data), max_bytes, grew=True)
    return data


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (a rename or create inside it) to the device.

    Crash semantics: after it returns, a rename or file creation made inside `path` before the call survives a
    power loss; before it returns, the entry may or may not be there after one.
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
