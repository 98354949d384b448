"""The manifest: what a committed checkpoint holds, with a size and an xxh3-128 checksum per file.

A checkpoint directory is committed exactly when its `manifest.json` exists under its final name. The
manifest carries a checksum of its own body, so a flipped bit inside the manifest is caught too.

A manifest is read as untrusted input: at most MAX_MANIFEST_BYTES, its JSON nesting measured before it is
parsed (so no nesting can exhaust the parser's recursion), and every field checked for its type and range
(so `1e400` or `true` where a step belongs is damage, not an OverflowError).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import xxhash

from gpufleet.runtime.checkpoint.errors import CorruptCheckpointError
from gpufleet.runtime.checkpoint.names import MAX_STEP, check_relpath

MANIFEST_NAME = "manifest.json"
FORMAT = "gpufleet-checkpoint/1"
CHECKSUM = "xxh3_128"
CHUNK_BYTES = 8 * 1024 * 1024
MAX_MANIFEST_BYTES = 32 * 1024 * 1024
"""Judgement call: a manifest entry is ~110 bytes, so this holds ~300,000 files (two shards per rank of a
100,000-rank job) plus user metadata; anything larger is not a manifest this code wrote."""
MAX_JSON_DEPTH = 64
"""Judgement call: the manifest itself nests 3 deep; the rest is room for user metadata (`save(metadata=…)`)."""

_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)  # possessive: no backtracking stack
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_BRACKET_STEP = np.zeros(256, dtype=np.int8)
_BRACKET_STEP[list(b"[{")] = 1
_BRACKET_STEP[list(b"]}")] = -1


def json_depth(data: bytes) -> int:
    """How deep `[` and `{` nest in the JSON text `data` (brackets inside strings ignored), without parsing it.

    Strings are cut out by one linear regular expression, what remains is reduced to its brackets, and the depth
    is the peak of their running sum: no recursion, so any nesting is measured in time linear in `len(data)`.
    """
    skeleton = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    if not skeleton:
        return 0
    running = np.cumsum(_BRACKET_STEP[np.frombuffer(skeleton, dtype=np.uint8)], dtype=np.int64)
    return int(running.max())


def loads_bounded(data: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads(data)` for untrusted text: ValueError when it nests deeper than `max_depth` (checked first)."""
    depth = json_depth(data)
    if depth > max_depth:
        raise ValueError(f"JSON nested {depth} levels deep, more than the {max_depth} allowed")
    return json.loads(data)


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
        """Parse and check a manifest; any damage raises CorruptCheckpointError naming `where`.

        Damage includes text too large or nested too deep, numbers out of range (`1e400`), and a field of the
        wrong type: every field is checked, none is coerced.
        """
        try:
            if len(data) > MAX_MANIFEST_BYTES:
                raise ValueError(f"more than {MAX_MANIFEST_BYTES} bytes")
            body = loads_bounded(data)
            if not isinstance(body, dict):
                raise ValueError(f"a JSON {type(body).__name__}, not an object")
            claimed = body.pop("manifest_checksum")
            if _digest_of(body) != claimed:
                raise CorruptCheckpointError(where, [f"{MANIFEST_NAME}: its own checksum does not match"])
            if body["format"] != FORMAT or body["checksum"] != CHECKSUM:
                raise CorruptCheckpointError(
                    where, [f"{MANIFEST_NAME}: format {body['format']!r}/{body['checksum']!r} is not {FORMAT}"]
                )
            return cls(
                step=_whole(body, "step", 0, MAX_STEP),
                world_size=_whole(body, "world_size", 1, None),
                files=_files(_object(body, "files")),
                framework=_object(body, "framework"),
                user=_object(body, "user"),
                created_unix_s=_finite(body, "created_unix_s"),
            )
        except CorruptCheckpointError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError) as error:
            raise CorruptCheckpointError(where, [f"{MANIFEST_NAME}: unreadable ({_short(error)})"]) from error


def _whole(body: dict[str, Any], key: str, low: int, high: int | None) -> int:
    """`body[key]`, which must be a JSON integer (not a float, not a bool) in [low, high]."""
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} is {_short(value)}, not a whole number")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{key} {_short(value)} is outside [{low}, {high if high is not None else '…'}]")
    return value


def _finite(body: dict[str, Any], key: str) -> float:
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} is {_short(value)}, not a finite number")
    return float(value)


def _object(body: dict[str, Any], key: str) -> dict[str, Any]:
    value = body[key]
    if not isinstance(value, dict):
        raise ValueError(f"{key} is a JSON {type(value).__name__}, not an object")
    return value


def _files(listed: dict[str, Any]) -> dict[str, FileEntry]:
    files = {}
    for name, entry in listed.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("checksum"), str):
            raise ValueError(f"files[{_short(name)}] is not a {{size_bytes, checksum}} record")
        files[check_relpath(name)] = FileEntry(_whole(entry, "size_bytes", 0, None), entry["checksum"])
    return files


def _short(value: object, limit: int = 80) -> str:
    """`repr`/`str` of something read from a damaged file, cut to `limit` characters for a one-line message."""
    text = str(value) if isinstance(value, BaseException) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


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
