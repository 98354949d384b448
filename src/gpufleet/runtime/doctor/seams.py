"""What a preflight check may look at: a sysfs root, a procfs root, the environment, a command runner and a disk
probe. Tests build a fake node by pointing these at a temporary tree and canned command output; nothing here ever
writes to the node (the one exception, the disk-speed probe, writes and removes a scratch file inside the folder the
user named, only when asked)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Status = Literal["ok", "warn", "fail", "skip"]
#: Seconds one probe command (nvidia-smi, timedatectl, ...) may take before it counts as hung (judgement: a
#: healthy nvidia-smi answers in well under a second; one stuck on a dead GPU hangs for minutes).
COMMAND_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True)
class CommandResult:
    """A probe command's outcome: `found` False when the program is not installed."""

    found: bool
    returncode: int = 0
    stdout: str = ""
    stderr: str = ""


CommandRunner = Callable[[Sequence[str]], CommandResult]


def run_command(argv: Sequence[str]) -> CommandResult:
    """Run a read-only query command; a missing program is `found=False`, a hung one returncode 124."""
    if shutil.which(argv[0]) is None:
        return CommandResult(found=False)
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return CommandResult(True, 124, "", f"{argv[0]} did not answer in {COMMAND_TIMEOUT_S:g} s")
    except OSError as error:
        return CommandResult(True, 126, "", str(error))
    return CommandResult(True, done.returncode, done.stdout, done.stderr)


@dataclass(frozen=True, slots=True)
class DiskUsage:
    total_bytes: int
    free_bytes: int


def disk_usage(path: Path) -> DiskUsage:
    usage = shutil.disk_usage(path)
    return DiskUsage(usage.total, usage.free)


@dataclass(frozen=True)
class NodeSeams:
    """Where the checks read from. The defaults are the real node."""

    sysfs_root: Path = Path("/sys")
    proc_root: Path = Path("/proc")
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    run: CommandRunner = run_command
    disk_usage: Callable[[Path], DiskUsage] = disk_usage

    def sys_path(self, *parts: str) -> Path:
        return self.sysfs_root.joinpath(*parts)

    def proc_path(self, *parts: str) -> Path:
        return self.proc_root.joinpath(*parts)


def read_text(path: Path) -> str | None:
    """A small sysfs/procfs file's text, stripped; None when it does not exist or cannot be read."""
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None
