"""Whether a store still holds what it acknowledged: one fresh listing of a checkpoint's prefix, checked against the
sizes (and MD5 checksums, where the store reports one) of the files sent.

An object store may lose objects it acknowledged (a server restarted without its data, a bucket restored from an
older snapshot); the size check after each upload (`store.copy_file`) cannot see a loss that happens later. So the
copy lists the prefix once every data file is up and writes the manifest, the commit mark, only when the listing
shows every one of them whole (`store.copy_checkpoint`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpufleet.runtime.checkpoint.manifest import FileEntry

if TYPE_CHECKING:
    from gpufleet.runtime.checkpoint.remote import StoreFileSystem

_PLAIN_MD5 = re.compile(r"^[0-9a-f]{32}$")


def store_md5(entry: Mapping[str, Any]) -> str | None:
    """The MD5 of an object's bytes as the store's listing gives it, or None where it gives none: S3's ETag is the
    MD5 of the bytes for a single-part upload without SSE-KMS, but a multipart ETag (`…-N`) and other stores' tags
    are something else."""
    tag = str(entry.get("ETag") or entry.get("etag") or "").strip('"').lower()
    return tag if _PLAIN_MD5.match(tag) else None


def not_landed(fs: StoreFileSystem, prefix: str, files: Mapping[str, FileEntry],
               md5_by_name: Mapping[str, str]) -> dict[str, str]:
    """Which of `files` the store does not hold whole under `prefix`, by one fresh listing: name -> what is wrong
    (missing, another size, another MD5). Empty: every file is there at its size (and MD5, where both are known)."""
    fs.invalidate_cache()
    try:
        listed = fs.ls(prefix, detail=True)
    except FileNotFoundError:
        listed = []
    held = {str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]: entry for entry in listed}
    wrong: dict[str, str] = {}
    for name, expected in sorted(files.items()):
        entry = held.get(name)
        if entry is None:
            wrong[name] = "missing"
        elif int(entry.get("size") or 0) != expected.size_bytes:
            wrong[name] = f"{entry.get('size')} bytes, not {expected.size_bytes}"
        else:
            theirs, ours = store_md5(entry), md5_by_name.get(name)
            if theirs is not None and ours is not None and theirs != ours:
                wrong[name] = f"MD5 {theirs}, not {ours}"
    return wrong
