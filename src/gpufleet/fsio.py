"""The two low-level file-system steps every layer shares: read a bounded regular file, flush a folder.

Standard library only, so that the model half, emit/, the runtime and the cache can all use it without an import
arrow pointing the wrong way. Callers turn its typed errors into their own (a one-line InputError for a user's
file, a checkpoint's damage, a skipped cache entry).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words ("a named pipe"), from its st_mode."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


class NotARegularFile(OSError):
    """The path is a folder, a pipe, a device, a socket or a kernel file (/proc, /sys); `kind` says which, in words."""

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


#: Where the kernel's own files live (procfs, sysfs): never a user's document. Their sizes say 0 and some read
#: forever or destructively (/proc/kmsg waits for kernel messages and takes them from every other reader).
KERNEL_FILE_SYSTEMS = ("/proc", "/sys")
_KERNEL_FILES = "a /proc or /sys file of the kernel"


def _on_kernel_file_system(path: str | Path, info: os.stat_result) -> bool:
    """Whether an open file lies on /proc or /sys: its device is theirs, or its real path is under them (a file
    system mounted inside /proc, such as /proc/sys in a container)."""
    for root in KERNEL_FILE_SYSTEMS:
        try:
            if os.stat(root).st_dev == info.st_dev:
                return True
        except OSError:
            continue
    real = os.path.realpath(path)
    return any(real == root or real.startswith(root + os.sep) for root in KERNEL_FILE_SYSTEMS)


@contextlib.contextmanager
def open_regular_file(path: str | Path, max_bytes: int) -> Iterator[BinaryIO]:
    """The regular file at `path` (links followed) open for reading, refused before a byte is read unless it is one
    of at most `max_bytes` outside /proc and /sys.

    Opened without blocking, so a named pipe or a device is refused at once instead of read forever (even one
    swapped in after an earlier check: the test is made on the open descriptor). Raises NotARegularFile,
    FileTooLarge, or the OSError the open raised (FileNotFoundError, PermissionError, ELOOP for a symbolic link
    loop, ...); ValueError for a name holding a NUL character. The caller reads no more than `max_bytes`.
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(path, file_kind(info.st_mode))
        if _on_kernel_file_system(path, info):
            raise NotARegularFile(path, _KERNEL_FILES)
        if info.st_size > max_bytes:
            raise FileTooLarge(path, info.st_size, max_bytes)
        with open(descriptor, "rb", closefd=False) as handle:  # through open(): a test can inject read errors
            yield handle
    finally:
        os.close(descriptor)


def read_regular_file(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path`, of at most `max_bytes` (open_regular_file's checks); no more than
    `max_bytes` are read even if it grows meanwhile (FileTooLarge, `grew`). Reads only: no crash semantics."""
    with open_regular_file(path, max_bytes) as handle:
        data = handle.read(max_bytes + 1)
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
