"""Inputs that cannot be what the user meant are refused with the flag and why (planner/input_sense.py), exit 2,
from the CLI and the Python API alike; the GPU counts suggested for a pinned layout can run it."""

from __future__ import annotations

import pytest

from clirun import one_error_line
from clirun import run_gpufleet as gpufleet
from gpufleet.catalog.registry import load_catalog
from gpufleet.errors import InputError
from gpufleet.planner.pins import LayoutPins
from gpufleet.planner.plan import PlanRequest, make_plan


def test_a_token_count_below_one_step_is_refused_naming_the_step() -> None:
    # the default batch for 64 GPUs at 4,096 tokens: 4M tokens (1,024 sequences), so 15 tokens is not a run
    line = one_error_line(gpufleet("plan", "-m", "llama3-8b", "-t", "15", "-n", "64"))
    assert "--tokens 15 is less than one optimizer step (4,194,304 tokens = 1,024 sequences of 4,096)" in line
    with pytest.raises(InputError, match="less than one optimizer step"):
        make_plan(PlanRequest(model="llama3-8b", tokens=15, gpus=64), load_catalog())
    assert gpufleet("plan", "-m", "llama3-8b", "-t", "4194304", "-n", "64", "--top", "1").returncode == 0


@pytest.mark.parametrize("gpus", ["64", "72"])
def test_a_tensor_parallel_degree_no_layout_can_have_is_refused_with_the_allowed_ones(gpus: str) -> None:
    # llama3-8b: 32 heads, 8 key-value heads; tp at most 8 (one node): 1, 2, 4, 8 divide 32, 64 and 72
    line = one_error_line(gpufleet("plan", "-m", "llama3-8b", "-n", gpus, "--tp", "3"))
    assert line.startswith("error: --tp 3: ") and "32 attention heads" in line and line.endswith("allowed: 1, 2, 4, 8")
    with pytest.raises(InputError, match="--tp 3"):
        make_plan(PlanRequest(model="llama3-8b", gpus=int(gpus), pins=LayoutPins(tp=3)), load_catalog())


def test_the_counts_suggested_for_a_pinned_pipeline_can_run_it() -> None:
    line = one_error_line(gpufleet("plan", "-m", "llama3-8b", "-n", "64", "--pp", "7"))
    suggested = line.split("nearest GPU counts with a legal layout: ")[1].split(" (")[0].split(" or ")
    assert suggested and all(int(count) % 7 == 0 for count in suggested)
    for count in suggested:
        assert gpufleet("plan", "-m", "llama3-8b", "-n", count, "--pp", "7", "--top", "1").returncode == 0
