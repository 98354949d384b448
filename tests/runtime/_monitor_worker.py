"""One rank of a real torch.distributed (gloo) job under torchrun, for the monitoring tests.

    torchrun --nproc-per-node 4 _monitor_worker.py SCENARIO OUTDIR [SLOW_RANK]

slow: SLOW_RANK computes 3x longer each step and its (fake) GPU reports thermal throttling; every rank writes its
      scrape to OUTDIR/metrics-rankN.txt and rank 0 its straggler report to OUTDIR/report.json.
hang: SLOW_RANK stops before the all-reduce of step 5 (others block in it); every rank's watchdog must dump its
      stacks and exit 124. The hung rank notes when it stopped in OUTDIR/hang-started.json.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from gpufleet.runtime.monitor.exporter import scrape
from gpufleet.runtime.monitor.fake_nvml import FakeNvml
from gpufleet.runtime.monitor.nvml import NvmlReader
from gpufleet.runtime.monitor.step_monitor import StepMonitor

COMPUTE_S = 0.02
HANG_TIMEOUT_S = 3.0


def hang_forever(out: Path, rank: int) -> None:
    (out / "hang-started.json").write_text(json.dumps({"rank": rank, "unix_s": time.time()}))
    time.sleep(600)


def main() -> None:
    scenario, out, slow_rank = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    fake = FakeNvml(dist.get_world_size())
    fake.throttle(slow_rank, "hw_thermal")  # the same node view on every rank: the slow rank's GPU is hot
    monitor = StepMonitor(straggler_every=10, window=10, gpu_reader=NvmlReader(fake), gpu_index=rank,
                          hang_timeout_s=HANG_TIMEOUT_S if scenario == "hang" else None, stack_dir=out,
                          exit_on_hang=True, exit_grace_s=1.5)
    grad = torch.ones(1024)
    for step in range(1, 21):
        with monitor.step(tokens=4096):
            with monitor.compute():
                time.sleep(COMPUTE_S * (3 if scenario == "slow" and rank == slow_rank else 1))
            if scenario == "hang" and rank == slow_rank and step == 5:
                hang_forever(out, rank)
            dist.all_reduce(grad)
    (out / f"metrics-rank{rank}.txt").write_text(scrape(monitor.registry))
    if rank == 0 and monitor.last_report is not None:
        report = monitor.last_report
        (out / "report.json").write_text(json.dumps({"stragglers": list(report.stragglers),
                                                     "scores": list(report.scores), "hosts": monitor.hosts,
                                                     "slowed": [s.gpu_slowed for s in report.stats]}))
    monitor.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
