"""The burn-in under the emitted Slurm script on a real Slurm (slurmctld + slurmd per fake host, munge): 2 hosts x
2 workers, one torchrun per host with the static rendezvous the script sets up, gloo between all four ranks; and
the save-and-requeue cycle at a real time limit: Slurm signals the batch shell, the burn-in saves and exits, the job
is requeued and its next allocation resumes from that checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
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


#: Credential lifetime of the test Slurm: a requeued job waits this + 1 s before it may start again (Slurm's default
#: is 120 s, which would make the requeue test wait two minutes for nothing).
CRED_EXPIRE_S = 15


@pytest.fixture(scope="module")
def slurm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm2"), [Host(f"node{k}", cpus=2, gpus=2) for k in (1, 2)],
                           cred_expire_s=CRED_EXPIRE_S)
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


#: The time limit and signal lead the requeue test submits with (sbatch's options override the script's #SBATCH
#: lines): Slurm's shortest limit, 1 minute. slurmctld looks at time limits every 30 s (PERIODIC_TIMEOUT) and
#: signals at the first look within lead + 30 s of the limit, so the signal comes 30 - LEAD_S to 60 - LEAD_S s after
#: the start, and at least 30 s before the look that would end the job.
TIME_LIMIT_MIN, LEAD_S = 1, 5


def _log(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.timeout(300)
def test_time_limit_signal_saves_requeues_and_resumes(slurm2: SlurmCluster, tmp_path: Path) -> None:
    """The emitted job.sbatch at a 1-minute limit with the burn-in as its trainer: Slurm signals the batch shell
    (B:USR1), the shell passes SIGUSR1 to the step, the burn-in's four ranks agree on a step, save it and exit 0,
    the shell requeues the job, and the second allocation resumes from that very checkpoint (the only one: the
    periodic interval is never reached). Fails with the burn-in before it handled SIGUSR1 (the signal ended it: no
    checkpoint, the next allocation started fresh). The burn-in installs its own handler, so it would also save under
    the earlier script's inherited `trap "" USR1`; tests/test_emit_slurm.py checks that a trainer without a handler
    no longer starts with the signal ignored."""
    log, checkpoints, folder = tmp_path / "burnin.jsonl", tmp_path / "ckpt", tmp_path / "run"
    train = ("-m", "gpufleet", "burnin", "--steps", "1000000", "--checkpoint-every", "1000000", "--checkpoint-dir",
             str(checkpoints), "--log-file", str(log), "--micro-batch", "1", "--seq-len", "16")
    request = PlanRequest(model="llama3-8b", gpus=4, node="test-2gpu", top=1, tokens=1e9)
    spec = spec_from_plan(request, small_catalog(tmp_path), train_command=train, checkpoint_dir=str(checkpoints))
    folder.mkdir()
    script = folder / "job.sbatch"
    script.write_text(slurm.sbatch_script(spec))
    env = {**slurm2.env(VENV_BIN), "MASTER_PORT": str(free_ports(1)[0]), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)}
    began = time.monotonic()
    submitted = subprocess.run(["sbatch", "--parsable", f"--time={TIME_LIMIT_MIN}",
                                f"--signal=B:{slurm.TIME_LIMIT_SIGNAL}@{LEAD_S}", str(script)], env=env, cwd=tmp_path,
                               capture_output=True, text=True, timeout=60, check=True)
    job = submitted.stdout.strip().split(";")[0]
    output = tmp_path / f"gpufleet-{job}.out"
    seen: dict[str, float] = {}  # event -> seconds after submission, for the timings printed below

    def job_output() -> str:
        return output.read_text(errors="replace") if output.exists() else ""

    def at(event: str) -> None:
        seen.setdefault(event, time.monotonic() - began)

    try:
        deadline = began + 240
        resumed: list[dict[str, object]] = []
        while not resumed:
            assert time.monotonic() < deadline, f"no resumed step after 240 s: {seen}\n{job_output()[-3000:]}"
            state = slurm2.job_field(job, "JobState")
            assert state in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING"), \
                f"job {job} is {state}: {seen}\n{job_output()[-4000:]}\n{slurm2.logs()}"
            lines = _log(log)
            if lines:
                at("first step")
            if "the time limit is near" in job_output():
                at("signal")
            if int(slurm2.job_field(job, "Restarts") or 0) >= 1 and "requeued" not in seen:
                at("requeued")  # the first allocation's output and checkpoint, before the second one starts
                first_output = job_output()
                latest = (checkpoints / "latest").read_text().strip() if (checkpoints / "latest").exists() else ""
            resumed = [line for line in lines if line["resumed_from"] is not None]
            time.sleep(0.2)
        at("resumed")
    finally:
        slurm2.run("scancel", job, check=False)
    print(f"job {job}: " + ", ".join(f"{event} at {seconds:.1f} s" for event, seconds in seen.items()))
    before = [line for line in lines if line["resumed_from"] is None]
    saved = int(str(before[-1]["step"]))
    # the first allocation: steps 1..saved, then the signal, the save of step `saved` on every rank (its only
    # checkpoint), exit 0, requeue
    assert [line["step"] for line in before] == list(range(1, saved + 1))
    assert "allocation 1," in first_output and "gpufleet: SIGUSR1, the time limit is near" in first_output
    assert f"burn-in: SIGUSR1: saved the checkpoint of step {saved} and stopped" in first_output, first_output[-3000:]
    assert "the trainer exited (0): requeueing" in first_output, first_output[-3000:]
    assert latest.endswith(f"{saved:012d}") and sorted(p.name for p in checkpoints.glob("step_*")) == [
        f"step_{saved:012d}"]
    assert seen["first step"] < seen["signal"] < seen["requeued"] < seen["resumed"]
    # the signal came before the limit: 30 - LEAD_S s after the start at the earliest, and before the look at the
    # limit that would have ended the job (a minute, a look every 30 s; slack for the start and a loaded machine)
    assert 30 - LEAD_S - 5 < seen["signal"] < 60 + 30
    # the second allocation: resumed from that checkpoint, the next step first, with torchrun's restart count 0
    # (a new allocation, not a torchrun restart)
    assert resumed[0]["resumed_from"] == saved and resumed[0]["step"] == saved + 1 and resumed[0]["restart"] == 0
    assert seen["resumed"] - seen["requeued"] >= CRED_EXPIRE_S - 1  # Slurm held it for the credential window
    assert seen["resumed"] < 180
