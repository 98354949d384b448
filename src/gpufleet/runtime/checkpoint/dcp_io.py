"""torch.distributed.checkpoint (DCP) with safe loading: no pickle code execution, ever.

DCP stores non-tensor values with `torch.save` and reads them back with `torch.load(weights_only=False)`,
and it unpickles its `.metadata` file with plain `pickle.load`. Here both go through restricted loaders:
values use `weights_only=True`, and the metadata unpickler admits only DCP's own record classes, torch
sizes and dtypes, and plain containers.
"""

from __future__ import annotations

import io
import os
import pickle
import threading
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, cast

import torch
import torch.distributed.checkpoint as dcp
import xxhash
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from gpufleet.runtime.checkpoint.errors import CheckpointError, CorruptCheckpointError
from gpufleet.runtime.checkpoint.manifest import FileEntry

WRITE_THREADS = 2
"""DCP writer threads per rank: each writes its own shard file (`__{rank}_{i}.distcp`), so the
serialization work (torch.save's zip framing and CRC-32) of one overlaps the disk writes of another."""
WRITE_BUFFER_BYTES = 8 * 1024 * 1024
READ_THREADS = 4
"""Files read (and checksummed) at once by a verifying load."""
READ_CHUNK_BYTES = 16 * 1024 * 1024

_DCP_MODULES = ("torch.distributed.checkpoint.metadata",)
_ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.filesystem", "_StoragePrefix"),
    ("torch", "Size"),
    ("torch._utils", "_get_layout"),
    ("torch.serialization", "_get_layout"),
    ("torch", "layout"),
    ("torch", "memory_format"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "tuple"),
    ("builtins", "list"),
    ("builtins", "dict"),
    ("copyreg", "_reconstructor"),
    ("builtins", "object"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _DCP_MODULES or (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"checkpoint metadata refers to {module}.{name}, which is not allowed")


class SafeReader(dcp.FileSystemReader):
    """A FileSystemReader whose metadata unpickler only builds DCP's own records."""

    def _metadata_stream(self, path: Path) -> IO[bytes]:
        return open(path, "rb")

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / ".metadata"
        try:
            with self._metadata_stream(path) as handle:
                metadata = _MetadataUnpickler(handle).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as error:
            raise CheckpointError(f"{path}: unreadable checkpoint metadata ({error})") from error
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path}: not DCP metadata")
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata


class _MemoryFile(io.RawIOBase):
    """A read-only, seekable file over a slice of bytes already in memory (no copy)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        count = max(0, min(target.nbytes, len(self._view) - self._pos))
        target[:count] = self._view[self._pos:self._pos + count]
        self._pos += count
        return count


def read_verified(path: Path, expected: FileEntry, *, keep: bool = True) -> memoryview | None:
    """Read a whole file once, checking its size and xxh3-128 against `expected`.

    Raises CorruptCheckpointError naming the file when it is missing, of another size, or damaged. With
    `keep` the bytes are returned (exactly the bytes that were checked); without, the file is streamed
    through one reused buffer and nothing is kept (the pages stay in the OS page cache for the load).
    """
    where, name = str(path.parent), path.name
    try:
        handle = open(path, "rb", buffering=0)  # noqa: SIM115 - closed below
    except FileNotFoundError as error:
        raise CorruptCheckpointError(where, [f"{name}: missing"]) from error
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if size != expected.size_bytes:
            raise CorruptCheckpointError(where, [f"{name}: size {size} bytes, manifest says {expected.size_bytes}"])
        data = memoryview(bytearray(size if keep else min(size, READ_CHUNK_BYTES)))
        hasher = xxhash.xxh3_128()
        done = 0
        while done < size:
            start = done if keep else 0
            count = handle.readinto(data[start:start + READ_CHUNK_BYTES])
            if not count:
                break
            hasher.update(data[start:start + count])
            done += count
        if done != size or handle.read(1):
            raise CorruptCheckpointError(where, [f"{name}: changed size while being read"])
    if hasher.hexdigest() != expected.checksum:
        raise CorruptCheckpointError(where, [f"{name}: checksum mismatch (bit rot or a partial overwrite)"])
    return data if keep else None


class VerifiedReader(SafeReader):
    """Verifies every file this load needs against the manifest, in parallel, before DCP reads it.

    `.metadata` is read once into memory, checked, and unpickled from those very bytes. The shard files
    are streamed through a small buffer and hashed (READ_THREADS at once), and only when all of them
    match does DCP read them, from the page cache the check has just filled; so a damaged checkpoint
    raises CorruptCheckpointError and leaves a template untouched. (Holding the shards in memory to
    read them only once was measured slower here: filling fresh pages twice costs more than the
    second, cached read.)
    """

    def __init__(self, path: str | os.PathLike[str], expected: dict[str, FileEntry]) -> None:
        super().__init__(path)
        self.expected = expected
        self._metadata: memoryview | None = None

    def _entry(self, name: str) -> FileEntry:
        entry = self.expected.get(name)
        if entry is None:
            raise CorruptCheckpointError(str(self.path), [f"{name}: not listed in the manifest"])
        return entry

    def check_metadata(self) -> None:
        """Read and verify `.metadata` now, so that damage to it raises CorruptCheckpointError here."""
        path = Path(self.path) / ".metadata"
        self._metadata = read_verified(path, self._entry(path.name), keep=True)

    def _metadata_stream(self, path: Path) -> IO[bytes]:
        if self._metadata is None:
            self.check_metadata()
        assert self._metadata is not None
        return cast(IO[bytes], _MemoryFile(self._metadata))

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Any:
        from concurrent.futures import ThreadPoolExecutor

        names = sorted({self.storage_data[item.storage_index].relative_path for item in plan.items})
        entries = [self._entry(name) for name in names]
        problems: list[str] = []
        with ThreadPoolExecutor(max_workers=max(1, min(READ_THREADS, len(names)))) as pool:
            checks = [pool.submit(read_verified, Path(self.path) / name, entry, keep=False)
                      for name, entry in zip(names, entries, strict=True)]
            for check in checks:
                try:
                    check.result()
                except CorruptCheckpointError as error:
                    problems.extend(error.problems)
        if problems:
            raise CorruptCheckpointError(str(self.path), problems)
        return super().read_data(plan, planner)


class _SafeBytesMixin:
    """Replaces DCP's `torch.load(weights_only=False)` for non-tensor values with weights-only loading."""

    flatten_state_dict: bool
    original_state_dict: dict[str, Any]
    state_dict: dict[str, Any]
    mappings: dict[str, Any]

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True, map_location="cpu")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


class SafeLoadPlanner(_SafeBytesMixin, DefaultLoadPlanner):
    """Loads into a template state dict (resharding to its layout)."""


class SafeEmptyPlanner(_SafeBytesMixin, _EmptyStateDictLoadPlanner):
    """Rebuilds the whole state dict from the checkpoint's metadata (one process)."""


class _HashingWriter(io.RawIOBase):
    """A write-only file that hashes (xxh3-128) and counts every byte on its way to the file.

    Valid only while the bytes arrive strictly in order; any seek or truncate marks the digest unusable,
    and the caller then hashes the file by reading it back.
    """

    def __init__(self, path: Path, mode: str) -> None:
        super().__init__()
        self.path = path
        self._file = open(path, mode, buffering=WRITE_BUFFER_BYTES)  # noqa: SIM115 - closed in close()
        self._hasher = xxhash.xxh3_128()
        self._size = 0
        self.sequential = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        written = self._file.write(view)  # a BufferedWriter writes everything or raises
        if written != view.nbytes:
            self.sequential = False
        self._hasher.update(view)
        self._size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self._file.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.sequential = False
        return self._file.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        self.sequential = False
        return self._file.truncate(size)

    def flush(self) -> None:
        if not self._file.closed:
            self._file.flush()

    def fileno(self) -> int:
        return self._file.fileno()

    def close(self) -> None:
        if not self.closed:
            try:
                self._file.close()
            finally:
                super().close()

    def entry(self) -> FileEntry | None:
        return FileEntry(self._size, self._hasher.hexdigest()) if self.sequential else None


class _HashingFileSystem(FileSystem):
    """DCP's local file system, but every file written gets its size and xxh3-128 recorded as it is written."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.written: dict[str, FileEntry | None] = {}
        self.completed: set[str] = set()
        self.failures: list[str] = []

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.IOBase, None, None]:
        if "w" not in mode or "+" in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        try:
            stream = _HashingWriter(Path(path), mode)
            try:
                yield stream
            finally:
                stream.close()
        except BaseException as error:
            with self._lock:
                self.failures.append(f"{Path(path).name}: {type(error).__name__}: {error}")
            raise
        with self._lock:
            self.completed.add(os.fspath(path))
            self.written[os.fspath(path)] = stream.entry()

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        with self._lock:
            self.written[os.fspath(new_path)] = self.written.pop(os.fspath(path), None)
            if os.fspath(path) in self.completed:
                self.completed.discard(os.fspath(path))
                self.completed.add(os.fspath(new_path))


def write(state_dict: dict[str, Any], path: Path, process_group: Any | None) -> dict[str, FileEntry]:
    """Each rank writes its shard into `path` (files fsynced); the coordinator writes `.metadata`.

    Returns the size and xxh3-128 of each file this process wrote, by file name, computed from the
    bytes as they were written (a file whose bytes did not arrive in order is left out).
    """
    import warnings

    writer = dcp.FileSystemWriter(path, single_file_per_rank=True, sync_files=True, thread_count=WRITE_THREADS)
    hashing = _HashingFileSystem()
    writer.fs = hashing
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state_dict, storage_writer=writer, process_group=process_group,
                 no_dist=process_group is None)
    # DCP's extra writer threads die silently on an error and their items simply go missing from the
    # metadata, so count the shard files that were written to the end (fsync included) ourselves.
    shards = [name for name in hashing.completed if name.endswith(".distcp")]
    if hashing.failures or len(shards) != WRITE_THREADS:
        raise CheckpointError(f"{len(shards)} of {WRITE_THREADS} shard files written"
                              + (f" ({'; '.join(hashing.failures)})" if hashing.failures else
                                 " (a writer thread failed before opening its file)"))
    return {Path(name).name: entry for name, entry in hashing.written.items()
            if entry is not None and Path(name).parent == Path(path)}


def read(path: Path, template: dict[str, Any] | None, process_group: Any | None,
         expected: dict[str, FileEntry] | None = None) -> dict[str, Any]:
    """Load a checkpoint; into `template` (resharding to its layout) or, without one, whole.

    With `expected` (the manifest's files), every file is verified as it is read, once, before any of its
    values is used; a damaged checkpoint raises CorruptCheckpointError.
    """
    import warnings

    reader = SafeReader(path)
    if expected is not None:
        reader = VerifiedReader(path, expected)
        reader.check_metadata()
    no_dist = process_group is None
    try:
        if template is None:
            if not no_dist:
                raise CheckpointError("loading without a template needs a single process; pass a state dict "
                                      "shaped like this rank's model to load across ranks")
            state: dict[str, Any] = {}
            _load_state_dict(state, storage_reader=reader, planner=SafeEmptyPlanner(), no_dist=True)
            return state
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(template, storage_reader=reader, planner=SafeLoadPlanner(), process_group=process_group,
                     no_dist=no_dist)
        return template
    except CheckpointException as error:
        for failure, _ in error.failures.values():  # DCP wraps what a storage reader raised
            if isinstance(failure, CorruptCheckpointError):
                raise failure from error
        raise
