"""Sharded saves with real torch.distributed ranks (gloo on CPU): commit after every rank, resharding
loads into another world size, and one rank's failure failing the whole save."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from _net import free_port  # noqa: E402

from gpufleet.runtime.checkpoint import CheckpointManager, verify_checkpoint  # noqa: E402
from gpufleet.runtime.checkpoint.manager import _local_fs  # noqa: E402

WORKER = Path(__file__).with_name("_workers.py")
pytestmark = pytest.mark.slow


def run_ranks(world: int, scenario: str, root: Path, timeout_s: float = 90) -> list[str]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).parents[2]))
        procs.append(subprocess.Popen([sys.executable, str(WORKER), "rank", scenario, str(root)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=timeout_s)
        outputs.append(out)
        assert proc.returncode == 0, out[-3000:]
    return outputs


def test_four_ranks_commit_then_two_ranks_and_one_process_reshard(tmp_path: Path) -> None:
    from gpufleet.runtime.checkpoint.dcp_io import WRITE_THREADS

    root = tmp_path / "ckpt"
    outputs = run_ranks(4, "save", root)
    assert all("committed 3" in out for out in outputs)
    manager = CheckpointManager(root)
    assert manager.steps() == [1, 2, 3]
    for step in (1, 2, 3):
        report = verify_checkpoint(_local_fs(), str(root / f"step_{step:012d}"))
        assert report.ok, report.problems
        assert report.manifest is not None and report.manifest.world_size == 4
        assert sorted(report.manifest.files) == [".metadata"] + [
            f"__{r}_{i}.distcp" for r in range(4) for i in range(WRITE_THREADS)]
    # 4 ranks -> 2 ranks: DCP reshards the row shards
    outputs = run_ranks(2, "load", root)
    assert all("loaded 3" in out for out in outputs)
    # 4 ranks -> 1 process without a template: the whole tensor, unaffected by post-save mutation
    found = manager.load_latest()
    assert found is not None
    step, state = found
    want = torch.arange(48 * 8, dtype=torch.float32).reshape(48, 8) + 1000 * step
    assert step == 3 and torch.equal(state["w"], want) and state["step"] == 3


def test_one_rank_failing_fails_the_save_on_every_rank(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    outputs = run_ranks(3, "fail", root)
    assert all("saw failure" in out and "No space left" in out for out in outputs)
    assert all("steps [1, 3]" in out for out in outputs)
    assert not (root / "step_000000000002").exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]
