"""`gpufleet cost --plan` prices the GPU-hours of a `gpufleet plan --json` output."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from clirun import one_error_line
from clirun import run_gpufleet as gpufleet


def test_cost_of_a_plan(tmp_path: Path) -> None:
    planned = gpufleet("plan", "-m", "llama3-8b", "-t", "500B", "-n", "32", "--json")
    assert planned.returncode == 0, planned.stderr
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(planned.stdout)
    plan = json.loads(planned.stdout)
    expected_hours = 32 * plan["plans"][0]["time_to_train_s"] / 3600

    priced = gpufleet("cost", "--plan", str(plan_file), "--json")
    assert priced.returncode == 0, priced.stderr
    cost = json.loads(priced.stdout)
    assert math.isclose(cost["gpu_hours"], expected_hours, rel_tol=1e-9)
    assert cost["gpu"] == "h100-sxm"
    for offer in cost["offers"]:
        assert math.isclose(offer["usd"], expected_hours * offer["usd_per_gpu_hour"], rel_tol=0.02)


def test_plan_and_gpu_hours_are_exclusive(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-plan.json"
    bad.write_text('{"hello": 1}')
    for args in (["cost"], ["cost", "--plan", str(bad)], ["cost", "--plan", str(bad), "--gpu-hours", "10"]):
        done = gpufleet(*args)
        assert done.returncode == 2, args
        assert len(done.stderr.strip().splitlines()) == 1


def _plan_file(tmp_path: Path, gpu: str = "h100-sxm", gpus: int = 32) -> Path:
    """A `gpufleet plan --json` output of one GPU count (the plan file's schema is checked by its reader)."""
    planned = gpufleet("plan", "-m", "llama3-8b", "-t", "500B", "-g", gpu, "-n", str(gpus), "--top", "1", "--json")
    assert planned.returncode == 0, planned.stderr
    path = tmp_path / "plan.json"
    path.write_text(planned.stdout)
    return path


@pytest.mark.parametrize(("flags", "named", "planned"), [
    (("--gpu", "a100-sxm-80gb"), "--gpu a100-sxm-80gb", "h100-sxm"),
    (("--gpus", "8"), "--gpus 8", "32 GPUs"),
])
def test_plan_with_a_contradicting_gpu_or_gpu_count_is_refused(tmp_path: Path, flags: tuple[str, str],
                                                                named: str, planned: str) -> None:
    line = one_error_line(gpufleet("cost", "--plan", str(_plan_file(tmp_path)), *flags))
    assert named in line and planned in line


def test_a_sweep_is_refused_with_how_to_make_a_single_plan(tmp_path: Path) -> None:
    swept = gpufleet("plan", "-m", "llama3-8b", "-t", "500B", "-n", "32,64", "--json")
    assert swept.returncode == 0, swept.stderr
    sweep = tmp_path / "sweep.json"
    sweep.write_text(swept.stdout)
    line = one_error_line(gpufleet("cost", "--plan", str(sweep)))
    assert "sweep" in line and "32, 64" in line and "single --gpus" in line
    shown = gpufleet("cost", "--help")
    assert "not a sweep" in " ".join(shown.stdout.split())
