"""Where checkpoints are mirrored: a file system and the root inside it, handed in or built from a URL.

`StoreFileSystem` names every operation the checkpoint code asks of a store (listing, copying, verifying and
deleting checkpoints: `store`, `verify`, `landed`, `retention`). Any fsspec `AbstractFileSystem` provides them: s3fs
for `s3://`, the local disk for `file://` and plain paths, and in tests an in-memory store that fails on purpose
(tests/runtime/faultstore.py), so a store fault can be tested without a server. `StoreRoot` pairs one with the
prefix under which the `step_…` folders live; `CheckpointManager(upload_to=…)` takes a `StoreRoot` or a URL, which
`StoreRoot.from_url` opens as before (`store.open_url`, with the caller's `storage_options`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from gpufleet.runtime.checkpoint.errors import CheckpointError
from gpufleet.runtime.checkpoint.names import join


class StoreFileSystem(Protocol):
    """The operations of an fsspec file system that checkpoint code uses, with fsspec's meanings: `ls`, `info` and
    `find` raise FileNotFoundError for what is not there; a store that does not answer raises an OSError (a
    ConnectionError or TimeoutError) or its client's own error (`reach.is_unreachable` tells them apart)."""

    @property
    def protocol(self) -> str | tuple[str, ...]: ...

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any: ...

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]: ...

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]: ...

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False,
             **kwargs: Any) -> Any: ...

    def exists(self, path: str, **kwargs: Any) -> bool: ...

    def isdir(self, path: str) -> bool: ...

    def makedirs(self, path: str, exist_ok: bool = False) -> None: ...

    def rm(self, path: str, recursive: bool = False, maxdepth: int | None = None) -> None: ...

    def invalidate_cache(self, path: str | None = None) -> None: ...

    def unstrip_protocol(self, name: str) -> str: ...

    def _strip_protocol(self, path: str) -> str: ...


@dataclass(frozen=True)
class StoreRoot:
    """A checkpoint root on a store: the file system `fs` and the path `root` inside it (no trailing slash)."""

    fs: StoreFileSystem
    root: str

    @classmethod
    def from_url(cls, url: str, storage_options: dict[str, Any] | None = None) -> StoreRoot:
        """The root a URL names (`s3://bucket/prefix`, `file://…`, a path), opened with fsspec (`store.open_url`)."""
        from gpufleet.runtime.checkpoint.store import open_url

        fs, root = open_url(url, storage_options)
        return cls(fs, root)

    def path(self, name: str) -> str:
        """`name` (a `step_…` folder) under this root."""
        return join(self.root, name)

    def __str__(self) -> str:
        return self.root


def store_root(upload_to: str | StoreRoot | None, storage_options: dict[str, Any] | None) -> StoreRoot | None:
    """The store a manager mirrors to: the `StoreRoot` given, the one its URL names, or None (no upload)."""
    if isinstance(upload_to, StoreRoot):
        if storage_options:
            raise CheckpointError("storage_options open a URL: a StoreRoot is given with its file system already "
                                  "open, so pass one or the other")
        return upload_to
    if not upload_to:
        return None
    return StoreRoot.from_url(upload_to, storage_options)
