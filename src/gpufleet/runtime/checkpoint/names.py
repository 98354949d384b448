"""Checkpoint names and paths: one spelling, validated, never outside the root."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from gpufleet.runtime.checkpoint.errors import CheckpointNameError

STEP_DIGITS = 12
_STEP_DIR = re.compile(rf"^step_(\d{{{STEP_DIGITS}}})$")
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
SUPERSEDED_PREFIX = ".superseded-"
"""`.superseded-step_…-XXXXXXXX`: a whole checkpoint moved out of the way by `fsutil.replace_dir` while its new copy is
renamed in; restored by the next start when the new copy never arrived (`fsutil.superseded_copies`)."""
SET_ASIDE_MARK = ".set-aside-"
"""`step_….set-aside-XXXXXXXX`: something that stood where a checkpoint had to go, kept whole under a visible name
that no checkpoint code lists, loads, prunes or sweeps."""
LATEST_NAME = "latest"
MAX_STEP = 10**STEP_DIGITS - 1


def join(base: str, name: str) -> str:
    """`name` inside the checkpoint root or directory `base`, for local paths and store URLs alike."""
    return f"{base.rstrip('/')}/{name}"


def step_dirname(step: int) -> str:
    """The directory name of a committed checkpoint: `step_000000000100`."""
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise CheckpointNameError(f"checkpoint step must be an integer in [0, {MAX_STEP}], got {step!r}")
    return f"step_{step:0{STEP_DIGITS}d}"


def parse_step(name: str) -> int | None:
    """The step of a committed checkpoint directory name, or None for anything else."""
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def check_relpath(relpath: str) -> str:
    """A file path listed in a manifest: relative, POSIX, no `..`, no empty or hidden-parent parts."""
    if not relpath or "\\" in relpath or "\x00" in relpath:
        raise CheckpointNameError(f"bad file name in checkpoint: {relpath!r}")
    pure = PurePosixPath(relpath)
    if pure.is_absolute() or any(part in ("", ".", "..") for part in relpath.split("/")):
        raise CheckpointNameError(f"file name {relpath!r} would leave the checkpoint directory")
    return relpath


def inside(root: Path, relpath: str) -> Path:
    """`root / relpath`, refusing any path that resolves outside `root` (symlinks included)."""
    check_relpath(relpath)
    base = root.resolve()
    target = (base / relpath).resolve()
    if target != base and base not in target.parents:
        raise CheckpointNameError(f"{relpath!r} resolves outside {root}")
    return target
