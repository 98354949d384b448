"""`plan` and `validate` turn on the step model's optional terms: --stragglers (perf/dp_scaling.py),
--overlap-contention (perf/overlap_contention.py) and --fsdp2-copies/--no-fsdp2-copies (perf/fsdp_overheads.py).

Each flag moves the step by what its term's formula gives, worked out here by hand from the off plan's own
numbers; off (the default) is the plan of the library's default options; the pruned search stays exact with each
term on (planner/floors.py bounds StepEstimate.pipeline_s, which the terms add to after the floors).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clirun import one_error_line, run_gpufleet
from gpufleet.catalog.judgements import shipped_judgements
from gpufleet.catalog.registry import load_catalog
from gpufleet.fabric.topology import Cluster
from gpufleet.perf.overlap_contention import COLLECTIVE_PARTS, OVERLAP_COMPUTE_SLOWDOWN
from gpufleet.perf.step import StepOptions
from gpufleet.planner.plan import PlanRequest, make_plan
from gpufleet.planner.search import SearchSpace, search
from gpufleet.workload.job import Job
from test_search_prune import CALIBRATION, SEARCHES, jobs

pytestmark = pytest.mark.timeout(300)

SMALL = ("-m", "llama3-8b", "-n", "2", "--top", "5")


def _plan(*flags: str) -> dict[str, Any]:
    result = run_gpufleet("plan", *SMALL, *flags, "--json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _by_label(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {plan["layout"]["label"]: plan for plan in data["plans"]}


def _shared(off: dict[str, Any], on: dict[str, Any]) -> list[str]:
    labels = sorted(set(_by_label(off)) & set(_by_label(on)))
    assert labels, "the flag changed every layout shown"
    return labels


def test_the_default_terms_are_the_plan_of_the_default_options() -> None:
    # Stragglers off, the overlap contention on at its measured 18.9 %, FSDP2 copies as the stack says (Megatron: off)
    default = _plan()
    spelled = _plan("--stragglers", "0", "--overlap-contention", "measured", "--straggler-scope", "job")
    assert default["plans"] == spelled["plans"]
    framework = default["framework"]
    assert (framework["straggler_sigma"], framework["straggler_scope"], framework["overlap_slowdown"],
            framework["fsdp2_copies"]) == (0.0, "job", OVERLAP_COMPUTE_SLOWDOWN, False)
    assert default["request"]["options"]["straggler_sigma"] == 0.0
    library = make_plan(PlanRequest(model="llama3-8b", gpus=2, top=5), load_catalog())
    assert [(p["layout"]["label"], p["step_s"]) for p in default["plans"]] == [
        (p.layout.short(), p.candidate.step.step_s) for p in library.plans]
    for plan in default["plans"]:
        assert not {"sync.stragglers", "fsdp.copies"} & set(plan["parts"])
    free = _plan("--overlap-contention", "off")
    assert free["framework"]["overlap_slowdown"] == 0.0
    assert _plan("--overlap-contention", "0")["plans"] == free["plans"]
    for plan in free["plans"]:
        assert "compute.overlap-contention" not in plan["parts"]


def test_stragglers_add_sigma_times_the_expected_max_of_two_gpus_times_the_pipeline() -> None:
    """A 2-GPU job's slowest GPU is on average 1/sqrt(pi) sigma slower than the median (E[max of 2 standard
    normals] = 1/sqrt(pi), E[max of 1] = 0): the step grows by sigma / sqrt(pi) x the pipeline's critical path."""
    sigma = 0.015
    off, on = _plan(), _plan("--stragglers", "1.5%")
    pipeline = {p.layout.short(): p.candidate.step.pipeline_s
                for p in make_plan(PlanRequest(model="llama3-8b", gpus=2, top=5), load_catalog()).plans}
    for label in _shared(off, on):
        grown = _by_label(on)[label]["step_s"] - _by_label(off)[label]["step_s"]
        assert grown == pytest.approx(sigma / math.sqrt(math.pi) * pipeline[label], rel=1e-3)
        assert _by_label(on)[label]["parts"]["sync.stragglers"]["exposed_s"] == pytest.approx(grown, rel=1e-9)
    assert on["framework"]["straggler_sigma"] == sigma == on["request"]["options"]["straggler_sigma"]


def test_replica_scope_adds_only_what_data_parallelism_adds() -> None:
    """--straggler-scope replicas: a tp2 dp1 layout is one replica, already paced by its slowest GPU: no term."""
    off, on = _plan(), _plan("--stragglers", "0.015", "--straggler-scope", "replicas")
    assert on["request"]["options"]["straggler_scope"] == "replicas"
    for label in _shared(off, on):
        if _by_label(on)[label]["layout"]["dp"] == 1:
            assert _by_label(on)[label]["step_s"] == _by_label(off)[label]["step_s"]
            assert "sync.stragglers" not in _by_label(on)[label]["parts"]


@pytest.mark.parametrize(("given", "fraction"), [("measured", 0.189), ("10%", 0.10)])
def test_overlap_contention_adds_the_fraction_of_the_hidden_collectives(given: str, fraction: float) -> None:
    off, on = _plan("--overlap-contention", "off"), _plan("--overlap-contention", given)
    assert on["framework"]["overlap_slowdown"] == pytest.approx(fraction)
    moved = False
    for label in _shared(off, on):
        before = _by_label(off)[label]
        hidden_s = sum(before["parts"][name]["hidden_s"] for name in COLLECTIVE_PARTS if name in before["parts"])
        grown = _by_label(on)[label]["step_s"] - before["step_s"]
        assert grown == pytest.approx(fraction * hidden_s, rel=1e-6, abs=1e-9)
        moved = moved or hidden_s > 0
    assert moved, "no shown layout hides a collective: the case tests nothing"


def test_fsdp2_copies_flag_overrides_the_stack() -> None:
    """torchtitan runs FSDP2: its copies are on; --no-fsdp2-copies takes them off. For a fully sharded tp1 pp1
    layout each micro-batch moves 14 B per parameter (2 bf16 gathers x 2 passes x 2 B + 2 B read + 4 B fp32
    written for the reduce-scatter input) at the HBM's streaming rate."""
    free = ("--overlap-contention", "off")  # isolate the copies from the contention of what FSDP hides
    stack_on = _plan("--stack", "torchtitan", "--top", "20", *free)  # the copies move the sharded layouts down
    off = _plan("--stack", "torchtitan", "--no-fsdp2-copies", "--top", "20", *free)
    assert (stack_on["framework"]["fsdp2_copies"], off["framework"]["fsdp2_copies"]) == (True, False)
    on = _plan("--fsdp2-copies", *free)  # Megatron-LM's defaults, copies turned on
    assert on["framework"]["fsdp2_copies"] is True
    cat = load_catalog()
    from gpufleet.workload.params import count_params

    params = count_params(cat.model("llama3-8b")).total
    rate = cat.gpu("h100-sxm").hbm_bytes_per_s * cat.calibration("h100-sxm").hbm_fraction
    sharded = [label for label in _shared(off, stack_on) if _by_label(off)[label]["layout"]["sharding"] == "zero3"
               and _by_label(off)[label]["layout"]["tp"] == 1 and _by_label(off)[label]["layout"]["pp"] == 1]
    assert sharded, "no fully sharded tp1 pp1 layout shown"
    for label in sharded:
        plan = _by_label(off)[label]
        grown = _by_label(stack_on)[label]["step_s"] - plan["step_s"]
        assert grown == pytest.approx(plan["micro_batches"] * params * 14 / rate, rel=1e-3)
    for label in _shared(off, stack_on):
        if _by_label(off)[label]["layout"]["sharding"] not in ("zero3", "fsdp", "hsdp"):
            assert _by_label(stack_on)[label]["step_s"] == _by_label(off)[label]["step_s"]


def test_explain_and_help_name_each_term() -> None:
    explained = run_gpufleet("plan", *SMALL, "--stragglers", "1.5%",
                             "--overlap-contention", "measured", "--explain", "1")
    assert explained.returncode == 0, explained.stderr
    assert "sync.stragglers" in explained.stdout and "compute.overlap-contention" in explained.stdout
    assert "stragglers sigma 1.50%" in explained.stdout
    ranked = _plan("--stack", "torchtitan", "--top", "20")["plans"]
    rank = next(p["rank"] for p in ranked if p["layout"]["sharding"] == "zero3")
    sharded = run_gpufleet("plan", *SMALL, "--stack", "torchtitan", "--top", "20", "--explain", str(rank))
    assert "fsdp.copies" in sharded.stdout
    for command in ("plan", "validate"):
        helped = run_gpufleet(command, "--help")
        text = " ".join(helped.stdout.split())
        for flag in ("--stragglers", "--straggler-scope", "--overlap-contention", "--fsdp2-copies",
                     "docs/dp-scaling.md", "docs/residuals.md"):
            assert flag in text, (command, flag)


@pytest.mark.parametrize("flags", [
    ("--stragglers", "-0.01"), ("--stragglers", "2"), ("--stragglers", "150%"), ("--stragglers", "fast"),
    ("--stragglers", "0.3"), ("--overlap-contention", "1.5"), ("--overlap-contention", "-5%"),
    ("--overlap-contention", "lots"), ("--straggler-scope", "world"),
])
def test_bad_values_get_one_line_and_exit_2(flags: tuple[str, str]) -> None:
    line = one_error_line(run_gpufleet("plan", *SMALL, *flags))
    assert flags[0] in line


def test_validate_takes_the_terms_and_says_so() -> None:
    off = run_gpufleet("validate", "--json")
    on = run_gpufleet("validate", "--json", "--stragglers", "0.015", "--overlap-contention", "measured")
    assert off.returncode == 0 and on.returncode == 0, on.stderr
    before, after = json.loads(off.stdout), json.loads(on.stdout)
    assert after["options"] == {"straggler_sigma": 0.015, "straggler_scope": "job", "overlap_slowdown": 0.189,
                                "fsdp2_copies": None, "fp8_amax_sync_sigma": shipped_judgements().fp8_amax_sync_sigma,
                                "dp_overlap_window": "chunks", "pp_p2p_overlap": True}
    pairs = [(a["predicted_tokens_per_s_per_gpu"], b["predicted_tokens_per_s_per_gpu"])
             for a, b in zip(before["runs"], after["runs"], strict=True) if a["predicted_tokens_per_s_per_gpu"]]
    assert pairs and all(slower < faster for faster, slower in pairs)  # every run waits for its slowest GPU
    line = one_error_line(run_gpufleet("validate", "--stragglers", "2"))
    assert "--stragglers" in line


def test_validate_no_overlap_pp_prices_every_send_in_line() -> None:
    # --no-overlap-pp: every interleaved run is predicted slower (its sends now exposed) or, where its stack already
    # sends in line (the 2021 and 2022 Megatron stacks) or it has no interleaved pipeline, the same.
    on = json.loads(run_gpufleet("validate", "--json").stdout)
    off = json.loads(run_gpufleet("validate", "--json", "--no-overlap-pp").stdout)
    assert off["options"]["pp_p2p_overlap"] is False and on["options"]["pp_p2p_overlap"] is True
    slower = 0
    for a, b in zip(on["runs"], off["runs"], strict=True):
        if not a["predicted_tokens_per_s_per_gpu"]:
            continue
        assert b["predicted_tokens_per_s_per_gpu"] <= a["predicted_tokens_per_s_per_gpu"] * (1 + 1e-9), a["id"]
        slower += b["predicted_tokens_per_s_per_gpu"] < a["predicted_tokens_per_s_per_gpu"] * (1 - 1e-6)
    assert slower > 0


TERMS = [replace(StepOptions(), straggler_sigma=0.015), replace(StepOptions(), straggler_sigma=0.015,
                                                                  straggler_scope="replicas"),
         replace(StepOptions(), overlap_slowdown=0.189), replace(StepOptions(), fsdp2_copies=True),
         replace(StepOptions(), pp_p2p_overlap=False)]


@SEARCHES
@given(jobs(), st.sampled_from(range(len(TERMS))), st.sampled_from([1, 3, 10]))
def test_the_pruned_search_equals_the_exhaustive_one_with_each_term_on(drawn: tuple[Job, Cluster, StepOptions],
                                                                       term: int, keep: int) -> None:
    job, cluster, options = drawn
    turned_on = TERMS[term]
    options = replace(options, straggler_sigma=turned_on.straggler_sigma, straggler_scope=turned_on.straggler_scope,
                      overlap_slowdown=turned_on.overlap_slowdown, fsdp2_copies=turned_on.fsdp2_copies,
                      pp_p2p_overlap=turned_on.pp_p2p_overlap)
    space = SearchSpace(cps=(1, 2), micro_batches=(1, 2, 4))
    everything = search(job, cluster, CALIBRATION, space=space, options=options)
    pruned = search(job, cluster, CALIBRATION, space=space, options=options, keep=keep)
    assert (pruned.tried, pruned.fit, pruned.infeasible) == (everything.tried, len(everything.feasible),
                                                             everything.infeasible)
    for fast, slow in zip(pruned.feasible, everything.feasible, strict=False):
        assert (fast.layout, fast.step) == (slow.layout, slow.step)


@pytest.mark.parametrize("terms", [
    ("--stragglers", "1.5%", "--overlap-contention", "measured", "--fsdp2-copies"),
    ("--overlap-contention", "off", "--dp-overlap-window", "micro-batch"),
    # FP8 training state of 8B needs more than two GPUs' HBM
    ("-n", "8", "--precision", "fp8", "--fp8-amax-sync", "0", "--fp8-recipe", "current"),
])
def test_launch_reads_the_terms_back_from_a_plan_file(tmp_path: Path, terms: tuple[str, ...]) -> None:
    """A plan made with terms other than the defaults launches: launch re-plans with every term the file records
    (its framework check passes) and finds the layout the file lists. (Before, the FP8 amax spread, the overlap
    window and the FP8 recipe were left at their defaults, and launch refused the file as another version's.)"""
    job = ("-m", "llama3-8b", "--top", "5") if "-n" in terms else SMALL
    planned = run_gpufleet("plan", *job, *terms, "--json")
    assert planned.returncode == 0, planned.stderr
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(planned.stdout)
    launched = run_gpufleet("launch", "--plan", str(plan_file), "--rank", "1", "--target", "megatron", "--out",
                            str(tmp_path / "run"), "--json")
    assert launched.returncode == 0, launched.stderr
    assert json.loads(launched.stdout)["layout"]["label"] == json.loads(planned.stdout)["plans"][0]["layout"]["label"]
