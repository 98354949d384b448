"""An object store in memory that fails on purpose: a real fsspec file system for store-fault tests without a server.

`FaultyStore` is a `MemoryFileSystem` made to behave like S3 where the checkpoint code can tell: an object appears
only whole, when its write completes (a PUT, or a multipart upload's completion), and an aborted write leaves
nothing; prefixes are not folders (`makedirs` creates nothing, a prefix exists while an object is under it). What
it does wrong is set on its `faults` (the test may change them while an upload runs):

- `silent`: the operations (`OPERATIONS`, or `EVERY_OPERATION`) that time out: the store does not answer them;
- `failing_writes`: how many of the next object writes the store refuses to complete (ConnectionResetError, as a
  connection reset or a 5xx answer is retried);
- `restarts_before_listing`: how many times the store loses every object it holds just before it answers a
  listing of a checkpoint's prefix, as a server restarted without its data between the upload's size checks and
  the listing that must prove the files are there before the manifest goes up.

Everything it did is recorded (`writes`, `restarts`, `requests`), so a test can say what happened, not only what
came out. Register it under `PROTOCOL` (`faultmem://bucket/prefix`) for code that opens a URL (`gpufleet ckpt`).
"""

from __future__ import annotations

import io
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fsspec.implementations.memory import MemoryFile, MemoryFileSystem

from gpufleet.runtime.checkpoint.names import parse_step

PROTOCOL = "faultmem"
OPERATIONS = frozenset({"open", "info", "ls", "find", "exists", "isdir", "rm", "makedirs"})
EVERY_OPERATION = OPERATIONS


@dataclass
class Faults:
    silent: frozenset[str] = frozenset()
    failing_writes: int = 0
    restarts_before_listing: int = 0


@dataclass(frozen=True)
class Write:
    """One object write: when it started (`time.monotonic()`), of which path, and whether the store completed it."""

    started_s: float
    path: str
    completed: bool


@dataclass
class _Record:
    writes: list[Write] = field(default_factory=list)
    restarts: int = 0
    requests: int = 0


class _Upload(io.BytesIO):
    """The body of one object write: held until `close()`, which completes the write (or, as the store's faults say,
    fails it); `discard()` aborts it, as an aborted multipart upload leaves nothing."""

    def __init__(self, store: FaultyStore, path: str) -> None:
        super().__init__()
        self.store = store
        self.path = path
        self.started_s = time.monotonic()
        self.discarded = False

    def discard(self) -> None:
        self.discarded = True

    def close(self) -> None:
        if self.closed:
            return
        data = self.getvalue()
        super().close()  # closed before anything else: a later garbage collection can never complete it
        if not self.discarded:
            self.store._complete(self.path, data, self.started_s)


class FaultyStore(MemoryFileSystem):
    """See the module docstring. Each instance has a store of its own."""

    protocol = (PROTOCOL,)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, global_store=False, **kwargs)
        self.faults = Faults()
        self.record = _Record()
        self.lock = threading.Lock()

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, str):
            path = path.removeprefix(f"{PROTOCOL}://")
        return super()._strip_protocol(path)

    # -- what a test reads -------------------------------------------------------------------------------------

    @property
    def writes(self) -> list[Write]:
        with self.lock:
            return list(self.record.writes)

    @property
    def restarts(self) -> int:
        return self.record.restarts

    def objects(self) -> list[str]:
        """Every object the store holds, by path."""
        return sorted(self.store)

    def damage(self, path: str, *, flip_byte_at: int | None = None) -> None:
        """Bit rot in the store: flip one byte of the object at `path`; with no offset, lose the object."""
        path = self._strip_protocol(path)
        if flip_byte_at is None:
            del self.store[path]
            return
        data = bytearray(self.store[path].getvalue())
        data[flip_byte_at] ^= 0xFF
        self.store[path] = MemoryFile(self, path, bytes(data))

    # -- the faults --------------------------------------------------------------------------------------------

    def _answer(self, operation: str, path: Any) -> None:
        """Raise for an operation the store does not answer; count every request."""
        with self.lock:
            self.record.requests += 1
        if operation in self.faults.silent:
            raise TimeoutError(f"{operation} {path}: the store did not answer (timed out)")

    def _complete(self, path: str, data: bytes, started_s: float) -> None:
        with self.lock:
            refused = self.faults.failing_writes > 0
            if refused:
                self.faults.failing_writes -= 1
            self.record.writes.append(Write(started_s, path, not refused))
        if refused:
            raise ConnectionResetError(f"PUT {path}: connection reset by the store (injected)")
        self.store[path] = MemoryFile(self, path, data)

    def _restart_before_listing(self, path: str) -> None:
        """Lose every object, once per `restarts_before_listing`, when a checkpoint's prefix that holds objects is
        listed."""
        stripped = self._strip_protocol(path)
        if parse_step(stripped.rsplit("/", 1)[-1]) is None:
            return
        with self.lock:
            holds = any(name.startswith(f"{stripped}/") for name in self.store)
            if not holds or self.faults.restarts_before_listing <= 0:
                return
            self.faults.restarts_before_listing -= 1
            self.record.restarts += 1
            self.store.clear()

    # -- fsspec's operations, through the faults ---------------------------------------------------------------

    def _open(self, path: Any, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        self._answer("open", path)
        if "w" in mode or "x" in mode:
            return _Upload(self, self._strip_protocol(path))
        return super()._open(path, mode, *args, **kwargs)

    def info(self, path: Any, **kwargs: Any) -> dict[str, Any]:
        self._answer("info", path)
        info: dict[str, Any] = super().info(path, **kwargs)
        return info

    def ls(self, path: Any, detail: bool = True, **kwargs: Any) -> Any:
        self._answer("ls", path)
        self._restart_before_listing(path)
        return super().ls(path, detail=detail, **kwargs)

    def find(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        self._answer("find", path)
        return super().find(path, *args, **kwargs)

    def exists(self, path: Any, **kwargs: Any) -> bool:
        self._answer("exists", path)  # fsspec's own exists() would take a store that does not answer for "absent"
        try:
            super().info(path)
        except FileNotFoundError:
            return False
        return True

    def isdir(self, path: Any) -> bool:
        self._answer("isdir", path)  # ...and its isdir() for "not a folder"
        try:
            return bool(super().info(path)["type"] == "directory")
        except FileNotFoundError:
            return False

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        self._answer("rm", path)
        super().rm(path, recursive=recursive, maxdepth=maxdepth)

    def makedirs(self, path: Any, exist_ok: bool = False) -> None:
        self._answer("makedirs", path)  # an object store has no folders: nothing to create
