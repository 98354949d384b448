"""`gpufleet cost --plan` prices the GPU-hours of a `gpufleet plan --json` output."""

from __future__ import annotations

import json
import math
from pathlib import Path

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
