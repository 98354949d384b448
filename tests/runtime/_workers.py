"""Child processes for the fault tests: a fork server for SIGKILL trials and torch.distributed ranks.

Run as `python _workers.py zygote` (reads `fork ROOT LOG` lines, answers with child pids, `reap PID`
answers the exit status), `python _workers.py rank SCENARIO ROOT` with RANK/WORLD_SIZE/MASTER_* set, or
`python _workers.py resume ROOT NEXT_STEP [EIO_PATH]`: a fresh process that resumes from ROOT, saves NEXT_STEP and
prints what happened as one JSON line (with EIO_PATH, every read of that file fails with EIO, as a bad sector
would).
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch


def expected_state(step: int) -> dict[str, Any]:
    """A state dict whose every byte is a function of `step`, so a load can be checked exactly."""
    gen = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(384, 384, generator=gen), "b": torch.full((1000,), float(step))},
        "optim": {"m": torch.randn(256, 256, generator=gen).to(torch.bfloat16), "count": torch.tensor(step)},
        "step": step,
        "meta": {"name": f"step-{step}", "lr": 0.5 / (step + 1)},
    }


def flip_bit(path: Path, offset: int) -> None:
    """Damage one byte of a file in place, keeping its size (what a checksum, not a size check, catches)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def same_state(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def save_loop(root: str, log_path: str) -> None:
    """Resume from the newest checkpoint, then save forever, logging each step made durable."""
    from gpufleet.runtime.checkpoint import CheckpointManager

    log = open(log_path, "a", buffering=1)  # noqa: SIM115 (held until SIGKILL)
    manager = CheckpointManager(root, keep_last=2)
    found = manager.load_latest()
    if found is not None and not same_state(found[1], expected_state(found[0])):
        log.write(f"BAD resume {found[0]}\n")
    step = 0 if found is None else found[0] + 1
    durable = None
    while True:
        state = expected_state(step)
        manager.save(state, step)
        state["model"]["w"].add_(1.0)  # training goes on while the save is written
        state["optim"]["count"].fill_(-1)
        if manager.last_committed_step != durable:
            durable = manager.last_committed_step
            log.write(f"durable {durable}\n")
        step += 1


def zygote() -> None:
    torch.set_num_threads(1)
    import gpufleet.runtime.checkpoint.dcp_io
    import gpufleet.runtime.checkpoint.manager
    import gpufleet.runtime.checkpoint.staging  # noqa: F401

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        words = line.split()
        if words[0] == "fork":
            pid = os.fork()
            if pid == 0:
                try:
                    save_loop(words[1], words[2])
                finally:
                    os._exit(3)
            sys.stdout.write(f"{pid}\n")
        elif words[0] == "reap":
            _, status = os.waitpid(int(words[1]), 0)
            sys.stdout.write(f"{status}\n")
        sys.stdout.flush()


def rank_main(scenario: str, root: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from gpufleet.runtime.checkpoint import CheckpointError, CheckpointManager

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))

    def global_w(step: int) -> torch.Tensor:
        return torch.arange(48 * 8, dtype=torch.float32).reshape(48, 8) + 1000 * step

    def state(step: int, w: torch.Tensor | None = None) -> dict[str, Any]:
        full = global_w(step) if w is None else w
        return {"w": distribute_tensor(full, mesh, [Shard(0)]), "bias": torch.full((4,), float(step)),
                "step": step}

    if scenario == "save":
        manager = CheckpointManager(root, keep_last=5)
        for step in (1, 2, 3):
            current = state(step)
            manager.save(current, step)
            current["w"].to_local().add_(7.0)  # mutate after save returns: the checkpoint must not see it
        manager.close()
        print(f"rank {rank} committed {manager.last_committed_step}", flush=True)
    elif scenario == "load":
        manager = CheckpointManager(root)
        template = state(0, torch.zeros(48, 8))
        found = manager.load_latest(template)
        assert found is not None
        step, loaded = found
        rows = 48 // world
        want = global_w(step)[rank * rows:(rank + 1) * rows]
        if not torch.equal(loaded["w"].to_local(), want) or loaded["step"] != step:
            raise SystemExit(f"rank {rank}: wrong shard after resharding load")
        print(f"rank {rank} loaded {step}", flush=True)
    elif scenario == "fail":
        manager = CheckpointManager(root, keep_last=5)
        manager.save(state(1), 1, blocking=True)
        from torch.distributed.checkpoint.filesystem import _FileSystemWriter

        real_write = _FileSystemWriter.write_data
        if rank == world - 1:  # the disk of one rank fills up inside DCP's own write
            def failing(*args: Any, **kwargs: Any) -> Any:
                raise OSError(errno.ENOSPC, "No space left on device (injected on the last rank)")
            _FileSystemWriter.write_data = failing  # type: ignore[method-assign]
        manager.save(state(2), 2)
        try:
            manager.wait()
            raise SystemExit(f"rank {rank}: a failed rank did not fail the save")
        except CheckpointError as error:
            print(f"rank {rank} saw failure: {error}", flush=True)
        _FileSystemWriter.write_data = real_write  # type: ignore[method-assign]
        manager.save(state(3), 3, blocking=True)
        manager.close()
        print(f"rank {rank} steps {manager.steps()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


class _BadSector(io.FileIO):
    """A file whose every read fails with EIO, as one on a bad sector does."""

    def readinto(self, buffer: Any) -> int:
        raise OSError(errno.EIO, os.strerror(errno.EIO), self.name)

    def readall(self) -> bytes:
        raise OSError(errno.EIO, os.strerror(errno.EIO), self.name)


def fail_reads_of(target: str) -> None:
    """From now on, every read of the file at `target` (opened by path or by descriptor) fails with EIO."""
    import builtins

    real_open = builtins.open

    def open_(file: Any, mode: str = "r", buffering: int = -1, *args: Any, **kwargs: Any) -> Any:
        path = os.readlink(f"/proc/self/fd/{file}") if isinstance(file, int) else os.fspath(file)
        if os.path.abspath(path) != os.path.abspath(target) or "r" not in mode or "b" not in mode:
            return real_open(file, mode, buffering, *args, **kwargs)
        raw = _BadSector(file, "rb", closefd=kwargs.get("closefd", True))
        return raw if buffering == 0 else io.BufferedReader(raw)

    builtins.open = open_


def resume(root: str, next_step: int, eio_path: str | None) -> None:
    """Resume from `root` in this fresh process, then save `next_step`; print the outcome as one JSON line."""
    from gpufleet.runtime.checkpoint import CheckpointManager

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("gpufleet").addHandler(Keep())
    if eio_path:
        fail_reads_of(eio_path)
    manager = CheckpointManager(root, keep_last=2)
    found = manager.load_latest()
    outcome: dict[str, Any] = {"loaded": None if found is None else found[0],
                               "exact": found is not None and same_state(found[1], expected_state(found[0]))}
    try:
        manager.save(expected_state(next_step), next_step, blocking=True)
        outcome["save_error"] = None
    except Exception as error:
        outcome["save_error"] = f"{type(error).__name__}: {error}"
    manager.close()
    outcome["steps"] = manager.steps()
    outcome["log"] = records
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "zygote":
        zygote()
    elif sys.argv[1] == "resume":
        resume(sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
    else:
        rank_main(sys.argv[2], sys.argv[3])
