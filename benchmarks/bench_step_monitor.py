"""StepMonitor overhead: what `with monitor.step(): with monitor.compute(): ...` costs per step, the straggler
exchange over a real gloo process group included, as a fraction of a 100 ms training step.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_step_monitor.py [--ranks 4] [--steps 2000] [--every 50]

Spawns `--ranks` processes joined by torch.distributed (gloo, 127.0.0.1). Each runs `--steps` steps whose body is
empty, so the whole loop time is the monitor's cost: timing, counters, the histogram, the watchdog beat, the window
medians and, every `--every` steps, the straggler all_gather (including waiting for the other ranks there; also
with one fake GPU read per exchange). Prints `name=value` lines: overhead_per_step_s (the slowest rank) and
overhead_fraction_of_100ms_step (target < 0.005).
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time

import torch.distributed as dist
import torch.multiprocessing as mp

STEP_S = 0.100
TARGET_FRACTION = 0.005


def _rank(rank: int, world: int, port: int, steps: int, every: int, results: dict[int, float]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from gpufleet.runtime.monitor.fake_nvml import FakeNvml
    from gpufleet.runtime.monitor.nvml import NvmlReader
    from gpufleet.runtime.monitor.step_monitor import StepMonitor

    with tempfile.TemporaryDirectory() as stacks:
        monitor = StepMonitor(rank=rank, local_rank=rank, world_size=world, straggler_every=every, window=every,
                              gpu_reader=NvmlReader(FakeNvml(world)), hang_timeout_s=600, stack_dir=stacks)
        for _ in range(every):  # warm-up: the first exchange gathers host names once
            with monitor.step(tokens=4096), monitor.compute():
                pass
        dist.barrier()
        started = time.perf_counter()
        for _ in range(steps):
            with monitor.step(tokens=4096), monitor.compute():
                pass
        results[rank] = (time.perf_counter() - started) / steps
        monitor.close()
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=50, help="straggler exchange every N steps (StepMonitor default)")
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_rank, args=(args.ranks, port, args.steps, args.every, results), nprocs=args.ranks, join=True)
    worst = max(results.values())
    print(f"ranks={args.ranks}")
    print(f"steps={args.steps}")
    print(f"exchange_every_steps={args.every}")
    print(f"overhead_per_step_s={worst:.7f}")
    print(f"overhead_fraction_of_100ms_step={worst / STEP_S:.5f}")
    print(f"target_fraction={TARGET_FRACTION}")
    print(f"meets_target={worst / STEP_S < TARGET_FRACTION}")


if __name__ == "__main__":
    main()
