"""The manifest: what a committed checkpoint holds, with a size and an xxh3-128 checksum per file.

A checkpoint directory is committed exactly when its `manifest.json` exists under its final name. The
manifest carries a checksum of its own body, so a flipped bit inside the manifest is caught too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import xxhash

from gpufleet.runtime.checkpoint.errors import CorruptCheckpointError
from gpufleet.runtime.checkpoint.names import check_relpath

MANIFEST_NAME = "manifest.json"
FORMAT = "gpufleet-checkpoint/1"
CHECKSUM = "xxh3_128"
CHUNK_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its size and checksum."""

    size_bytes: int
    checksum: str


@dataclass(frozen=True)
class Manifest:
    """What a committed checkpoint holds."""

    step: int
    world_size: int
    files: dict[str, FileEntry]
    framework: dict[str, Any] = field(default_factory=dict)
    user: dict[str, Any] = field(default_factory=dict)
    created_unix_s: float = field(default_factory=time.time)

    @property
    def total_bytes(self) -> int:
        return sum(entry.size_bytes for entry in self.files.values())

    def _body(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "step": self.step,
            "world_size": self.world_size,
            "created_unix_s": self.created_unix_s,
            "checksum": CHECKSUM,
            "framework": self.framework,
            "user": self.user,
            "files": {
                name: {"size_bytes": entry.size_bytes, "checksum": entry.checksum}
                for name, entry in sorted(self.files.items())
            },
        }

    def to_json(self) -> bytes:
        body = self._body()
        body["manifest_checksum"] = _digest_of(body)
        return (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Manifest:
        """Parse and check a manifest; any damage raises CorruptCheckpointError naming `where`."""
        try:
            body = json.loads(data)
            claimed = body.pop("manifest_checksum")
            if _digest_of(body) != claimed:
                raise CorruptCheckpointError(where, [f"{MANIFEST_NAME}: its own checksum does not match"])
            if body["format"] != FORMAT or body["checksum"] != CHECKSUM:
                raise CorruptCheckpointError(
                    where, [f"{MANIFEST_NAME}: format {body['format']!r}/{body['checksum']!r} is not {FORMAT}"]
                )
            files = {
                check_relpath(str(name)): FileEntry(int(entry["size_bytes"]), str(entry["checksum"]))
                for name, entry in body["files"].items()
            }
            return cls(
                step=int(body["step"]),
                world_size=int(body["world_size"]),
                files=files,
                framework=dict(body["framework"]),
                user=dict(body["user"]),
                created_unix_s=float(body["created_unix_s"]),
            )
        except CorruptCheckpointError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise CorruptCheckpointError(where, [f"{MANIFEST_NAME}: unreadable ({error})"]) from error


def _digest_of(body: dict[str, Any]) -> str:
    return xxhash.xxh3_128_hexdigest(json.dumps(body, sort_keys=True).encode())


def chunks(handle: IO[bytes], chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Read a binary stream in fixed-size pieces."""
    while True:
        block = handle.read(chunk_bytes)
        if not block:
            return
        yield block


def hash_stream(handle: IO[bytes]) -> FileEntry:
    """Size and xxh3-128 of everything left in `handle`."""
    hasher = xxhash.xxh3_128()
    size = 0
    for block in chunks(handle):
        hasher.update(block)
        size += len(block)
    return FileEntry(size, hasher.hexdigest())
