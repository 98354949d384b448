"""Run `gpufleet` under a real torchrun (gloo on CPU), as a user launches it on a cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from _net import free_port

# tests/clirun.py (the CLI runner every CLI test shares) lives one folder up: importable however pytest is started
if str(Path(__file__).parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parents[1]))


def torchrun_gpufleet(nproc: int, *args: str, timeout_s: float = 240, env: dict[str, str] | None = None
                      ) -> subprocess.CompletedProcess[str]:
    """`torchrun --nproc-per-node N -m gpufleet ARGS` on 127.0.0.1 (an explicit free port, not --standalone's
    c10d rendezvous, so parallel test runs never share one)."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "160", **(env or {})}
    environment.pop("GPUFLEET_CATALOG", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "gpufleet", *args]
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=timeout_s, check=False)
