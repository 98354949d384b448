"""The requests behind `plan` and `launch` (planner/plan_command.py, planner/plan_options.py,
emit/launch_request.py): the Python API refuses what the CLI refuses, with the CLI's one-line message, and a
budget keeps only the plans whose cheapest cloud cost fits it, fastest first."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpufleet.catalog.registry import Catalog, load_catalog
from gpufleet.emit.launch_request import LaunchRequest, launch_plan
from gpufleet.errors import InputError
from gpufleet.planner.plan import make_plan
from gpufleet.planner.plan_command import DEFAULT_TOP, PlanCommand, shown_plans
from gpufleet.planner.plan_options import WorkloadOptions
from gpufleet.planner.stack import TARGET_STACKS


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog([])


@pytest.mark.parametrize(("fields", "message"), [
    ({"topology": "ring"}, "--topology 'ring' is not one of"),
    ({"rank_by": "speed"}, "--rank-by must be time or cost"),
    ({"precision": "fp4"}, "--precision must be one of"),
    ({"seq": 0}, "--seq must be a positive number of tokens"),
    ({"global_batch": 0}, "--global-batch must be a positive number"),
    ({"ep_dispatch": "x"}, "--ep-dispatch must be all-to-all or dedup"),
])
def test_workload_options_refuse_a_value_with_the_flags_message(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message):
        WorkloadOptions(**fields)  # type: ignore[arg-type]


def test_workload_options_refuse_an_unknown_field() -> None:
    with pytest.raises(ValidationError):
        WorkloadOptions(modle="llama3-8b")  # type: ignore[call-arg]


@pytest.mark.parametrize(("fields", "message"), [
    ({"budget_usd": 0.0}, "--budget must be a positive number of dollars"),
    ({"gpus": "64,128", "top": 3, "explain": 1}, "--top, --explain apply to one GPU count"),
    ({"gpus": "64", "deadline": "30d", "budget_usd": 1e6}, "--budget applies to one GPU count"),
    ({"plot": Path("scaling.png")}, "--plot draws a GPU-count sweep"),
    ({"top": 0}, "--top must be at least 1"),
    ({"top": 3, "explain": 4}, r"--explain RANK must be between 1 and --top \(3\)"),
    ({"gpus": "99999999"}, "is more than 1,048,576"),
])
def test_plan_command_refuses_flags_that_disagree(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message):
        PlanCommand(**fields)  # type: ignore[arg-type]


def test_a_list_of_counts_or_a_deadline_is_a_sweep() -> None:
    assert PlanCommand(gpus="64-256").counts == [64, 128, 256]
    assert PlanCommand(gpus="64-256").is_sweep
    assert PlanCommand(gpus="64", deadline="30d").is_sweep
    assert PlanCommand(deadline="30d").deadline_s == 30 * 86_400
    single = PlanCommand()
    assert not single.is_sweep and single.shown == DEFAULT_TOP == 5


def test_the_base_request_is_the_first_count_with_the_sites(cat: Catalog) -> None:
    command = PlanCommand(workload=WorkloadOptions(model="llama3-70b"), gpus="2048", sites=2, wan_gbps=200.0,
                          wan_latency="5ms")
    request = command.base_request(cat)
    assert (request.model, request.gpus, request.top) == ("llama3-70b", 2048, 5)
    assert (request.sites, request.wan_gbps, request.wan_latency_s) == (2, 200.0, pytest.approx(0.005))


def test_a_budget_keeps_the_plans_it_pays_for_fastest_first(cat: Catalog) -> None:
    result = make_plan(WorkloadOptions(tokens="100B").plan_request(cat, 64, 10), cat)
    prices = sorted(p.cheapest_usd for p in result.plans if p.cheapest_usd is not None)
    budget = prices[len(prices) // 2]  # about half the plans fit
    shown = shown_plans(result, PlanCommand(budget_usd=budget))
    assert shown.failure is None and shown.plans
    assert all(p.cheapest_usd is not None and p.cheapest_usd <= budget for p in shown.plans)
    assert len(shown.plans) == min(DEFAULT_TOP, sum(price <= budget for price in prices))
    assert [p.wall_time_s for p in shown.plans] == sorted(p.wall_time_s for p in shown.plans)
    too_little = shown_plans(result, PlanCommand(budget_usd=prices[0] / 2))
    assert too_little.over_budget and not too_little.plans
    assert too_little.failure == (f"no plan's cheapest cloud cost fits the ${prices[0] / 2:,.0f} budget; cheapest is "
                                  f"${prices[0]:,.0f}")


def test_explain_names_one_of_the_plans_left(cat: Catalog) -> None:
    result = make_plan(WorkloadOptions(tokens="100B").plan_request(cat, 64, 5), cat)
    assert shown_plans(result, PlanCommand(explain=2)).explained is result.plans[1]
    cheapest = min(p.cheapest_usd for p in result.plans if p.cheapest_usd is not None)
    with pytest.raises(InputError, match="--explain must be between 1 and"):
        shown_plans(result, PlanCommand(budget_usd=cheapest, explain=5))  # fewer plans fit the budget than 5


def test_launch_request_refuses_what_the_cli_refuses(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--check needs one or more files"):
        LaunchRequest(check=True)
    with pytest.raises(InputError, match=r"unexpected argument x\.json: files are read only with --check"):
        LaunchRequest(files=(Path("x.json"),), targets=("megatron",), out_dir=tmp_path / "run")
    with pytest.raises(InputError, match="give --out DIR"):
        LaunchRequest(targets=("megatron",))
    with pytest.raises(InputError, match="unknown --target 'foo'"):
        LaunchRequest(targets=("foo",), out_dir=tmp_path / "run")
    with pytest.raises(InputError, match="drop --gpus, --model"):
        LaunchRequest(targets=("megatron",), out_dir=tmp_path / "run", plan_file=tmp_path / "plan.json",
                      plan_flags=("model", "gpus"))
    with pytest.raises(InputError, match="--rank must be at least 1, got 0"):
        LaunchRequest(targets=("megatron",), out_dir=tmp_path / "run", rank=0)


def test_one_framework_target_plans_with_its_stack(cat: Catalog, tmp_path: Path) -> None:
    request = LaunchRequest(targets=("torchtitan", "slurm"), out_dir=tmp_path / "run", gpus="16")
    planned = launch_plan(request, WorkloadOptions(), cat)
    assert planned.target_only == "torchtitan" and planned.promised is None
    assert planned.request.stack == TARGET_STACKS["torchtitan"] and planned.request.gpus == 16
    both = launch_plan(LaunchRequest(targets=("megatron", "torchtitan"), out_dir=tmp_path / "run"),
                       WorkloadOptions(), cat)
    assert both.target_only is None and both.request.stack is None
