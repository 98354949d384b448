"""Verification of a checkpoint directory on any fsspec file system (local disk or object store).

Damage is per checkpoint: whatever goes wrong while one checkpoint's manifest or files are read (a permission
refused, a folder where a file belongs, an I/O error, a manifest too large, nested too deep or out of range, a
manifest of another step) is reported as a problem of that checkpoint, so callers skip it and go on. Only a store
that does not answer (`reach.is_unreachable`) is raised, since it says nothing about the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufleet.runtime.checkpoint.errors import CheckpointNameError, CorruptCheckpointError
from gpufleet.runtime.checkpoint.fsutil import is_local, read_small_file
from gpufleet.runtime.checkpoint.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    FileEntry,
    Manifest,
    hash_stream,
)
from gpufleet.runtime.checkpoint.names import join, parse_step, step_dirname
from gpufleet.runtime.checkpoint.reach import is_unreachable

if TYPE_CHECKING:
    from gpufleet.runtime.checkpoint.remote import StoreFileSystem

NOT_A_FOLDER = "not a checkpoint folder"  # a file, a broken link, a device: said alike
READ_ERRORS = (OSError, RecursionError, ValueError)
"""What reading one checkpoint may raise that is about that checkpoint (RecursionError: a folder nested absurdly
deep); `is_unreachable` ones excepted."""


@dataclass
class VerifyReport:
    """The outcome of checking one checkpoint: `problems` names each bad file and why."""

    where: str
    manifest: Manifest | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.manifest is not None and not self.problems


def folder_step(path: str) -> int | None:
    """The step a checkpoint folder's name says (`…/step_000000000042` -> 42), None for any other name."""
    return parse_step(path.rstrip("/").rsplit("/", 1)[-1])


def _manifest_bytes(fs: StoreFileSystem, target: str) -> bytes:
    """The manifest file's bytes: a regular file of at most MAX_MANIFEST_BYTES, checked before it is read."""
    if is_local(fs):
        return read_small_file(fs._strip_protocol(target), MAX_MANIFEST_BYTES)
    info = fs.info(target)
    if info.get("type") != "file":
        raise IsADirectoryError(21, "is a folder, not a file", target)
    if int(info.get("size") or 0) > MAX_MANIFEST_BYTES:
        raise ValueError(f"{target} is {info['size']} bytes, more than the {MAX_MANIFEST_BYTES} allowed")
    with fs.open(target, "rb") as handle:
        data: bytes = handle.read(MAX_MANIFEST_BYTES + 1)
    return data


def read_manifest(fs: StoreFileSystem, path: str, *, step: int | None = None) -> Manifest:
    """The manifest of the checkpoint at `path`; CorruptCheckpointError if missing, unreadable or damaged.

    The manifest must be of `step`, by default the step the folder's name says (when it is named like one): a
    folder renamed or copied to another step's name is not a checkpoint of that step. Any error reading it is
    reported as this checkpoint's damage, except a store that does not answer (raised as it is).
    """
    target = join(path, MANIFEST_NAME)
    try:
        data = _manifest_bytes(fs, target)
    except FileNotFoundError as error:
        raise CorruptCheckpointError(path, [f"{MANIFEST_NAME}: missing (not a committed checkpoint: a save or copy "
                                            f"that did not finish, or a deletion cut off)"]) from error
    except NotADirectoryError as error:
        raise CorruptCheckpointError(path, [f"{path} is {NOT_A_FOLDER}"]) from error
    except READ_ERRORS as error:
        if is_unreachable(error):
            raise
        raise CorruptCheckpointError(path, [f"{MANIFEST_NAME}: cannot be read ({describe(error)})"]) from error
    manifest = Manifest.from_json(data, path)
    expected = folder_step(path) if step is None else step
    if expected is not None and manifest.step != expected:
        raise CorruptCheckpointError(path, [
            f"{MANIFEST_NAME}: is the manifest of step {manifest.step}, but this is {step_dirname(expected)} "
            f"(a folder renamed or copied from another step is not a checkpoint of this one)"])
    return manifest


def describe(error: BaseException) -> str:
    """An error as a short phrase for one line: `Permission denied`, `Input/output error`, `is a folder…`."""
    if isinstance(error, OSError) and error.strerror:
        return str(error.strerror)
    if isinstance(error, RecursionError):
        return "nested too deep to walk"
    text = str(error) or type(error).__name__
    return text if len(text) <= 160 else f"{text[:160]}…"


def _relative_entries(fs: StoreFileSystem, path: str) -> dict[str, dict[str, Any]]:
    """Every file and folder under `path`, by its name relative to `path`, from one listing (no request per file)."""
    base = fs._strip_protocol(path).rstrip("/") + "/"
    entries = {}
    for found, info in fs.find(path, withdirs=True, detail=True).items():
        stripped = fs._strip_protocol(found)
        if stripped.startswith(base):
            entries[stripped[len(base):]] = info
    return entries


def _relative_listing(fs: StoreFileSystem, path: str) -> dict[str, int]:
    """Every file under `path` with its size in bytes."""
    return {name: int(info["size"]) for name, info in _relative_entries(fs, path).items()
            if info["type"] != "directory"}


def _same_bytes(fs: StoreFileSystem, file_path: str, entry: FileEntry) -> bool:
    """Whether the file at `file_path` hashes to `entry`'s checksum (every byte read)."""
    with fs.open(file_path, "rb") as handle:
        return hash_stream(handle).checksum == entry.checksum


def foreign_files(fs: StoreFileSystem, path: str, manifest: Manifest, *, check_bytes: bool) -> list[str]:
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


def verify_checkpoint(fs: StoreFileSystem, path: str, *, checksums: bool = True,
                      step: int | None = None) -> VerifyReport:
    """Check the manifest (of `step`: see `read_manifest`), then every file's presence, size and (optionally)
    checksum. Never raises for what is found under `path`: every problem is in the report (see the module
    docstring); only a store that does not answer is raised."""
    report = VerifyReport(where=path)
    try:
        manifest = read_manifest(fs, path, step=step)
    except (CorruptCheckpointError, CheckpointNameError) as error:
        report.problems.extend(getattr(error, "problems", [str(error)]))
        return report
    report.manifest = manifest
    try:
        _check_files(fs, path, manifest, report, checksums=checksums)
    except READ_ERRORS as error:  # the folder could not be listed
        if is_unreachable(error):
            raise
        report.problems.append(f"{_inside_name(path, error)}: cannot be read ({describe(error)})")
    return report


def _inside_name(path: str, error: BaseException) -> str:
    """The name, relative to the checkpoint `path`, of what `error` is about (`.` for the folder itself)."""
    filename = str(getattr(error, "filename", None) or "")
    base = path.rstrip("/") + "/"
    return filename[len(base):] if filename.startswith(base) else "."


def _check_files(fs: StoreFileSystem, path: str, manifest: Manifest, report: VerifyReport, *, checksums: bool) -> None:
    """Add to `report` each file of `manifest` missing under `path`, of another size or (with `checksums`) other
    bytes, and each file there that it does not list."""
    present = _relative_listing(fs, path)
    for name, entry in sorted(manifest.files.items()):
        if name not in present:
            report.problems.append(f"{name}: missing")
            continue
        size = present[name]
        if size != entry.size_bytes:
            report.problems.append(f"{name}: size {size} bytes, manifest says {entry.size_bytes}")
            continue
        if not checksums:
            continue
        try:
            same = _same_bytes(fs, join(path, name), entry)
        except READ_ERRORS as error:  # this file only: the others are still checked
            if is_unreachable(error):
                raise
            report.problems.append(f"{name}: cannot be read ({describe(error)})")
            continue
        if not same:
            report.problems.append(f"{name}: checksum mismatch (bit rot or a partial overwrite)")
    for extra in sorted(set(present) - set(manifest.files) - {MANIFEST_NAME}):
        report.problems.append(f"{extra}: not listed in the manifest")


def check_complete(fs: StoreFileSystem, path: str, *, step: int | None = None) -> VerifyReport:
    """Whether the checkpoint at `path` is complete: the one definition `list`, `prune`, copies and retention use.

    Complete means the manifest is present and intact (it carries its own checksum) and names exactly the
    files that are there, each with the size it lists. No data is read: a flipped bit inside a data file
    is found only by `verify_checkpoint` with checksums.
    """
    return verify_checkpoint(fs, path, checksums=False, step=step)
