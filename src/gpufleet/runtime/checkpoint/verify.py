"""Verification of a checkpoint directory on any fsspec file system (local disk or object store)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufleet.runtime.checkpoint.errors import CheckpointNameError, CorruptCheckpointError
from gpufleet.runtime.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, hash_stream
from gpufleet.runtime.checkpoint.names import join

NOT_A_FOLDER = "not a checkpoint folder"  # a file, a broken link, a device: said alike


@dataclass
class VerifyReport:
    """The outcome of checking one checkpoint: `problems` names each bad file and why."""

    where: str
    manifest: Manifest | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.manifest is not None and not self.problems


def read_manifest(fs: Any, path: str) -> Manifest:
    """The manifest of the checkpoint at `path`; CorruptCheckpointError if missing or damaged."""
    target = join(path, MANIFEST_NAME)
    try:
        with fs.open(target, "rb") as handle:
            data = handle.read()
    except FileNotFoundError as error:
        raise CorruptCheckpointError(path, [f"{MANIFEST_NAME}: missing (the save never committed)"]) from error
    except NotADirectoryError as error:
        raise CorruptCheckpointError(path, [f"{path} is {NOT_A_FOLDER}"]) from error
    return Manifest.from_json(data, path)


def _relative_entries(fs: Any, path: str) -> dict[str, dict[str, Any]]:
    """Every file and folder under `path`, by its name relative to `path`, from one listing (no request per file)."""
    base = fs._strip_protocol(path).rstrip("/") + "/"
    entries = {}
    for found, info in fs.find(path, withdirs=True, detail=True).items():
        stripped = fs._strip_protocol(found)
        if stripped.startswith(base):
            entries[stripped[len(base):]] = info
    return entries


def _relative_listing(fs: Any, path: str) -> dict[str, int]:
    """Every file under `path` with its size in bytes."""
    return {name: int(info["size"]) for name, info in _relative_entries(fs, path).items()
            if info["type"] != "directory"}


def _same_bytes(fs: Any, file_path: str, entry: FileEntry) -> bool:
    """Whether the file at `file_path` hashes to `entry`'s checksum (every byte read)."""
    with fs.open(file_path, "rb") as handle:
        return hash_stream(handle).checksum == entry.checksum


def foreign_files(fs: Any, path: str, manifest: Manifest, *, check_bytes: bool) -> list[str]:
    """What under the folder `path` is not one of `manifest`'s files: what replacing the folder by that checkpoint
    would lose.

    A name the manifest does not list (a file, or a folder `name/` that holds none of its files) is foreign; with
    `check_bytes`, so is a file it lists whose size or checksum differs. Files the manifest lists that are absent
    do not count (an interrupted copy lacks them), nor does a `manifest.json` (the caller compares it).
    """
    listed_folders = {"/".join(name.split("/")[:depth]) for name in manifest.files
                      for depth in range(1, name.count("/") + 1)}
    foreign = []
    for name, info in sorted(_relative_entries(fs, path).items()):
        if info["type"] == "directory":
            if name not in listed_folders:
                foreign.append(f"{name}/")
            continue
        entry = manifest.files.get(name)
        if name == MANIFEST_NAME or (entry is not None and not check_bytes):
            continue
        if entry is None or int(info["size"]) != entry.size_bytes or not _same_bytes(fs, join(path, name), entry):
            foreign.append(name)
    return foreign


def verify_checkpoint(fs: Any, path: str, *, checksums: bool = True) -> VerifyReport:
    """Check the manifest, then every file's presence, size and (optionally) checksum."""
    report = VerifyReport(where=path)
    try:
        manifest = read_manifest(fs, path)
    except (CorruptCheckpointError, CheckpointNameError) as error:
        report.problems.extend(getattr(error, "problems", [str(error)]))
        return report
    report.manifest = manifest
    present = _relative_listing(fs, path)
    for name, entry in sorted(manifest.files.items()):
        if name not in present:
            report.problems.append(f"{name}: missing")
            continue
        size = present[name]
        if size != entry.size_bytes:
            report.problems.append(f"{name}: size {size} bytes, manifest says {entry.size_bytes}")
            continue
        if checksums and not _same_bytes(fs, join(path, name), entry):
            report.problems.append(f"{name}: checksum mismatch (bit rot or a partial overwrite)")
    for extra in sorted(set(present) - set(manifest.files) - {MANIFEST_NAME}):
        report.problems.append(f"{extra}: not listed in the manifest")
    return report


def check_complete(fs: Any, path: str) -> VerifyReport:
    """Whether the checkpoint at `path` is complete: the one definition `list`, `prune`, copies and retention use.

    Complete means the manifest is present and intact (it carries its own checksum) and names exactly the
    files that are there, each with the size it lists. No data is read: a flipped bit inside a data file
    is found only by `verify_checkpoint` with checksums.
    """
    return verify_checkpoint(fs, path, checksums=False)
