"""torch.distributed.checkpoint (DCP) with safe loading: no pickle code execution, ever.

DCP stores non-tensor values with `torch.save` and reads them back with `torch.load(weights_only=False)`,
and it unpickles its `.metadata` file with plain `pickle.load`. Here both go through restricted loaders:
values use `weights_only=True` (NumPy arrays and scalars admitted: `values.numpy_allowed`), and the metadata
unpickler admits only DCP's own record classes, torch sizes and dtypes, and plain containers.

An error reading a file of the checkpoint (a permission refused, an I/O error) is that checkpoint's damage
(CorruptCheckpointError naming the file); anything else DCP raises comes out as one CheckpointError, never as
torch's raw CheckpointException.
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
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem

from gpufleet.runtime.checkpoint.errors import CheckpointError, CorruptCheckpointError
from gpufleet.runtime.checkpoint.manifest import FileEntry
from gpufleet.runtime.checkpoint.streamread import (
    FileSweep,
    ReadOnlyView,
    describe_tensor,
    native_byteorder,
    tensor_bytes,
    tensor_record,
)
from gpufleet.runtime.checkpoint.torch_private import (  # every private torch API, checked in one place
    _EmptyStateDictLoadPlanner,
    _load_state_dict,
    narrow_tensor_by_index,
    set_element,
)
from gpufleet.runtime.checkpoint.values import numpy_allowed

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


class _MemoryFile(ReadOnlyView):
    """A read-only, seekable file over a slice of bytes already in memory (no copy)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__(len(view))
        self._view = view

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
    through one reused buffer and nothing is kept (used to tell damage from a bug when deserializing
    a shard failed before its checksum was known).
    """
    where, name = str(path.parent), path.name
    try:
        return _read_verified(path, expected, keep=keep)
    except FileNotFoundError as error:
        raise CorruptCheckpointError(where, [f"{name}: missing"]) from error
    except OSError as error:
        raise CorruptCheckpointError(where, [f"{name}: cannot be read ({error.strerror or error})"]) from error


def _read_verified(path: Path, expected: FileEntry, *, keep: bool) -> memoryview | None:
    """`read_verified`, letting an OSError through."""
    where, name = str(path.parent), path.name
    with open(path, "rb", buffering=0) as handle:
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
    """Checks every file this load needs against the manifest while DCP's items are read from it.

    `.metadata` is read once into memory, checked, and unpickled from those very bytes. Each shard file
    is then read once, front to back, by its own thread (READ_THREADS at once): a tensor stored whole
    and contiguous is read straight into its (contiguous) destination, anything else into a buffer and
    deserialized as DCP does, and the bytes in between (archive headers, items this load skips) are read
    and hashed too; the file's size and xxh3-128 are compared at its end. A mismatch raises
    CorruptCheckpointError naming the file, by which time values of this checkpoint may already have
    been written into the template: the exception is the signal (`touched` records that it happened).
    """

    def __init__(self, path: str | os.PathLike[str], expected: dict[str, FileEntry]) -> None:
        super().__init__(path)
        self.expected = expected
        self._metadata: memoryview | None = None
        self._lock = threading.Lock()
        self.touched = False
        """Whether any value has been written into the destination state dict."""
        self.direct_bytes = 0
        """Bytes read straight into destination tensors (the rest went through a buffer)."""

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

        from torch.futures import Future

        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        entries = {name: self._entry(name) for name in per_file}
        problems: list[str] = []
        failure: BaseException | None = None
        with ThreadPoolExecutor(max_workers=max(1, min(READ_THREADS, len(per_file)))) as pool:
            reads = [pool.submit(self._read_file, name, items, entries[name], planner)
                     for name, items in sorted(per_file.items())]
            for done in reads:
                try:
                    done.result()
                except CorruptCheckpointError as error:
                    problems.extend(error.problems)
                except BaseException as error:
                    failure = failure or error
        if problems:
            raise CorruptCheckpointError(str(self.path), problems)
        if failure is not None:
            raise failure
        result: Future[None] = Future()
        result.set_result(None)
        return result

    def _read_file(self, name: str, items: list[ReadItem], entry: FileEntry, planner: LoadPlanner) -> None:
        path = Path(self.path) / name
        slices: dict[tuple[int, int], list[ReadItem]] = {}
        for item in items:
            info = self.storage_data[item.storage_index]
            slices.setdefault((info.offset, info.length), []).append(item)
        with FileSweep(path, entry) as sweep:
            try:
                for (offset, length), group in sorted(slices.items()):
                    if offset < sweep.pos or offset + length > sweep.size:
                        raise CheckpointError(f"{path}: items overlap or lie outside the file")
                    sweep.skip_to(offset)
                    self._read_slice(sweep, offset, length, group, planner)
                sweep.finish()
            except CorruptCheckpointError:
                raise
            except Exception:
                # Damaged bytes can break deserialization before the checksum is known; if the file does
                # not match its manifest, that is the error to report.
                read_verified(path, entry, keep=False)
                raise

    def _read_slice(self, sweep: FileSweep, offset: int, length: int, items: list[ReadItem],
                    planner: LoadPlanner) -> None:
        info = self.storage_data[items[0].storage_index]
        head = memoryview(b"")
        if len(items) == 1 and items[0].type != LoadItemType.BYTE_IO and not info.transform_descriptors:
            done, head = self._read_direct(sweep, offset, length, items[0], planner)
            if done:
                return
        rest = sweep.read_bytes(offset + length - sweep.pos)
        data = memoryview(bytes(head) + bytes(rest)) if head.nbytes else rest
        self._deserialize(data, items, planner)

    def _read_direct(self, sweep: FileSweep, offset: int, length: int, item: ReadItem,
                     planner: LoadPlanner) -> tuple[bool, memoryview]:
        """Read a whole, contiguous stored tensor straight into its contiguous destination.

        Returns (True, _) when done; (False, header) when the item needs the general path (resharding,
        another layout or dtype, an unusual archive), with the archive's header bytes already consumed.
        """
        layout = tensor_record(sweep, offset, length)
        if layout is None:
            return False, memoryview(b"")
        head = sweep.read_bytes(layout.data_start)
        described = describe_tensor(bytes(head[layout.pickle_start:layout.pickle_start + layout.pickle_size]))
        if described is None:
            return False, head
        stored, key = described
        order = None if layout.byteorder is None else bytes(head[layout.byteorder[0]:sum(layout.byteorder)])
        if (not layout.data_name.endswith(f"/data/{key}") or not native_byteorder(order)
                or not stored.is_contiguous() or stored.storage_offset() != 0
                or stored.numel() * stored.element_size() != layout.data_size
                or any(item.storage_offsets) or list(item.lengths) != list(stored.shape)):
            return False, head
        with self._lock:
            target = planner.resolve_tensor(item).detach()
        if (target.device.type != "cpu" or target.layout != torch.strided or target.dtype != stored.dtype
                or target.shape != stored.shape or not target.is_contiguous() or target.is_quantized
                or target.is_conj() or target.is_neg()):
            return False, head
        self.touched = True
        if layout.data_size:
            sweep.read_into(tensor_bytes(target))
        sweep.skip_to(offset + length)
        with self._lock:
            planner.commit_tensor(item, target)
            self.direct_bytes += layout.data_size
        return True, head

    def _deserialize(self, data: memoryview, items: list[ReadItem], planner: LoadPlanner) -> None:
        """What DCP's FileSystemReader does with one item's bytes, from memory already read."""
        info = self.storage_data[items[0].storage_index]
        for item in items:
            stream = self.transforms.transform_load_stream(item, info.transform_descriptors or (),
                                                           cast(IO[bytes], _MemoryFile(data)))
            if item.type == LoadItemType.BYTE_IO:
                with self._lock:
                    self.touched = True
                    planner.load_bytes(item, io.BytesIO(stream.read(-1)))
                continue
            seekable = stream if stream.seekable() else io.BytesIO(stream.read(-1))
            tensor = cast(torch.Tensor, torch.load(seekable, map_location="cpu", weights_only=True))
            tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
            with self._lock:
                target = planner.resolve_tensor(item).detach()
            if target.size() != tensor.size():
                raise CheckpointError(f"{item.storage_index}: stored size {tuple(tensor.size())}, "
                                      f"destination {tuple(target.size())}")
            self.touched = True
            target.copy_(tensor)
            with self._lock:
                planner.commit_tensor(item, target)


class _SafeBytesMixin:
    """Replaces DCP's `torch.load(weights_only=False)` for non-tensor values with weights-only loading."""

    flatten_state_dict: bool
    original_state_dict: dict[str, Any]
    state_dict: dict[str, Any]
    mappings: dict[str, Any]

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        with numpy_allowed():
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


def _summary(failures: list[BaseException]) -> str:
    """The first line of the first failure DCP collected, for a one-line message."""
    if not failures:
        return ""
    first = failures[0]
    text = (str(first).strip().splitlines() or [type(first).__name__])[0]
    return f"{type(first).__name__}: {text[:300]}"


def read(path: Path, template: dict[str, Any] | None, process_group: Any | None,
         expected: dict[str, FileEntry] | None = None) -> dict[str, Any]:
    """Load a checkpoint; into `template` (resharding to its layout) or, without one, whole.

    With `expected` (the manifest's files), every file is verified as it is read, each byte once; a damaged
    checkpoint raises CorruptCheckpointError naming the file, and its `partial_template` says whether
    values of the damaged checkpoint had already been written into `template` (they may have been).
    """
    import warnings

    reader = SafeReader(path)
    if expected is not None:
        reader = VerifiedReader(path, expected)
        reader.check_metadata()
    no_dist = process_group is None
    try:
        try:
            if template is None:
                if not no_dist:
                    raise CheckpointError("loading without a template needs a single process; pass a state "
                                          "dict shaped like this rank's model to load across ranks")
                state: dict[str, Any] = {}
                _load_state_dict(state, storage_reader=reader, planner=SafeEmptyPlanner(), no_dist=True)
                return state
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.load(template, storage_reader=reader, planner=SafeLoadPlanner(), process_group=process_group,
                         no_dist=no_dist)
            return template
        except CheckpointException as error:
            failures = [failure for failure, _ in error.failures.values()]  # what each rank's reader raised
            for failure in failures:
                if isinstance(failure, CorruptCheckpointError):
                    raise failure from error
            raise CheckpointError(f"{path} cannot be loaded: {_summary(failures) or error}") from error
    except CorruptCheckpointError as error:
        error.partial_template = template is not None and isinstance(reader, VerifiedReader) and reader.touched
        raise
