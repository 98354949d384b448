"""A writer is killed (SIGKILL, sent by itself just before the operation) at each file-system operation of a save,
of a save whose retention deletes the older checkpoint, and of a re-save of an existing step, one operation per
trial; a fresh process then loads the newest checkpoint. It must load the newest save that had returned (was durable)
before the kill, or the one in flight, with exactly its values: never nothing, never an older one.

Before the fix, a re-save killed between its two renames (the old copy moved to `.trash-…`, the new one not yet
renamed in) left both hidden, and the next start swept both away: `load_latest()` returned None.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from _crash_writer import SAVES, state_of  # noqa: E402
from _workers import same_state  # noqa: E402

from gpufleet.runtime.checkpoint import CheckpointManager  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
WRITER = Path(__file__).with_name("_crash_writer.py")


class Writer:
    """The fork server of _crash_writer.py: `run(root, log, kill_at)` forks one writer and returns its wait status."""

    def __init__(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).parents[2] / "src"))
        self.proc = subprocess.Popen([sys.executable, str(WRITER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        assert self._read() == "ready"

    def _read(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def run(self, root: Path, log: Path, kill_at: int, command: str = "run") -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{command} {root} {log} {kill_at}\n")
        self.proc.stdin.flush()
        return int(self._read())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def writer() -> Iterator[Writer]:
    server = Writer()
    yield server
    server.close()


def loaded_index(root: Path) -> int | None:
    """Which save of SAVES a fresh manager loads from `root` (its values checked exactly), or None."""
    found = CheckpointManager(root, keep_last=1).load_latest()
    if found is None:
        return None
    step, state = found
    matches = [i for i, (s, version) in enumerate(SAVES) if s == step and same_state(state, state_of(s, version))]
    assert matches, f"step {step} loaded with values of no save"
    return matches[0]


def test_a_kill_at_every_file_operation_of_save_and_resave_loses_no_durable_checkpoint(writer: Writer,
                                                                                        tmp_path: Path) -> None:
    dry_log = tmp_path / "dry.log"
    assert writer.run(tmp_path / "dry", dry_log, 0) == 0
    lines = dry_log.read_text().splitlines()
    total = int(lines[-1].split()[1])
    kinds = Counter(line.split()[2] for line in lines if line.startswith("op "))
    assert {"open-for-write", "write", "fsync", "rename", "replace", "unlink", "mkdir"} <= set(kinds), kinds
    assert loaded_index(tmp_path / "dry") == len(SAVES) - 1

    outcomes: Counter[str] = Counter()
    killed_kinds: Counter[str] = Counter()
    resave_window: list[int] = []  # kills with the old step 2 moved aside and the new one not yet renamed in
    for kill_at in range(1, total + 1):
        root, log = tmp_path / f"k{kill_at}", tmp_path / f"k{kill_at}.log"
        status = writer.run(root, log, kill_at)
        events = log.read_text().splitlines()
        kill = [line for line in events if line.startswith("kill ")]
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL and kill, (kill_at, events)
        killed_kinds[kill[0].split()[2]] += 1
        if kill[0].endswith("rename .tmp-step_000000000002 step_000000000002") and "saved 1" in events:
            resave_window.append(kill_at)
        durable = max((int(line.split()[1]) for line in events if line.startswith("saved ")), default=None)
        in_flight = max(int(line.split()[1]) for line in events if line.startswith("saving "))
        index = loaded_index(root)
        where = f"killed at op {kill_at} ({kill[0]}) during save {in_flight}, last durable save {durable}"
        if durable is not None:
            assert index is not None, f"nothing loads: {where}"
            assert index >= durable, f"loaded save {index}, older than the durable one: {where}"
        assert index is None or index <= in_flight, where
        outcomes["in flight" if index == in_flight else "durable" if index is not None else "none yet"] += 1
    print(f"crash points: {total} kills, outcomes {dict(outcomes)}, killed at {dict(killed_kinds)}")
    assert sum(outcomes.values()) == total and outcomes["durable"] > 0 and outcomes["in flight"] > 0
    assert len(resave_window) == 1  # the instant the issue names was among them
    recovery_kills = kill_during_recovery(writer, tmp_path / "recovery", resave_window[0])
    print(f"recovery of the re-save window: {recovery_kills} kills, each loads step 2")
    # docs/checkpoint.md quotes these counts: the page says what this test counts today
    from test_docs_live import assert_quotes, doc

    page = doc("docs/checkpoint.md")
    assert_quotes(page, "A dry run counts them (", total)
    for nth, count in enumerate((total, outcomes["none yet"], outcomes["durable"], outcomes["in flight"])):
        assert_quotes(page, "All pass (of ", count, nth=nth)
    assert_quotes(page, "itself killed at each of its own operations\n(", recovery_kills)


def kill_during_recovery(writer: Writer, base: Path, kill_at: int) -> int:
    """Leave the re-save window (the writer killed at its op `kill_at`), then kill the start that recovers it at each
    of its own operations; every later start must load the durable step 2. Returns how many kills were made."""

    base.mkdir()

    def window(name: str) -> Path:
        root = base / name
        writer.run(root, base / f"{name}.log", kill_at)
        names = [p.name for p in root.iterdir()]
        assert "step_000000000002" not in names and any(n.startswith(".superseded-step_000000000002") for n in names)
        return root

    dry = window("dry")
    assert writer.run(dry, base / "dry-open.log", 0, "open") == 0
    total = int((base / "dry-open.log").read_text().split()[-1])
    assert total >= 2  # at least the rename back and its fsync
    for open_kill in range(1, total + 1):
        root = window(f"r{open_kill}")
        status = writer.run(root, base / f"r{open_kill}-open.log", open_kill, "open")
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, open_kill
        assert loaded_index(root) == 1, f"recovery killed at its op {open_kill}: step 2 does not load"
    return total
