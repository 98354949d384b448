"""Straggler and hang detection in a real 4-rank torch.distributed job (gloo on CPU) launched by torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _net import free_port
from prometheus_client.parser import text_string_to_metric_families

pytest.importorskip("torch")

WORKER = Path(__file__).with_name("_monitor_worker.py")
REPO = Path(__file__).parents[2]
WORLD = 4
pytestmark = pytest.mark.slow


def torchrun(scenario: str, out: Path, slow_rank: int, timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--master-addr",
               "127.0.0.1", "--master-port", str(free_port()), str(WORKER), scenario, str(out), str(slow_rank)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)


def own_gauge(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not in the scrape")


@pytest.mark.timeout(240)
def test_the_slowed_rank_is_named_the_straggler_with_its_host_and_throttled_gpu(tmp_path: Path) -> None:
    result = torchrun("slow", tmp_path, slow_rank=2, timeout_s=200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["stragglers"] == [2]
    # 3x the compute of the others: score = median / own ≈ 1/3 (sleep overshoot blurs it a little)
    assert report["scores"][2] < 0.5 and all(0.8 < s < 1.25 for i, s in enumerate(report["scores"]) if i != 2)
    assert report["slowed"] == [False, False, True, False]
    logs = result.stdout + result.stderr
    host = report["hosts"][2]
    assert f"straggler: rank 2 on {host}" in logs and "thermal or power throttling" in logs
    for rank in range(WORLD):
        text = (tmp_path / f"metrics-rank{rank}.txt").read_text()
        assert own_gauge(text, "gpufleet_train_straggler") == float(rank == 2)
        assert own_gauge(text, "gpufleet_train_steps_total") == 20


@pytest.mark.timeout(240)
def test_a_hung_rank_is_detected_within_the_timeout_plus_ten_percent_and_every_rank_dumps(tmp_path: Path) -> None:
    timeout_s = 3.0  # _monitor_worker.HANG_TIMEOUT_S
    started = time.monotonic()
    result = torchrun("hang", tmp_path, slow_rank=1, timeout_s=200)
    logs = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode != 0, logs
    assert time.monotonic() - started < 120
    hang = json.loads((tmp_path / "hang-started.json").read_text())
    for rank in range(WORLD):
        text = (tmp_path / f"hang-rank{rank:05d}.txt").read_text()
        header = dict(line.split(": ", 1) for line in text.split("\n\n", 1)[0].splitlines()[1:])
        assert int(header["rank"]) == rank
        waited = float(header["detected_at_unix_s"]) - hang["unix_s"]
        assert waited <= timeout_s * 1.1, (rank, waited)
        assert float(header["seconds_without_progress"]) >= timeout_s
        assert "Thread" in text and "File" in text  # faulthandler's dump of every thread
        assert "environ" not in text.lower() and "PATH=" not in text
    hung = (tmp_path / "hang-rank00001.txt").read_text()
    assert "hang_forever" in hung
    assert "all_reduce" in (tmp_path / "hang-rank00000.txt").read_text()
    assert "exitcode  : 124" in result.stdout + result.stderr  # the watchdog exit, as torchrun reports it
