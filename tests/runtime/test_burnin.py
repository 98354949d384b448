"""`gpufleet burnin` under a real gloo torchrun: kill -9 one worker mid-run, torchrun restarts the group, it resumes
from the last checkpoint, and every loss logged after the restart equals the uninterrupted run's at that step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _net import free_port
from _torchrun import torchrun_gpufleet

from clirun import one_error_line, run_gpufleet

STEPS, EVERY, KILL_AFTER = 20, 4, 10


def burnin_args(tmp: Path, name: str) -> list[str]:
    return ["burnin", "--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--checkpoint-dir",
            str(tmp / f"{name}-ckpt"), "--log-file", str(tmp / f"{name}.jsonl")]


def read_log(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def worker_pids(agent: int) -> dict[int, int]:
    """RANK -> pid of the agent's worker processes (its children running gpufleet burnin)."""
    found = {}
    for task in Path(f"/proc/{agent}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"burnin" in cmdline:
                rank = next((item[5:] for item in environ if item.startswith(b"RANK=")), None)
                if rank is not None:
                    found[int(rank)] = int(pid)
    return found


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_killed_worker_resumes_bit_for_bit(tmp_path: Path) -> None:
    clean = torchrun_gpufleet(2, *burnin_args(tmp_path, "clean"))
    assert clean.returncode == 0, clean.stderr[-3000:]
    expected = {row["step"]: row["loss"] for row in read_log(tmp_path / "clean.jsonl")}
    assert sorted(expected) == list(range(1, STEPS + 1))
    assert expected[STEPS] < expected[1]  # it trains

    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
               "--max-restarts", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
               "-m", "gpufleet", *burnin_args(tmp_path, "killed")]
    agent = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
    log = tmp_path / "killed.jsonl"
    deadline = time.monotonic() + 300
    while not any(row["step"] >= KILL_AFTER for row in read_log(log)):
        assert agent.poll() is None and time.monotonic() < deadline, "the run ended before the kill"
        time.sleep(0.05)
    pids = worker_pids(agent.pid)
    killed_at = max(row["step"] for row in read_log(log))
    os.kill(pids[1], signal.SIGKILL)
    _, stderr = agent.communicate(timeout=400)
    assert agent.returncode == 0, stderr[-3000:]

    rows = read_log(log)
    after = [row for row in rows if row["restart"] >= 1]
    assert after, "no step was logged after the restart"
    resumed_from = after[0]["step"] - 1
    assert resumed_from % EVERY == 0 and EVERY <= resumed_from <= killed_at  # from a checkpoint, not from scratch
    assert [row["step"] for row in after] == list(range(resumed_from + 1, STEPS + 1))
    for row in rows:  # before and after the kill: the same float, bit for bit
        assert row["loss"] == expected[row["step"]], row


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_alone_and_resumed_alone(tmp_path: Path) -> None:
    args = ["burnin", "--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path / "c"),
            "--log-file", str(tmp_path / "log.jsonl"), "--json"]
    single = {"OMP_NUM_THREADS": "1"}  # one thread, as torchrun sets it: two would fight over the shared cores
    first = run_gpufleet(*args, env=single)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["resumed_from"] is None
    again = run_gpufleet(*[*args[:2], "6", *args[3:]], env=single)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["resumed_from"] == 4
    assert [row["step"] for row in read_log(tmp_path / "log.jsonl")] == [1, 2, 3, 4, 5, 6]


def test_bad_input(tmp_path: Path) -> None:
    assert "multiple of --heads" in one_error_line(run_gpufleet(
        "burnin", "--steps", "2", "--checkpoint-dir", str(tmp_path), "--log-file", str(tmp_path / "l"),
        "--hidden", "30", "--heads", "4"))
