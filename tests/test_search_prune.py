"""The fast search gives the exhaustive search's answers: same ranking, same counts (issue 22, item 1).

Three things make `search` fast, each checked here against the slow way on small random jobs:
* one JobMemory for all layouts (its parts shared by key) gives every layout the numbers a fresh one gives;
* the step floors of planner.floors never exceed the step they bound (the compute floor is also bit-equal to the
  compute parts it copies: it orders the block-recompute pass);
* `search(..., keep=k)` ranks the k fastest exactly as the exhaustive search does, with the same counts.
"""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.records import ModelSpec, MoESpec
from gpufleet.catalog.registry import load_catalog
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.parallel.layout import Layout
from gpufleet.parallel.memory import JobMemory, MemoryAssumptions, peak_stage_memory, stage_memory
from gpufleet.perf.step import StepOptions, estimate_step
from gpufleet.planner.floors import ComputeFloor, StepFloor
from gpufleet.planner.search import SearchSpace, _twin_key, enumerate_layouts, search
from gpufleet.workload.job import Job

pytestmark = pytest.mark.timeout(600)

CATALOG = load_catalog()
CALIBRATION = CATALOG.get("calibrations", "h100-sxm", CalibrationProfile)
COMPUTE_PARTS = ("compute.gemm", "compute.attention", "compute.elementwise", "compute.logits+loss")


@st.composite
def models(draw: st.DrawFn) -> ModelSpec:
    heads = draw(st.sampled_from([4, 8, 16]))
    moe = None
    if draw(st.booleans()):
        experts = draw(st.sampled_from([4, 8]))
        moe = MoESpec(experts=experts, top_k=draw(st.integers(1, 2)), shared_experts=draw(st.integers(0, 1)),
                      expert_ffn_hidden=draw(st.sampled_from([256, 1024])), dense_layers=draw(st.integers(0, 1)))
    return ModelSpec(id="random", name="random", source="test", layers=draw(st.integers(2, 9)),
                     hidden=draw(st.sampled_from([512, 1024, 2048])), heads=heads,
                     kv_heads=draw(st.sampled_from([h for h in (1, 2, 4, heads) if heads % h == 0])),
                     ffn_hidden=draw(st.sampled_from([1024, 4096])), gated_mlp=draw(st.booleans()),
                     vocab=draw(st.sampled_from([8000, 32000])), tied_embeddings=draw(st.booleans()), moe=moe)


@st.composite
def jobs(draw: st.DrawFn) -> tuple[Job, Cluster, StepOptions]:
    """A small job on a GPU whose HBM is drawn small enough that some layouts do not fit."""
    model = draw(models())
    gpus = draw(st.sampled_from([2, 4, 8, 16, 32]))
    gpu = CATALOG.gpu("h100-sxm").model_copy(update={"hbm_gib": draw(st.sampled_from([1.8, 2.5, 4.0, 8.0, 80.0]))})
    node = CATALOG.node("dgx-h100")
    fabric = Fabric(CATALOG.network("ndr400"), oversubscription=draw(st.sampled_from([1.0, 4.0])),
                    nodes_per_leaf=draw(st.sampled_from([None, 1, 2])))
    job = Job(model, tokens=1e9, seq_len=draw(st.sampled_from([256, 1024, 2048])),
              global_batch=draw(st.sampled_from([4, 8, 32, 64])), precision=draw(st.sampled_from(["bf16", "fp8"])))
    options = StepOptions(
        placement=draw(st.sampled_from(["block", "scatter"])), tp_comm_overlap=draw(st.booleans()),
        tp_async_backward=draw(st.booleans()), dp_overlap=draw(st.booleans()), moe_dropless=draw(st.booleans()),
        fused_elementwise=draw(st.booleans()), ep_comm_overlap=draw(st.booleans()),
        ep_dispatch=draw(st.sampled_from(["all-to-all", "dedup"])),
        # the FP8 amax wait (a floor term since it is the pipeline times a share of dp): on, off, and a wide spread
        fp8_recipe=draw(st.sampled_from(["delayed", "current"])),
        fp8_amax_sync_sigma=draw(st.sampled_from([None, 0.2])),
        memory=MemoryAssumptions(selective_policy=draw(st.sampled_from(["attention", "op"])),
                                 tp_gathered_inputs=draw(st.booleans()), flash_attention=draw(st.booleans())))
    return job, Cluster(gpu, node, gpus, fabric), options


SMALL = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SEARCHES = settings(SMALL, max_examples=80)  # a search of a small job takes ~0.1 s


@SEARCHES
@given(jobs(), st.sampled_from([1, 3, 10, 25]))
def test_a_pruned_search_ranks_and_counts_what_the_exhaustive_one_does(drawn: tuple[Job, Cluster, StepOptions],
                                                                       keep: int) -> None:
    job, cluster, options = drawn
    space = SearchSpace(cps=(1, 2), micro_batches=(1, 2, 4))
    everything = search(job, cluster, CALIBRATION, space=space, options=options)
    pruned = search(job, cluster, CALIBRATION, space=space, options=options, keep=keep)
    assert (pruned.tried, pruned.fit, pruned.infeasible, pruned.closest_misses) == (
        everything.tried, len(everything.feasible), everything.infeasible, everything.closest_misses)
    assert len(pruned.feasible) == min(keep, len(everything.feasible))
    for fast, slow in zip(pruned.feasible, everything.feasible, strict=False):
        assert (fast.layout, fast.peak_stage, fast.memory, fast.step) == (slow.layout, slow.peak_stage, slow.memory,
                                                                        slow.step)


def _layouts(job: Job, cluster: Cluster) -> list[Layout]:
    found = list(enumerate_layouts(job, cluster, SearchSpace(cps=(1, 2), micro_batches=(1, 2))))
    return found + [layout.with_(recompute="full", recompute_layers=1) for layout in found[:20] if layout.pp == 1]


@SMALL
@given(jobs())
def test_the_step_floors_never_exceed_the_step(drawn: tuple[Job, Cluster, StepOptions]) -> None:
    job, cluster, options = drawn
    floor = StepFloor(job, cluster, CALIBRATION, options)
    compute_floor = ComputeFloor(job, cluster, CALIBRATION, options)
    for layout in _layouts(job, cluster):
        step = estimate_step(job, layout, cluster, CALIBRATION, options)
        assert floor(layout) <= step.step_s * (1 + 1e-12)
        # a regression guard on a copy: the compute floor adds the step's compute parts in the step's order
        assert compute_floor(layout) == sum(step.parts[name].exposed_s for name in COMPUTE_PARTS)
        assert compute_floor(layout) <= step.step_s


@SMALL
@given(jobs())
def test_one_memory_model_for_all_layouts_gives_each_its_own_numbers(drawn: tuple[Job, Cluster, StepOptions]) -> None:
    job, cluster, options = drawn
    shared = JobMemory(job.model, seq_len=job.seq_len, global_batch=job.global_batch, precision=job.precision,
                       assumptions=options.memory)
    for layout in _layouts(job, cluster):
        kwargs = {"seq_len": job.seq_len, "global_batch": job.global_batch, "precision": job.precision,
                  "assumptions": options.memory}
        assert shared.peak(layout) == peak_stage_memory(job.model, layout, **kwargs)
        for stage in range(layout.pp):
            assert shared.stage(layout, stage) == stage_memory(job.model, layout, stage=stage, **kwargs)


def test_the_peak_is_the_largest_stage() -> None:
    moe = MoESpec(experts=4, top_k=2, expert_ffn_hidden=512, dense_layers=1)
    model = ModelSpec(id="m", name="m", source="test", layers=7, hidden=1024, heads=8, kv_heads=8,
                      ffn_hidden=4096, gated_mlp=True, vocab=32000, moe=moe)
    memory = JobMemory(model, seq_len=1024, global_batch=16, precision="bf16")
    for layout in (Layout(pp=4, dp=2), Layout(pp=2, vpp=2, dp=2, micro_batch=2), Layout(pp=7, recompute="full")):
        stages = [memory.stage(layout, stage) for stage in range(layout.pp)]
        stage, peak = memory.peak(layout)
        assert peak == stages[stage] and peak.total_bytes == max(s.total_bytes for s in stages)


def test_the_twin_key_sees_every_field_but_recompute() -> None:
    """A layout and its no-recompute twin share the key; a change to any other field changes it."""
    layout = Layout(tp=2, pp=2, dp=2, cp=1, ep=1, vpp=2, sequence_parallel=True, sharding="zero1", micro_batch=2,
                    recompute="full", recompute_layers=1, expert_tp=1, offload_activation_layers=None)
    assert _twin_key(layout) == _twin_key(layout.with_(recompute="none", recompute_layers=None))
    other = {"tp": 4, "pp": 4, "dp": 4, "cp": 2, "ep": 2, "vpp": 1, "sequence_parallel": False, "sharding": "zero3",
             "micro_batch": 1, "offload_optimizer": True, "hsdp_group": 4, "order": ("tp", "dp", "cp", "ep", "pp"),
             "expert_tp": 2, "offload_activation_layers": 3}
    assert set(other) == {f.name for f in fields(Layout)} - {"recompute", "recompute_layers"}
    for name, value in other.items():
        assert _twin_key(replace(layout, **{name: value})) != _twin_key(layout), name


def _reference_search(job: Job, cluster: Cluster, options: StepOptions,
                      space: SearchSpace) -> tuple[list[tuple[Layout, float]], int, dict[str, int]]:
    """The search as it was before it was made fast (gpufleet 7f303b8), written plainly: estimate every layout that
    fits, then the block-recompute and offload variants in compute-floor order. (ranked (layout, step), tried,
    infeasible counts)"""
    from collections import Counter

    from gpufleet.planner.search import CHEAPER_VARIANT_RANKS, Candidate, _cheaper_variants, _Estimator, evaluate

    space = replace(space, recomputes=tuple(r for r in space.recomputes if r != "selective")) if (
        options.memory.flash_attention and options.memory.selective_policy == "attention") else space
    feasible: list[Candidate] = []
    reasons: Counter[str] = Counter()
    unfit: set[Layout] = set()
    full_only: list[Candidate] = []
    tried = 0
    for layout in enumerate_layouts(job, cluster, space):
        tried += 1
        outcome = evaluate(job, layout, cluster, CALIBRATION, options)
        if isinstance(outcome, Candidate):
            feasible.append(outcome)
            if layout.recompute == "full" and layout.with_(recompute="none") in unfit:
                full_only.append(outcome)
        else:
            reasons[outcome.reason] += 1
            if outcome.reason == "memory" and layout.recompute == "none":
                unfit.add(layout)
    ranked = sorted(c.step.step_s for c in feasible)
    for floor_s, index in sorted((sum(c.step.parts[n].exposed_s for n in COMPUTE_PARTS), i)
                                 for i, c in enumerate(full_only)):
        threshold = ranked[CHEAPER_VARIANT_RANKS - 1] if len(ranked) >= CHEAPER_VARIANT_RANKS else float("inf")
        if floor_s >= threshold:
            break
        full = full_only[index].layout
        if estimate_step(job, full.with_(recompute="none"), cluster, CALIBRATION, options).step_s >= threshold:
            continue
        for variant in _cheaper_variants(_Estimator(job, cluster, CALIBRATION, options), full):
            tried += 1
            if isinstance(variant, Candidate):
                feasible.append(variant)
                ranked = sorted([*ranked, variant.step.step_s])
            else:
                reasons[variant.reason] += 1
    feasible.sort(key=lambda c: c.step.step_s)
    return [(c.layout, c.step.step_s) for c in feasible], tried, dict(reasons)


@SEARCHES
@given(jobs(), st.sampled_from([1, 10, 20]))
def test_the_search_answers_what_the_plain_search_it_replaced_answered(drawn: tuple[Job, Cluster, StepOptions],
                                                                      keep: int) -> None:
    job, cluster, options = drawn
    space = SearchSpace(cps=(1, 2), micro_batches=(1, 2, 4))
    ranked, tried, infeasible = _reference_search(job, cluster, options, space)
    found = search(job, cluster, CALIBRATION, space=space, options=options, keep=keep)
    assert (found.tried, found.fit, dict(found.infeasible)) == (tried, len(ranked), infeasible)
    assert [(c.layout, c.step.step_s) for c in found.feasible] == ranked[:keep]
