"""A process saving in a loop is SIGKILLed at random instants; every load afterwards must be exactly
one complete earlier save, and never older than the newest save the process had seen committed.

Children are forked from a warm fork server (torch already imported), so a trial costs a fork instead
of a Python start. `pytest -m stress` runs GPUFLEET_STRESS_TRIALS (default 1000) trials.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from _workers import expected_state, same_state  # noqa: E402

from gpufleet.runtime.checkpoint import CheckpointManager  # noqa: E402

WORKER = Path(__file__).with_name("_workers.py")


class ForkServer:
    def __init__(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).parents[2] / "src"))
        self.proc = subprocess.Popen([sys.executable, str(WORKER), "zygote"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        assert self._ask(None) == "ready"

    def _ask(self, line: str | None) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if line is not None:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def fork(self, root: Path, log: Path) -> int:
        return int(self._ask(f"fork {root} {log}"))

    def reap(self, pid: int) -> int:
        return int(self._ask(f"reap {pid}"))

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def fork_server() -> Iterator[ForkServer]:
    server = ForkServer()
    yield server
    server.close()


def run_trials(server: ForkServer, root: Path, trials: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    counts = {"bad_loads": 0, "stale_loads": 0, "empty": 0, "trials": 0}
    for trial in range(trials):
        log = root.parent / f"trial-{trial}.log"
        pid = server.fork(root, log)
        time.sleep(rng.uniform(0.0, 0.5))
        os.kill(pid, signal.SIGKILL)
        status = server.reap(pid)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"child exited early: {status}"
        lines = log.read_text().splitlines() if log.exists() else []
        durable = [int(line.split()[1]) for line in lines if line.startswith("durable") and "None" not in line]
        counts["bad_loads"] += sum(line.startswith("BAD") for line in lines)
        found = CheckpointManager(root, keep_last=2).load_latest()
        counts["trials"] += 1
        if found is None:
            counts["empty"] += 1
            counts["stale_loads"] += bool(durable)
            continue
        step, state = found
        if not same_state(state, expected_state(step)):
            counts["bad_loads"] += 1
        if durable and step < max(durable):
            counts["stale_loads"] += 1
    return counts


@pytest.mark.slow
def test_sigkill_at_random_instants_never_loads_a_partial_save(fork_server: ForkServer, tmp_path: Path) -> None:
    counts = run_trials(fork_server, tmp_path / "ckpt", trials=50, seed=1)
    print(counts)
    assert counts["bad_loads"] == 0 and counts["stale_loads"] == 0
    assert counts["empty"] < 25  # the kills do land after commits, not only before the first


@pytest.mark.stress
def test_sigkill_stress(fork_server: ForkServer, tmp_path: Path) -> None:
    trials = int(os.environ.get("GPUFLEET_STRESS_TRIALS", "1000"))
    counts = run_trials(fork_server, tmp_path / "ckpt", trials=trials, seed=2)
    print(f"sigkill stress: trials={counts['trials']} bad_loads={counts['bad_loads']} "
          f"stale_loads={counts['stale_loads']}")
    assert counts["bad_loads"] == 0 and counts["stale_loads"] == 0
