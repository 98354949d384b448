"""Sequential write (fsync'd) then read of checkpoint-sized files: what a checkpoint save and load can reach.

Each size: write the file in `block_bytes` blocks from one buffer of random bytes (so a compressing or
deduplicating store cannot flatter it), `fsync` it (the time counts until the data is on the device, as
`dd conv=fsync` counts it), drop the file's pages from the page cache (`posix_fadvise DONTNEED`, this file only,
so the read comes from the device and not from memory), read it back, delete it. Best of `repeats`.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import InputError
from gpufleet.runtime.bench.busbw import bench_bytes


def disk_sizes(text: str) -> tuple[int, ...]:
    """A comma list of file sizes for `bench disk`, at least one."""
    sizes = tuple(bench_bytes(item, "--sizes") for item in text.split(",") if item.strip())
    if not sizes:
        raise InputError("--sizes needs at least one size, such as 256MiB,1GiB")
    return sizes

#: Block size of each write and read call. Judgement: 8 MiB is past the point where larger blocks stop helping on
#: local NVMe and network file systems alike, and is what `dd bs=8M` comparisons use.
DEFAULT_BLOCK_BYTES = 8 * 2**20
#: Default file sizes: a checkpoint shard per rank is typically 0.25-4 GiB (a 70B model's bf16 weights + fp32 Adam
#: state over 64-512 ranks). Judgement.
DEFAULT_SIZES_BYTES = (256 * 2**20, 1 * 2**30)


@dataclass(frozen=True, slots=True)
class DiskRow:
    size_bytes: int
    write_s: float
    read_s: float

    @property
    def write_bytes_per_s(self) -> float:
        return self.size_bytes / self.write_s

    @property
    def read_bytes_per_s(self) -> float:
        return self.size_bytes / self.read_s


def _write(path: Path, size_bytes: int, block: memoryview) -> float:
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = size_bytes
        while left > 0:
            left -= os.write(fd, block[: min(left, len(block))])
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def _drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _read(path: Path, buffer: bytearray) -> float:
    view = memoryview(buffer)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        while handle.readinto(view):
            pass
    return time.perf_counter() - start


def bench_disk(folder: Path, sizes_bytes: tuple[int, ...] = DEFAULT_SIZES_BYTES, repeats: int = 1,
               block_bytes: int = DEFAULT_BLOCK_BYTES) -> list[DiskRow]:
    """One row per size (best write and best read of `repeats`); the scratch file is always removed."""
    if not folder.is_dir():
        raise InputError(f"{folder} is not a folder; bench disk writes a scratch file inside the folder it is given")
    if not os.access(folder, os.W_OK):
        raise InputError(f"cannot write in {folder} (permission denied)")
    block = memoryview(os.urandom(block_bytes))
    buffer = bytearray(block_bytes)
    path = folder / f".gpufleet-bench-disk-{uuid.uuid4().hex}"
    rows = []
    try:
        for size in sizes_bytes:
            writes, reads = [], []
            for _ in range(max(1, repeats)):
                writes.append(_write(path, size, block))
                _drop_cache(path)
                reads.append(_read(path, buffer))
                path.unlink()
            rows.append(DiskRow(size, min(writes), min(reads)))
    except OSError as error:
        raise InputError(f"disk bench in {folder} failed: {error.strerror or error}") from error
    finally:
        path.unlink(missing_ok=True)
    return rows
