"""`plan` carries an 80 % interval on each plan's step time, tokens/s per GPU, time to train and cost."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from clirun import run_gpufleet
from gpufleet.catalog.registry import load_catalog


@pytest.fixture(scope="module")
def planned() -> dict:  # type: ignore[type-arg]
    done = run_gpufleet("plan", "-m", "llama3-70b", "-n", "64", "--top", "2", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_each_plan_carries_intervals_in_each_predictions_own_unit(planned: dict) -> None:  # type: ignore[type-arg]
    job, cluster = planned["job"], planned["cluster"]
    for plan in planned["plans"]:
        intervals = plan["intervals"]
        assert {"step_s", "tokens_per_s_per_gpu", "time_to_train_s"} <= set(intervals)
        for name in ("step_s", "tokens_per_s_per_gpu", "time_to_train_s"):
            interval = intervals[name]
            assert interval["level"] == 0.8 and interval["low"] < plan[name] < interval["high"]
        step = intervals["step_s"]
        tokens_per_gpu_step = job["global_batch"] * job["seq_len"] / cluster["gpus"]  # derived by hand
        assert intervals["tokens_per_s_per_gpu"]["low"] == pytest.approx(tokens_per_gpu_step / step["high"])
        assert intervals["tokens_per_s_per_gpu"]["high"] == pytest.approx(tokens_per_gpu_step / step["low"])
        scale = plan["time_to_train_s"] / plan["step_s"]
        assert intervals["time_to_train_s"]["high"] == pytest.approx(step["high"] * scale)


def test_the_step_interval_is_the_regimes_recorded_band(planned: dict) -> None:  # type: ignore[type-arg]
    """Symmetric in log: low = step / e^q and high = step × e^q for the regime's recorded quantile q."""
    plan = planned["plans"][0]
    step = plan["intervals"]["step_s"]
    layout = plan["layout"]
    # dense bf16 on 64 GPUs: model-parallel when tp·pp > 1 (planner/intervals.py classify_regime), else dense-dp
    assert step["regime"] == ("model-parallel" if layout["tp"] * layout["pp"] > 1 else "dense-dp")
    q = math.log(step["high"] / plan["step_s"])
    assert math.log(plan["step_s"] / step["low"]) == pytest.approx(q)
    record = load_catalog().interval_table()
    assert q == pytest.approx(record.regimes[step["regime"]].quantile_log)


def test_the_table_shows_each_interval() -> None:
    done = run_gpufleet("plan", "-m", "llama3-70b", "-n", "64", "--top", "1")
    assert done.returncode == 0, done.stderr
    assert "80% interval" in done.stdout and "leave-one-source-out" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.startswith("│ 1 "))
    assert row.count("–") >= 3  # step, tokens/s per GPU and train time each with (low–high)


def test_launch_check_carries_the_steps_interval(tmp_path: Path) -> None:
    out = tmp_path / "M"
    assert run_gpufleet("launch", "-m", "llama3-8b", "-n", "64", "--target", "megatron", "--out", str(out)
                        ).returncode == 0
    args = str(out / "megatron" / "pretrain_gpt.args")
    checked = run_gpufleet("launch", "--check", args, "-m", "llama3-8b", "--gpus", "64", "--json")
    expected = json.loads(checked.stdout)["expected"]
    band = expected["step_interval"]
    assert band["level"] == 0.8 and band["low"] < expected["step_s"] < band["high"]
    text = run_gpufleet("launch", "--check", args, "-m", "llama3-8b", "--gpus", "64").stdout
    assert "80% interval" in text


def test_the_burn_in_loop_line_says_whether_the_measured_step_is_inside_the_plans_interval() -> None:
    from gpufleet.runtime.burnin.loop import LoopCheck

    inside = LoopCheck(predicted_s=1.0, measured_s=1.1, parts_s={"compute.gemm": 0.9}, clock="cpu",
                       interval_s=(0.88, 1.14))
    assert "(0.8800–1.1400)" in inside.summary() and "inside the plan's interval" in inside.summary()
    outside = LoopCheck(predicted_s=1.0, measured_s=1.3, parts_s={}, clock="cpu", interval_s=(0.88, 1.14))
    assert "outside the plan's interval" in outside.summary()
    assert "interval" not in LoopCheck(predicted_s=1.0, measured_s=1.3, parts_s={}, clock="cpu").summary()


def test_the_burn_in_plan_has_the_interval_plan_gives_its_layout() -> None:
    from gpufleet.planner.fixed_layout import eager_fsdp_plan

    catalog = load_catalog()
    planned = eager_fsdp_plan(catalog, "llama3-8b", "h100-sxm", "dgx-h100", 8, 2048, 1, overlap=True)
    band = planned.interval
    assert band.regime == "dense-dp" and band.low < planned.step.step_s < band.high  # dp only: no tp or pp
