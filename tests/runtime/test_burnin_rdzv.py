"""A group restarted by torchrun under --standalone forms again with the burn-in's join_group.

With a plain `init_process_group("gloo")`, the restarted workers read the killed round's gloo addresses from the
agent's store and fail with "Connection refused" (2 of 3 trials on the CI machine, 2026-12-01); join_group's
per-round key prefix and coordinated retries make the second round meet (3 of 3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.runtime, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
WORKER = """\
import os, signal, torch, torch.distributed as dist
from gpufleet.runtime.burnin.config import identity_from_env
from gpufleet.runtime.burnin.group import join_group

me = identity_from_env()
join_group(me, "gloo")
value = torch.ones(1)
dist.all_reduce(value)
print(f"round {me.restart} rank {me.rank} sum {value.item():g}", flush=True)
if me.restart == 0 and me.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # the group dies right after it formed
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.timeout(200)
def test_group_killed_under_standalone_meets_again(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "--max-restarts", "1", "--monitor-interval", "0.2", str(script)],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "round 1 rank 0 sum 2" in out and "round 1 rank 1 sum 2" in out, out[-4000:]
