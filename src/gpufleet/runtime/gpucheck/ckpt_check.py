"""The checkpoint step: a process saves device tensors (CUDA on a GPU, CPU on the dry path) with CheckpointManager
(DCP, asynchronous: staged to host memory, written in the background, committed by rename), is SIGKILLed while a
save is being written, and a fresh process loads the newest checkpoint onto the device and checks every byte."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from gpufleet.runtime.checkpoint.names import TMP_PREFIX
from gpufleet.runtime.gpucheck import proc
from gpufleet.runtime.gpucheck.machine import Context
from gpufleet.runtime.gpucheck.results import Outcome

#: state size per save: large enough that a write takes a while (so the kill lands in one), small enough to be quick
GPU_MIB, DRY_MIB = 1024, 24
WORKER = "gpufleet.runtime.gpucheck.ckpt_worker"


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def _durable(lines: list[str]) -> int | None:
    steps = [int(line.split()[1]) for line in lines if line.startswith("durable ") and line.split()[1].isdigit()]
    return max(steps) if steps else None


def kill_during_save(ctx: Context, root: Path, device: str, mib: int) -> tuple[int, int, bool]:
    """Start the saver; once a checkpoint is durable and the next one's write has begun, SIGKILL it. The newest step
    durable and the newest step announced at the kill, and whether a save's temporary folder was left behind."""
    saver = proc.start([sys.executable, "-m", WORKER, "save", str(root), device, str(mib)], root.parent, ctx.env,
                       "saver")

    def in_flight() -> bool:  # a checkpoint is durable, and a later one's temporary folder is being written
        lines = _lines(saver.out_path)
        durable = _durable(lines)
        saving = [int(line.split()[1]) for line in lines if line.startswith("saving ")]
        return (durable is not None and bool(saving) and saving[-1] > durable
                and any(entry.name.startswith(TMP_PREFIX) for entry in root.iterdir()))

    proc.wait_until(in_flight, saver, time.monotonic() + ctx.left_s() * 0.6, "a save in flight after a durable one")
    saver.stop()
    lines = _lines(saver.out_path)
    durable = _durable(lines)
    announced = max(int(line.split()[1]) for line in lines if line.startswith("saving "))
    left_tmp = any(entry.name.startswith(TMP_PREFIX) for entry in root.iterdir())
    return durable or 0, announced, left_tmp


def checkpoint_step(ctx: Context) -> Outcome:
    device, mib = ("cpu", DRY_MIB) if ctx.dry else ("cuda:0", GPU_MIB)
    work = ctx.work("checkpoint")
    root = work / "ckpt"
    durable, announced, left_tmp = kill_during_save(ctx, root, device, mib)
    done = proc.run([sys.executable, "-m", WORKER, "load", str(root), device, str(mib)], work, ctx.env, ctx.left_s(),
                    "loader")
    loaded = proc.json_document(done.stdout)
    numbers = {"device": device, "state_mib": mib, "durable_at_kill": durable, "saving_at_kill": announced,
               "temporary_folder_left_by_the_kill": left_tmp, **loaded}
    step = loaded.get("step")
    if step is None:
        return Outcome("fail", "no checkpoint loaded after the kill", numbers)
    if not loaded["same"]:
        return Outcome("fail", f"checkpoint {step} loaded but differs from what was saved", numbers)
    if not durable <= step <= announced:
        return Outcome("fail", f"loaded step {step}, outside durable {durable} .. in flight {announced}", numbers)
    where = "mid-write (its temporary folder was left)" if left_tmp else "after staging (the write had finished)"
    return Outcome("pass", f"killed {where} while saving {announced}; loaded step {step} onto {loaded.get('device')}, "
                   "every byte as saved", numbers)
