"""Reading a checkpoint file front to back exactly once while checking its xxh3-128.

`FileSweep` owns one open file and a position that only moves forward: every byte between 0 and the
file's size passes through the hasher exactly once, whether it is read into a destination tensor
(`read_into`), into a fresh buffer (`read_bytes`) or skipped over (`skip_to`, read and hashed but not
kept). `finish()` hashes whatever is left and compares size and digest with the manifest, so a file
counts as verified only when all of it was covered, however little of it the load needed.

`tensor_record` locates, inside one `torch.save` archive embedded in a DCP shard, the raw bytes of the
tensor's storage, so that a contiguous destination can be filled by reading straight into it (no
intermediate tensor, no copy). The layout hints come from bytes not yet checked (`pread`); they only
steer where bytes go, each hint is bounds-checked against the slice and the destination, and the
checksum over the whole file decides afterwards whether the load is accepted.
"""

from __future__ import annotations

import io
import os
import struct
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import xxhash

from gpufleet.runtime.checkpoint.errors import CorruptCheckpointError
from gpufleet.runtime.checkpoint.manifest import FileEntry

CHUNK_BYTES = 4 * 1024 * 1024
"""Bytes read per system call; small enough that the hash of a chunk runs on cache-hot bytes."""
MAX_HEADER_BYTES = 1024 * 1024
"""A torch.save archive whose data record starts further in than this is read whole instead."""
_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")
_LOCAL_SIGNATURE = 0x04034B50


class FileSweep:
    """One file read strictly in order, every byte hashed once; see the module docstring."""

    def __init__(self, path: Path, expected: FileEntry) -> None:
        self.path = path
        self.expected = expected
        self.where, self.name = str(path.parent), path.name
        try:
            self._file = open(path, "rb", buffering=0)  # noqa: SIM115 - closed in close()
        except FileNotFoundError as error:
            raise CorruptCheckpointError(self.where, [f"{self.name}: missing"]) from error
        except OSError as error:
            raise self._unreadable(error) from error
        self._fd = self._file.fileno()
        self.size = os.fstat(self._fd).st_size
        if self.size != expected.size_bytes:
            self._file.close()
            raise CorruptCheckpointError(self.where, [f"{self.name}: size {self.size} bytes, manifest says "
                                                      f"{expected.size_bytes}"])
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        self._hasher = xxhash.xxh3_128()
        self._scratch: memoryview | None = None
        self.pos = 0

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> FileSweep:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unreadable(self, error: OSError) -> CorruptCheckpointError:
        """A permission refused, an I/O error (a bad sector), a folder where the file belongs: this file's damage."""
        return CorruptCheckpointError(self.where, [f"{self.name}: cannot be read ({error.strerror or error})"])

    def _short(self) -> CorruptCheckpointError:
        return CorruptCheckpointError(self.where, [f"{self.name}: changed size while being read"])

    def read_into(self, target: memoryview) -> None:
        """Fill `target` with the next bytes of the file, hashing each chunk right after it lands."""
        view = target.cast("B") if target.format != "B" or target.ndim != 1 else target
        done, total = 0, view.nbytes
        if self.pos + total > self.size:
            raise self._short()
        while done < total:
            part = view[done:done + CHUNK_BYTES]
            try:
                count = self._file.readinto(part)
            except OSError as error:
                raise self._unreadable(error) from error
            if not count:
                raise self._short()
            self._hasher.update(part[:count])
            done += count
        self.pos += total

    def read_bytes(self, count: int) -> memoryview:
        """The next `count` bytes, in a new buffer."""
        data = memoryview(bytearray(count))
        self.read_into(data)
        return data

    def skip_to(self, offset: int) -> None:
        """Read and hash (without keeping) every byte up to `offset`."""
        if offset < self.pos or offset > self.size:
            raise ValueError(f"{self.name}: cannot move from byte {self.pos} to {offset}")
        while self.pos < offset:
            if self._scratch is None:
                self._scratch = memoryview(bytearray(CHUNK_BYTES))
            self.read_into(self._scratch[:min(offset - self.pos, CHUNK_BYTES)])

    def pread(self, offset: int, count: int) -> bytes:
        """Bytes at `offset`, outside the sweep: not hashed, so usable only as hints."""
        return os.pread(self._fd, count, offset)

    def finish(self) -> None:
        """Hash the rest of the file, then compare size and digest with the manifest."""
        self.skip_to(self.size)
        if self._file.read(1):
            raise self._short()
        if self._hasher.hexdigest() != self.expected.checksum:
            raise CorruptCheckpointError(self.where,
                                         [f"{self.name}: checksum mismatch (bit rot or a partial overwrite)"])


class ReadOnlyView(io.RawIOBase):
    """A read-only, seekable file of `length` bytes; subclasses say where the bytes come from (readinto)."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self._length, self._pos = length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos


class _PreadView(ReadOnlyView):
    """A seekable, read-only view of `length` bytes at `base` in a FileSweep's file (via pread)."""

    def __init__(self, sweep: FileSweep, base: int, length: int) -> None:
        super().__init__(length)
        self._sweep, self._base = sweep, base

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        count = max(0, min(target.nbytes, self._length - self._pos))
        data = self._sweep.pread(self._base + self._pos, count)
        target[:len(data)] = data
        self._pos += len(data)
        return len(data)


@dataclass(frozen=True)
class TensorRecord:
    """Where a torch.save archive keeps one tensor: offsets are relative to the archive's start."""

    pickle_start: int
    pickle_size: int
    data_start: int
    data_size: int
    data_name: str
    byteorder: tuple[int, int] | None
    """(start, size) of the `byteorder` record, when there is one."""


def _record_start(sweep: FileSweep, base: int, length: int, info: zipfile.ZipInfo) -> int | None:
    header = sweep.pread(base + info.header_offset, _LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size:
        return None
    fields = _LOCAL_HEADER.unpack(header)
    if fields[0] != _LOCAL_SIGNATURE:
        return None
    start = info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10]
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
        return None
    if start + info.file_size > length:
        return None
    return start


def tensor_record(sweep: FileSweep, base: int, length: int) -> TensorRecord | None:
    """The layout of the single-tensor torch.save archive at `base`, or None if it is not a simple one."""
    try:
        with zipfile.ZipFile(_PreadView(sweep, base, length)) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error):
        return None
    pickles = [i for i in infos if i.filename.endswith("/data.pkl")]
    records = [i for i in infos if "/data/" in i.filename and not i.filename.endswith("/")]
    orders = [i for i in infos if i.filename.endswith("/byteorder")]
    if len(pickles) != 1 or len(records) != 1 or len(orders) > 1:
        return None
    pickle_start = _record_start(sweep, base, length, pickles[0])
    data_start = _record_start(sweep, base, length, records[0])
    order_start = _record_start(sweep, base, length, orders[0]) if orders else None
    if pickle_start is None or data_start is None or (orders and order_start is None):
        return None
    byteorder = (order_start, orders[0].file_size) if orders and order_start is not None else None
    if pickle_start + pickles[0].file_size > data_start or data_start > MAX_HEADER_BYTES:
        return None
    if byteorder is not None and byteorder[0] + byteorder[1] > data_start:
        return None
    return TensorRecord(pickle_start, pickles[0].file_size, data_start, records[0].file_size, records[0].filename,
                        byteorder)


def describe_tensor(pickled: bytes) -> tuple[torch.Tensor, str] | None:
    """Unpickle a torch.save `data.pkl` with weights-only rules onto the meta device.

    Returns the tensor (shape, stride, offset and dtype, no data) and the key of its one storage
    record, or None when the pickle is anything else (several storages, not a tensor, refused).
    """
    from gpufleet.runtime.checkpoint.torch_private import weights_only_unpickler as weights_only

    keys: list[tuple[str, int]] = []

    def persistent_load(saved_id: Any) -> Any:
        if not isinstance(saved_id, tuple) or len(saved_id) != 5 or saved_id[0] != "storage":
            raise RuntimeError("unexpected persistent id")
        _, storage_type, key, _location, numel = saved_id
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
        keys.append((str(key), int(numel) * dtype.itemsize))
        untyped = torch.UntypedStorage(int(numel) * dtype.itemsize, device="meta")
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)

    try:
        unpickler = weights_only.Unpickler(io.BytesIO(pickled), encoding="utf-8")
        unpickler.persistent_load = persistent_load  # type: ignore[method-assign]
        tensor = unpickler.load()
    except Exception:  # anything unusual is simply read the general way
        return None
    if not isinstance(tensor, torch.Tensor) or len(keys) != 1 or tensor.device.type != "meta":
        return None
    key, storage_bytes = keys[0]
    if storage_bytes != tensor.numel() * tensor.element_size():
        return None
    return tensor, key


def native_byteorder(value: bytes | None) -> bool:
    """Whether a `byteorder` record (None: absent, which torch reads as little-endian) matches this machine."""
    return (value or b"little").decode("ascii", "replace") == sys.byteorder


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory."""
    flat = tensor.reshape(-1)
    return memoryview(cast(Any, flat.view(torch.uint8).numpy())).cast("B")
