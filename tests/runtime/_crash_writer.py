"""A writer for the crash-point test: saves a fixed sequence of checkpoints and SIGKILLs itself at its Nth file-system
operation, before that operation runs.

Run as `python _crash_writer.py`: a fork server with torch imported once. It reads `run ROOT LOG KILL_AT` lines (or
`open ROOT LOG KILL_AT`: the child only starts a CheckpointManager, the recovery, counting its operations) and
answers each with the exit status of a forked child that creates a CheckpointManager under ROOT, then saves SAVES in
order (each `blocking=True`) while counting every file-system operation that changes something: creating, opening
for writing, writing, fsyncing, renaming, replacing, unlinking a file or removing a folder. At operation KILL_AT
(0: never) the child writes `kill N KIND DETAIL` to LOG and sends itself SIGKILL, so no Python cleanup runs. After
each save returns (the checkpoint is durable) it writes `saved I` (I its index in SAVES); with KILL_AT 0 it also
writes `op N KIND DETAIL` for every operation, and `ops N` at the end.
"""

from __future__ import annotations

import builtins
import io
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SAVES: list[tuple[int, str]] = [(1, "a"), (2, "a"), (2, "b")]
"""(step, version): step 2 is saved twice, the second time with other values (a re-save of an existing step)."""
KEEP_LAST = 1
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def state_of(step: int, version: str) -> dict[str, Any]:
    """A state dict whose every value is a function of (step, version), so a load can be checked exactly."""
    gen = torch.Generator().manual_seed(step * 1000 + ord(version))
    return {"model": {"w": torch.randn(128, 64, generator=gen), "b": torch.full((100,), float(step))},
            "step": step, "version": version}


class OpCounter:
    """Wraps the `os`, `io` and `builtins` functions that change a file system; calls `on_op(kind, detail)` first."""

    def __init__(self, on_op: Callable[[str, str], None], log_fd: int) -> None:
        self.on_op = on_op
        self.log_fd = log_fd
        self.lock = threading.Lock()

    def install(self) -> None:
        for name in ("mkdir", "rename", "replace", "unlink", "rmdir", "fsync", "ftruncate", "truncate"):
            setattr(os, name, self._counted(name, getattr(os, name)))
        real_write, real_os_open, real_open = os.write, os.open, io.open

        def write(fd: int, data: Any) -> int:
            if fd != self.log_fd:
                self.on_op("write", f"fd {fd}, {len(data)} bytes")
            return real_write(fd, data)

        def os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if flags & WRITE_FLAGS:
                self.on_op("open-for-write", str(path))
            return real_os_open(path, flags, *args, **kwargs)

        def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if any(c in mode for c in "wax+"):
                self.on_op("open-for-write", str(file))
            return real_open(file, mode, *args, **kwargs)

        os.write, os.open = write, os_open
        builtins.open = io.open = open_

    def _counted(self, kind: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.on_op(kind, " ".join(Path(str(a)).name for a in args if isinstance(a, str | os.PathLike)))
            return real(*args, **kwargs)

        return counted


def run_child(root: str, log_path: str, kill_at: int, *, only_open: bool = False) -> None:
    from gpufleet.runtime.checkpoint import CheckpointManager

    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    seen = [0]
    lock = threading.Lock()

    def say(line: str) -> None:
        os.write(log_fd, f"{line}\n".encode())

    def on_op(kind: str, detail: str) -> None:
        with lock:
            seen[0] += 1
            number = seen[0]
        if number == kill_at:
            say(f"kill {number} {kind} {detail}")
            os.kill(os.getpid(), signal.SIGKILL)
        elif kill_at == 0:
            say(f"op {number} {kind} {detail}")

    if only_open:
        OpCounter(on_op, log_fd).install()
        CheckpointManager(root, keep_last=KEEP_LAST)
        say(f"ops {seen[0]}")
        return
    manager = CheckpointManager(root, keep_last=KEEP_LAST)
    OpCounter(on_op, log_fd).install()
    for index, (step, version) in enumerate(SAVES):
        say(f"saving {index}")
        manager.save(state_of(step, version), step, blocking=True)
        say(f"saved {index}")
    say(f"ops {seen[0]}")


def main() -> None:
    torch.set_num_threads(1)
    import gpufleet.runtime.checkpoint.dcp_io
    import gpufleet.runtime.checkpoint.manager
    import gpufleet.runtime.checkpoint.staging  # noqa: F401

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        command, root, log_path, kill_at = line.split()
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                run_child(root, log_path, int(kill_at), only_open=command == "open")
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        sys.stdout.write(f"{status}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
