"""The burn-in under the emitted Slurm script on a real Slurm (slurmctld + slurmd per fake host, munge): 2 hosts x
2 workers, one torchrun per host with the static rendezvous the script sets up, gloo between all four ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from emit_specs import small_catalog, spec_from_plan
from gpufleet.emit import slurm
from gpufleet.planner.plan import PlanRequest
from slurm_cluster import Host, SlurmCluster, free_ports, missing_binaries

pytestmark = [pytest.mark.runtime, pytest.mark.slow,
              pytest.mark.skipif(bool(missing_binaries()),
                                 reason=f"Slurm/munge binaries missing: {', '.join(missing_binaries())} "
                                 "(apt-get install slurm-wlm munge; .ci/run does)")]

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = str(Path(sys.executable).parent)
STEPS = 4


@pytest.fixture(scope="module")
def slurm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm2"), [Host(f"node{k}", cpus=2, gpus=2) for k in (1, 2)])
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.timeout(300)
def test_emitted_sbatch_runs_the_burnin(slurm2: SlurmCluster, tmp_path: Path) -> None:
    log, checkpoints = tmp_path / "burnin.jsonl", tmp_path / "ckpt"
    train = ("-m", "gpufleet", "burnin", "--steps", str(STEPS), "--checkpoint-every", "2", "--checkpoint-dir",
             str(checkpoints), "--log-file", str(log), "--micro-batch", "2", "--seq-len", "32")
    request = PlanRequest(model="llama3-8b", gpus=4, node="test-2gpu", top=1, tokens=1e9)
    spec = spec_from_plan(request, small_catalog(tmp_path), train_command=train, checkpoint_dir=str(checkpoints))
    script = tmp_path / "job.sbatch"
    script.write_text(slurm.sbatch_script(spec))
    env = {**slurm2.env(VENV_BIN), "MASTER_PORT": str(free_ports(1)[0]), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)}
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], env=env, cwd=tmp_path, capture_output=True,
                               text=True, timeout=60, check=True)
    job = submitted.stdout.strip().split(";")[0]
    state = slurm2.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout_s=270)
    output = (tmp_path / f"gpufleet-{job}.out").read_text() if (tmp_path / f"gpufleet-{job}.out").exists() else ""
    assert state == "COMPLETED", output[-4000:] + slurm2.logs()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    assert all(line["tokens"] == 4 * 2 * 32 for line in lines)  # four ranks of 2 sequences of 32 tokens
    assert (checkpoints / "latest").read_text().strip().endswith(f"{STEPS:012d}")
