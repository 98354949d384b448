"""The planning request shared by the CLI and the Python API, and the plans it produces.

`make_plan(request, catalog)` resolves names, searches every legal layout, ranks the ones that fit,
and adds time-to-train with failures, cost and power (economics) to the top plans.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from gpufleet.catalog.calibration import AttentionKernel, CalibrationProfile
from gpufleet.catalog.records import NodeSpec, Precision
from gpufleet.catalog.registry import Catalog
from gpufleet.economics.run_economics import RunEconomics, run_economics
from gpufleet.errors import GpufleetError, InfeasibleError, InputError, NoLegalLayoutError
from gpufleet.fabric.topology import Cluster, Fabric, TopologyKind
from gpufleet.parallel.layout import Layout
from gpufleet.perf.step import StepOptions, estimate_step, run_time_s
from gpufleet.planner.input_sense import check_pinned_tp, check_tokens_fill_a_step
from gpufleet.planner.intervals import Interval, IntervalTable, step_interval
from gpufleet.planner.pins import LayoutPins
from gpufleet.planner.published_runs import stack_calibration
from gpufleet.planner.request_rules import check_plan_request
from gpufleet.planner.search import Candidate, SearchResult, SearchSpace, enumerate_layouts, search
from gpufleet.planner.stack import check_stack_precision, stack_layout_defaults, stack_search_space
from gpufleet.reliability.defaults import checkpoint_bytes_per_param
from gpufleet.workload.job import Job
from gpufleet.workload.params import count_params

RankBy = Literal["time", "cost"]



@dataclass(frozen=True)
class PlanRequest:
    """Everything a plan depends on; the CLI builds exactly this."""

    model: str = "llama3-8b"
    tokens: float = 1e12
    gpu: str = "h100-sxm"
    gpus: int = 64
    node: str | None = None  # default: the catalog's node for the GPU
    network: str | None = None  # default: the node's network
    topology: TopologyKind = "fat-tree"
    oversubscription: float = 1.0
    seq_len: int = 4096
    global_batch: int | None = None  # default: ~4M tokens per step (rounded to a power of two)
    precision: Precision = "bf16"
    top: int = 5
    rank_by: RankBy = "time"
    fabric_model: Literal["analytical", "sim"] = "analytical"  # sim re-ranks the top plans by simulation
    options: StepOptions = field(default_factory=StepOptions)
    #: the attention kernel the framework uses where the GPU's calibration says FA2-class (a stack's choice)
    attention_kernel: AttentionKernel | None = None
    stack: str | None = None  # the `plan --stack` name whose settings `options` carry (for the report)
    #: the stack record that name resolved to, and why where the name is not its id (catalog.stacks.StackChoice)
    stack_record: str | None = None
    stack_why: str | None = None
    stack_version_assumed: bool = False  # the name carried no version: the family's conservative range was taken
    #: the layouts the framework offers (a stack without SP, CP or activation offload narrows it)
    search_space: SearchSpace = field(default_factory=SearchSpace)
    #: sites the GPUs split over evenly, and the WAN link between them (planner/sites.py; 1 = one site, no link)
    sites: int = 1
    wan_gbps: float | None = None  # each way, what the link delivers
    wan_latency_s: float | None = None  # one-way
    #: layout fields the user pinned (`plan --tp 8 --pp 2,4 ...`); the stack's layout defaults fill the rest
    pins: LayoutPins = field(default_factory=LayoutPins)

    @property
    def stack_line(self) -> str | None:
        """The stack's line in plan output: the record whose documented settings the plan used, and why when
        --stack named it otherwise (a release, or a bare family name: the conservative range assumed)."""
        if self.stack is None:
            return None
        said = f"{self.stack_record or self.stack}'s documented settings"
        return said + (f" ({self.stack_why})" if self.stack_why else "")

    def __post_init__(self) -> None:
        """The API refuses what the CLI refuses: one InputError naming the field and what it allows
        (planner/request_rules.py)."""
        check_plan_request(self)


@dataclass(frozen=True)
class Plan:
    """One ranked plan: layout, memory, step, and the run it implies."""

    rank: int
    candidate: Candidate
    train_time_s: float  # failure-free
    economics: RunEconomics | None
    #: the 80 % interval of the step time, from the model's own leave-one-source-out error in the plan's regime
    step_interval: Interval | None = None

    @property
    def intervals(self) -> dict[str, Interval]:
        """The 80 % interval of each prediction shown: step time, tokens/s per GPU, time to train, cheapest cost
        (each from the step's, as time to train and cost scale with the step and throughput is its inverse)."""
        step = self.step_interval
        if step is None:
            return {}
        step_s = self.candidate.step.step_s
        found = {"step_s": step, "tokens_per_s_per_gpu": step.inverted(self.candidate.step.tokens_per_s_per_gpu
                                                                        * step_s),
                 "time_to_train_s": step.scaled(self.wall_time_s / step_s)}
        if self.cheapest_usd is not None:
            found["cheapest_usd"] = step.scaled(self.cheapest_usd / step_s)
        return found

    @property
    def layout(self) -> Layout:
        return self.candidate.layout

    @property
    def wall_time_s(self) -> float:
        return self.economics.wall_time_s if self.economics else self.train_time_s

    @property
    def cheapest_usd(self) -> float | None:
        if self.economics is None or self.economics.cheapest_offer is None:
            return None
        return self.economics.cheapest_offer.usd


@dataclass
class PlanResult:
    request: PlanRequest
    job: Job
    cluster: Cluster
    search: SearchResult
    plans: list[Plan]
    #: why cost, power and goodput are missing from the plans (the cluster cannot be built or priced), if they are
    economics_error: str | None = None


#: The default global batch aims at Llama 3's first batch, 4M tokens per step, and never exceeds its last, 16M
#: tokens (2,048 sequences of 8,192), the batch Meta trained Llama 3 405B with on 16,384 H100s ("The Llama 3 Herd
#: of Models", arXiv 2407.21783, section 3.4.1 and Table 4). Without the cap a default of one sequence per GPU grew
#: to 67M tokens at 16K GPUs and 4K tokens, and its MFU (54% for 405B) beat anything measured (Meta: 38-43%).
DEFAULT_BATCH_TOKENS = 4 * 2**20
DEFAULT_BATCH_MAX_TOKENS = 16 * 2**20


def default_global_batch(seq_len: int, gpus: int) -> int:
    """About 4M tokens per step, at least one sequence per GPU, at most 16M tokens; a power of two."""
    target = max(DEFAULT_BATCH_TOKENS // seq_len, gpus)
    most = 2 ** math.floor(math.log2(max(1, DEFAULT_BATCH_MAX_TOKENS // seq_len)))
    return min(2 ** math.ceil(math.log2(target)), most)


def default_batch_rule(seq_len: int, gpus: int) -> str:
    """Which part of the default-batch rule set the batch for this job, in words."""
    batch = default_global_batch(seq_len, gpus)
    if batch * seq_len >= DEFAULT_BATCH_MAX_TOKENS and gpus > batch:
        why = (f"capped at {DEFAULT_BATCH_MAX_TOKENS / 2**20:.0f}M tokens, Llama 3 405B's batch on 16,384 GPUs "
               "(fewer sequences than GPUs: the rest of the GPUs go to model parallelism)")
    elif gpus * seq_len > DEFAULT_BATCH_TOKENS:
        why = "one sequence per GPU, rounded up to a power of two"
    else:
        why = f"about {DEFAULT_BATCH_TOKENS / 2**20:.0f}M tokens per step (Llama 3's first batch)"
    return f"{batch:,} sequences = {batch * seq_len / 2**20:,.1f}M tokens, the planner's default: {why}"


def pipeline_warning(plan: Plan) -> str | None:
    """Why a plan's pipeline never fills (fewer micro-batches per step than stages), or None."""
    pp, micro_batches = plan.layout.pp, plan.candidate.step.micro_batches
    if pp <= 1 or micro_batches >= pp:
        return None
    fills = pp * plan.layout.dp * plan.layout.micro_batch  # sequences per step that give pp micro-batches
    return (f"plan #{plan.rank} pushes {micro_batches} micro-batch{'es' if micro_batches != 1 else ''} per step "
            f"through {pp} pipeline stages: the pipeline never fills (at most {micro_batches} of {pp} stages work "
            f"at once); --global-batch {fills:,} or more fills it for this layout")


def request_node(request: PlanRequest, catalog: Catalog) -> NodeSpec:
    """The node type the request names, else the catalog's node for its GPU (whole, before a job spreads)."""
    return catalog.node(request.node) if request.node else catalog.node_for_gpu(catalog.gpu(request.gpu).id)


def build_cluster(request: PlanRequest, catalog: Catalog) -> Cluster:
    gpu = catalog.gpu(request.gpu)
    node = request_node(request, catalog)
    network = catalog.network(request.network or node.default_network)
    fabric = Fabric(network=network, kind=request.topology, oversubscription=request.oversubscription)
    profile = catalog.records("calibrations").get(gpu.id)  # its measured collectives, if any, price this cluster's
    measured = profile.collectives if isinstance(profile, CalibrationProfile) else ()
    return Cluster(gpu=gpu, node=node, gpus=request.gpus, fabric=fabric, collective_calibration=measured,
                   scale_up_step_latency_s=catalog.judgements().scale_up_step_latency_s)


def build_job(request: PlanRequest, catalog: Catalog) -> Job:
    model = catalog.model(request.model)
    batch = request.global_batch or default_global_batch(request.seq_len, request.gpus)
    return Job(model=model, tokens=request.tokens, seq_len=request.seq_len, global_batch=batch,
               precision=request.precision)


def search_bounds(request: PlanRequest, catalog: Catalog, job: Job) -> tuple[SearchSpace, dict[str, Any]]:
    """The space the request's stack can run and the fields pinned: the user's pins, then the stack's layout
    defaults in the fields left free (planner/stack.py, as `validate` fills a run's null fields)."""
    fixed: dict[str, Any] = request.pins.given()
    if request.stack is None:
        return request.search_space, fixed
    stack = catalog.stack(request.stack)
    check_stack_precision(stack, job.precision)
    space = stack_search_space(stack, request.search_space)
    return space, stack_layout_defaults(stack, fixed, job, _local_batches(request.pins, request.gpus, space))


def _local_batches(pins: LayoutPins, gpus: int, space: SearchSpace) -> int | None:
    """Micro-batches' worth of local batches per step (dp × pp) when the pins fix them (tp, pp and cp, or cp
    because the space has only cp = 1), else None."""
    tp, pp = pins.scalar("tp"), pins.scalar("pp")
    cp = pins.scalar("cp") or (1 if space.cps == (1,) else None)
    if tp is None or pp is None or cp is None or gpus % (tp * pp * cp):
        return None
    return gpus // (tp * pp * cp) * pp


def make_plan(request: PlanRequest, catalog: Catalog,
              progress: Callable[[int], None] | None = None) -> PlanResult:
    """Search, rank and cost. Raises InfeasibleError (with the closest misses) when nothing fits in memory, and
    NoLegalLayoutError when the GPU count cannot be split into any layout at all. The model's judgement constants
    are `catalog`'s unless the request's StepOptions name their own (`StepOptions.judgements`): the result's
    request carries the options as priced."""
    request = replace(request, options=request.options.with_judgements(catalog.judgements()))
    cluster = build_cluster(request, catalog)
    job = build_job(request, catalog)
    check_tokens_fill_a_step(job)
    check_pinned_tp(request.pins, job, cluster.gpus, request.search_space.max_tp or cluster.gpus_per_node)
    gpu = cluster.gpu
    gpu.peak_flops(job.precision)  # fail early on an unsupported precision
    calibration = stack_calibration(catalog.calibration(gpu.id), request.attention_kernel)
    pool_size = max(request.top * 4, 20)  # the fastest layouts whose cost and run time are computed
    if request.sites != 1 or request.wan_gbps is not None or request.wan_latency_s is not None:
        from gpufleet.planner.sites import search_request_sites

        # exhaustive: the WAN time is added after each step estimate, so the search's step floors do not bound it
        if request.pins.given():
            raise InputError("layout flags (--tp, --pp, ...) price one site's layouts; drop them or --sites")
        found = search_request_sites(request, job, cluster, calibration, progress)
    else:
        space, fixed = search_bounds(request, catalog, job)
        found = search(job, cluster, calibration, space=space, fixed=fixed, options=request.options,
                       progress=progress, keep=pool_size)
    if not found.feasible:
        if not found.tried:
            raise NoLegalLayoutError(describe_no_legal_layout(request, catalog, job, cluster))
        raise InfeasibleError(describe_no_fit(found, cluster))
    checkpoint_bytes = count_params(job.model).total * checkpoint_bytes_per_param(catalog)
    ranked: list[Plan] = []
    economics_error: str | None = None
    pool = found.feasible[:pool_size]
    if request.fabric_model == "sim":
        # The flow-level simulator re-times every collective of the analytically best plans.
        sim_options = replace(request.options, fabric_model="sim")
        pool = sorted((Candidate(c.layout, c.peak_stage, c.memory,
                                 estimate_step(job, c.layout, cluster, calibration, sim_options))
                       for c in pool[: max(request.top * 2, 8)]), key=lambda c: c.step.step_s)
    for candidate in pool:
        train_s = run_time_s(job, candidate.step)
        try:
            economics = run_economics(catalog, node=cluster.node, gpus=cluster.gpus, train_time_s=train_s,
                                      checkpoint_bytes=checkpoint_bytes, utilization_mfu=candidate.step.mfu)
        except GpufleetError as error:  # the step estimate stands; say why the bill is missing
            economics, economics_error = None, str(error)
        ranked.append(Plan(0, candidate, train_s, economics))
    if request.rank_by == "cost":
        ranked.sort(key=lambda p: (p.cheapest_usd if p.cheapest_usd is not None else math.inf, p.wall_time_s))
    else:
        ranked.sort(key=lambda p: p.wall_time_s)
    table = IntervalTable.from_record(catalog.interval_table())
    plans = [Plan(i + 1, p.candidate, p.train_time_s, p.economics,
                  step_interval(job, p.layout, cluster.gpus, p.candidate.step.step_s, table))
             for i, p in enumerate(ranked[: request.top])]
    if all(plan.economics is not None for plan in plans):
        economics_error = None  # only layouts that were not shown lacked a bill
    return PlanResult(request, job, cluster, found, plans, economics_error)


def describe_no_fit(found: SearchResult, cluster: Cluster) -> str:
    """Why nothing fits: counts by reason, the smallest shortfall and the layout that came closest."""
    reasons = ", ".join(f"{count} {reason}" for reason, count in found.infeasible.most_common())
    if found.closest_misses:
        layout, over = found.closest_misses[0]
        return (f"no layout fits on {cluster.gpus} x {cluster.gpu.id} ({found.tried} tried: {reasons}); "
                f"closest: {layout.short()} needs {over / 2**30:.1f} GiB more than the "
                f"{cluster.gpu.hbm_bytes / 2**30:.0f} GiB of HBM — add GPUs, shorten the sequence, "
                f"or use a GPU with more memory")
    return f"no legal layout for this job on {cluster.gpus} GPUs ({found.tried} tried: {reasons})"


#: How many GPU counts on each side describe_no_legal_layout tries before giving up on naming the nearest legal
#: one (each try is a layout enumeration; bounded so that a hopeless count answers in about a second).
NEAREST_COUNTS_TRIED = 64


def _nearby_counts(n: int, step: int) -> tuple[list[int], list[int]]:
    """GPU counts to try below and above n, nearest first: the NEAREST_COUNTS_TRIED multiples of `step` on each
    side, then n rounded down and up to step·2^k (legal counts are mostly multiples of a large power of two, since
    the batch and the head count usually are)."""
    lows = set(range((n - 1) // step * step, 0, -step)[:NEAREST_COUNTS_TRIED])
    highs = set(range((n // step + 1) * step, 2 * n + step, step)[:NEAREST_COUNTS_TRIED])
    multiple = step
    while multiple <= 2 * n:
        lows.add((n - 1) // multiple * multiple)
        highs.add((n // multiple + 1) * multiple)
        multiple *= 2
    return sorted((count for count in lows if count > 0), reverse=True), sorted(highs)


def _has_legal_layout(request: PlanRequest, catalog: Catalog, gpus: int) -> bool:
    try:
        sized = replace(request, gpus=gpus)
        return next(enumerate_layouts(build_job(sized, catalog), build_cluster(sized, catalog),
                                      request.search_space, request.pins.given()), None) is not None
    except GpufleetError:  # the count does not fit the nodes, or the job is malformed at that size
        return False


def describe_no_legal_layout(request: PlanRequest, catalog: Catalog, job: Job, cluster: Cluster) -> str:
    """Why no layout exists at all (the GPUs cannot be split so that every degree divides what it splits), and
    the nearest GPU counts where one does."""
    n = cluster.gpus
    node_gpus = request_node(request, catalog).gpus
    step = node_gpus if n > node_gpus else 1  # beyond one node, suggest counts that fill whole nodes
    lows, highs = _nearby_counts(n, step)
    below = next((count for count in lows if _has_legal_layout(request, catalog, count)), None)
    above = next((count for count in highs if _has_legal_layout(request, catalog, count)), None)
    nearest = " or ".join(str(count) for count in (below, above) if count is not None)
    max_tp = request.search_space.max_tp or cluster.gpus_per_node
    partial = (f" ({n:,} GPUs are not a whole number of {node_gpus}-GPU nodes: {cluster.gpus_per_node} on each "
               f"of {cluster.num_nodes})" if n > node_gpus and n % node_gpus else "")
    return (f"no legal layout for this job on {n} GPUs{partial}: no split into tp (at most {max_tp}, dividing "
            f"{job.model.heads} heads) x pp (at most {job.model.layers} layers) x cp x dp leaves a dp that divides "
            f"the global batch of {job.global_batch} sequences"
            + (f"; nearest GPU counts with a legal layout: {nearest}" if nearest else "")
            + " (or set --global-batch)")
