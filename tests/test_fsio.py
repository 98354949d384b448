"""gpufleet.fsio: the one bounded reader every layer shares refuses what is not a small regular file, at once."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from gpufleet.fsio import FileTooLarge, NotARegularFile, fsync_dir, read_regular_file


def test_reads_a_file_of_exactly_the_bound(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"x" * 10)
    assert read_regular_file(target, 10) == b"x" * 10


def test_one_byte_over_the_bound_is_refused_with_its_size(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"x" * 11)
    with pytest.raises(FileTooLarge) as refused:
        read_regular_file(target, 10)
    assert (refused.value.size_bytes, refused.value.max_bytes, refused.value.grew) == (11, 10, False)
    assert refused.value.errno == errno.EFBIG


def test_a_folder_is_refused_as_one(tmp_path: Path) -> None:
    with pytest.raises(NotARegularFile) as refused:
        read_regular_file(tmp_path, 10)
    assert refused.value.kind == "a folder" and refused.value.errno == errno.EISDIR


@pytest.mark.timeout(20)
def test_a_named_pipe_with_no_writer_is_refused_without_blocking(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(NotARegularFile) as refused:
        read_regular_file(pipe, 10)
    assert refused.value.kind == "a named pipe"


def test_a_device_is_refused() -> None:
    with pytest.raises(NotARegularFile) as refused:
        read_regular_file("/dev/zero", 10)
    assert refused.value.kind == "a character device"


def test_a_missing_file_raises_the_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_regular_file(tmp_path / "missing", 10)


def test_fsync_dir_refuses_a_file(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"")
    fsync_dir(tmp_path)  # a folder: flushed
    with pytest.raises(NotADirectoryError):
        fsync_dir(target)
