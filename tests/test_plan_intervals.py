"""`plan` carries an 80 % interval on each plan's step time, tokens/s per GPU, time to train and cost."""

from __future__ import annotations

import json
import math

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
