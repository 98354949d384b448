"""A small on-disk cache of derived data (the validated catalog, the command index), never trusted.

Each entry is one file under `$XDG_CACHE_HOME/gpufleet` (default `~/.cache/gpufleet`): a header line holding the
key it was built for and the SHA-256 of the payload, then the pickled payload. An entry is used only when its key
equals the key the caller computes now (from the contents of every input file, the gpufleet version and the
Python version) and its payload's hash matches; anything else (a missing, stale, truncated or corrupt file, one
that cannot be unpickled) is ignored and rebuilt. A stale entry is never even unpickled. Entries are written to a
temporary file in the same folder and renamed over the old one, so a reader sees a whole entry or the previous
one. A cache folder that cannot be written only costs speed. `GPUFLEET_NO_CACHE=1` turns the cache off.

Pickle runs code when it loads: the cache folder must be as private as the user's own Python packages (it is
the user's own cache folder, created with mode 0700).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpufleet import __version__
from gpufleet.fsio import read_regular_file

CACHE_HOME_ENV = "XDG_CACHE_HOME"
DISABLE_ENV = "GPUFLEET_NO_CACHE"
_MAGIC = b"gpufleet-cache-1"


def cache_dir() -> Path | None:
    """The folder gpufleet's cache entries live in (None when there is no home folder to put it in)."""
    home = os.environ.get(CACHE_HOME_ENV)
    if not home:
        try:
            home = str(Path.home() / ".cache")
        except (RuntimeError, KeyError):  # no $HOME and no passwd entry: run without a cache
            return None
    return Path(home) / "gpufleet"


def cache_enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "") in ("", "0") and cache_dir() is not None


def content_key(files: Iterable[Path], *parts: str) -> str:
    """A key that changes when any file's path or bytes change, or the gpufleet or Python version does."""
    digest = hashlib.sha256()
    for part in (__version__, sys.version, *parts):
        digest.update(part.encode() + b"\0")
    for path in files:
        digest.update(str(path).encode() + b"\0")
        digest.update(hashlib.sha256(_regular_file_bytes(path)).digest())
    return digest.hexdigest()


#: The largest input file a key is computed from; a bigger one is not cached (its reader refuses it anyway).
MAX_KEYED_BYTES = 64 * 2**20


def _regular_file_bytes(path: Path) -> bytes:
    """A regular file's bytes; OSError for anything else (fsio.read_regular_file: a named pipe is opened without
    blocking and never read, a device or a huge file is not read), so that the caller skips the cache and the
    file's own reader names the problem."""
    try:
        return read_regular_file(path, MAX_KEYED_BYTES)
    except ValueError as problem:  # a NUL in the name
        raise OSError(str(problem)) from None


def entry_path(name: str, *parts: str) -> Path:
    """The file of the entry `name` for `parts` (e.g. the user's catalog paths): one file per name and parts, so
    that a rebuilt entry replaces its stale one instead of piling up beside it."""
    tag = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return (cache_dir() or Path(os.devnull)) / f"{name}-{tag}.pickle"  # under /dev/null: never readable


def load(path: Path, key: str) -> Any | None:
    """The payload stored at `path` for `key`, or None when there is none that can be trusted."""
    if not cache_enabled():
        return None
    try:
        with path.open("rb") as file:
            header = file.readline().split()
            if len(header) != 3 or header[0] != _MAGIC or header[1].decode() != key:
                return None
            payload = file.read()
        if hashlib.sha256(payload).hexdigest() != header[2].decode():
            return None
        return pickle.loads(payload)
    except Exception:
        return None


def store(path: Path, key: str, value: Any) -> None:
    """Write the entry atomically (temporary file, rename); a folder that cannot be written is skipped."""
    if not cache_enabled():
        return
    try:
        payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        header = b" ".join([_MAGIC, key.encode(), hashlib.sha256(payload).hexdigest().encode()]) + b"\n"
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(header + payload)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        return
