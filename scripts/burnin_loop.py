"""How well the loop closes on this machine, trial after trial, with or without neighbours: each trial runs
`torchrun -m gpufleet burnin --measure-host --json` (the test's small model, 2 gloo ranks, CPU clock by default) and
prints the run's own plan/burn-in comparison with the measured figures that moved.

    PYTHONPATH=src python scripts/burnin_loop.py --trials 5            # a quiet host
    PYTHONPATH=src python scripts/burnin_loop.py --trials 5 --load 3   # three busy neighbours (memory-bound loops)

`--load N` starts N processes that stream over 64 MiB arrays for the whole trial (stand-ins for the other jobs that
share a CI machine's cores, caches and memory bandwidth); `--bursty` makes them busy and idle by turns.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"layers": 2, "hidden": 384, "heads": 6, "ffn_hidden": 1536, "vocab": 1024, "seq_len": 128}
MICRO_BATCH, RANKS, STEPS = 4, 2, 24  # as tests/runtime/test_burnin.py measures


def _hog(bursty: bool, seed: int) -> None:  # pragma: no cover - runs in a child until killed
    import random
    import time

    import numpy as np

    a = np.ones(8 << 20)
    b = np.empty_like(a)
    pick = random.Random(seed)
    while True:
        busy_until = time.monotonic() + (pick.uniform(0.3, 3.0) if bursty else 1e9)
        while time.monotonic() < busy_until:
            np.multiply(a, 1.0001, out=b)
            np.add(b, 1.0, out=a)
        time.sleep(pick.uniform(0.3, 3.0))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def trial(folder: Path, extra: list[str], steps: int = STEPS, clock: str = "cpu") -> dict[str, object]:
    """One `burnin --measure-host --json` run; its own end-of-run comparison (`host.loop`) and measured figures."""
    from gpufleet.runtime.burnin.loop import LoopCheck

    flags = [f"--{name.replace('_', '-')}={value}" for name, value in SHAPE.items()]
    args = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(RANKS),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "-m", "gpufleet", "burnin",
            "--steps", str(steps), "--checkpoint-every", str(steps), "--checkpoint-dir", str(folder / "ckpt"),
            "--log-file", str(folder / "log.jsonl"), "--micro-batch", str(MICRO_BATCH), *flags,
            "--measure-host", str(folder / "host.yaml"), "--measure-clock", clock, "--json", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(done.stdout[-3000:] + done.stderr[-3000:])
    start = 0 if done.stdout.startswith("{") else done.stdout.index("\n{") + 1  # rank 0's document (the only one)
    report, _ = json.JSONDecoder().raw_decode(done.stdout[start:])
    loop, measured = report["host"]["loop"], report["host"]["measured"]
    check = LoopCheck(predicted_s=loop["predicted_step_s"], measured_s=loop["measured_step_s"],
                      parts_s=loop["parts_s"], clock=loop["clock"])
    return {"ratio": check.ratio, "summary": check.summary(),
            "fsdp_block_comm_ms": measured["fsdp_block_comm_s"] * 1e3,
            "optimizer_ns_per_param": (measured.get("optimizer_s_per_param") or 0) * 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steps", type=int, default=STEPS, help="burn-in steps per trial")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="what both sides are timed with (--measure-clock; the log's cpu_s or step_s)")
    parser.add_argument("--load", type=int, default=0, help="busy neighbour processes during every trial")
    parser.add_argument("--bursty", action="store_true", help="neighbours busy and idle by turns (0.3-3 s each)")
    parser.add_argument("--burnin-arg", action="append", default=[], help="an extra burn-in flag (repeatable)")
    args = parser.parse_args()
    hogs = [multiprocessing.Process(target=_hog, args=(args.bursty, seed), daemon=True)
            for seed in range(args.load)]
    for hog in hogs:
        hog.start()
    ratios = []
    try:
        for number in range(1, args.trials + 1):
            with tempfile.TemporaryDirectory() as folder:
                result = trial(Path(folder), args.burnin_arg, args.steps, args.clock)
            ratios.append(float(result["ratio"]))  # type: ignore[arg-type]
            print(f"trial {number}: {result['summary']}; FSDP2 per block {result['fsdp_block_comm_ms']:.2f} ms, "
                  f"optimizer {result['optimizer_ns_per_param']:.2f} ns/param", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
    print(f"plan/burn-in over {len(ratios)} trials with {args.load} busy neighbours: median "
          f"{statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()
