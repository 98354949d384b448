"""Put emitted files in place atomically: written into a hidden sibling folder, flushed, then renamed."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from gpufleet.emit.spec import EmittedFile
from gpufleet.errors import InputError
from gpufleet.fsio import fsync_dir


def _check_paths(files: list[EmittedFile]) -> None:
    seen: set[str] = set()
    for item in files:
        path = Path(item.path)
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise InputError(f"an emitter wrote an unsafe path {item.path!r} (must be relative, inside the folder)")
        if item.path in seen:
            raise InputError(f"two launch targets write the same file {item.path!r}")
        seen.add(item.path)


def check_out_dir(out_dir: Path, force: bool) -> None:
    """Refuse a folder that holds files (without `force`), or a path that is not a folder."""
    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise InputError(f"--out {out_dir} exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise InputError(f"--out {out_dir} is not empty: choose an empty or new folder, or add --force to replace it")


def write_files(out_dir: Path, files: list[EmittedFile], force: bool = False) -> list[Path]:
    """Write `files` under `out_dir` so that it ends up holding exactly them, or (on any failure) is left as it was:
    never a partial folder. A non-empty `out_dir` is replaced only with `force`."""
    check_out_dir(out_dir, force)
    _check_paths(files)
    parent = out_dir.absolute().parent
    if not parent.is_dir():
        raise InputError(f"--out {out_dir}: its parent folder {parent} does not exist")
    staging = parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        staging.mkdir()
        for item in files:
            target = staging / item.path
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "w", encoding="utf-8") as handle:
                handle.write(item.text)
                handle.flush()
                os.fsync(handle.fileno())
            target.chmod(0o755 if item.executable else 0o644)
        fsync_dir(staging)
        _swap_in(staging, out_dir.absolute())
    except OSError as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise InputError(f"cannot write --out {out_dir}: {error.strerror or error}") from error
    return [out_dir / item.path for item in files]


def _swap_in(staging: Path, final: Path) -> None:
    """Rename `staging` to `final`; an existing `final` is renamed aside first and deleted only afterwards."""
    if not final.exists():
        os.rename(staging, final)
    else:
        old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(final, old)
        try:
            os.rename(staging, final)
        except OSError:
            os.rename(old, final)
            raise
        shutil.rmtree(old, ignore_errors=True)
    fsync_dir(final.parent)
