"""The numbers behind a plan's HTML report, computed from a `PlanResult` (no HTML here).

What `make_plan` already gives (ranked plans, step parts, the bill) is reused; what the report adds is cheap:

* memory of every pipeline stage of each shown plan (`stage_memory`, one call per stage);
* scaling: for one GPU count, the best plan's layout with its data-parallel degree scaled to nearby counts
  (÷4 … ×4), each re-estimated — not re-searched, so a curve shows how *this* layout scales, which is what a
  team growing or shrinking the cluster would run first — at the request's oversubscription and at 1:1, 2:1
  and 4:1 (judgement: the values fabric designs offer). A sweep (`plan -n 64-1024`) gives the searched best
  plan per count instead;
* cost over calendar months, cloud against on-prem (`onprem_tco`), with the break-even month;
* goodput against checkpoint interval (Daly's model, the plan's write, restart and interruption times).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpufleet.catalog.economics_records import CloudOffer
from gpufleet.catalog.records import NetworkSpec
from gpufleet.catalog.registry import Catalog
from gpufleet.economics.cloud import billed_gpus, offers_for_gpu
from gpufleet.economics.defaults import facility_defaults
from gpufleet.economics.run_economics import RunEconomics, run_economics
from gpufleet.economics.tco import HOURS_PER_MONTH, onprem_tco
from gpufleet.errors import GpufleetError
from gpufleet.parallel.memory import MemoryBreakdown, peak_stage_memory, stage_memory
from gpufleet.perf.step import estimate_step, run_time_s
from gpufleet.planner.plan import (
    Plan,
    PlanRequest,
    PlanResult,
    build_cluster,
    build_job,
    request_node,
)
from gpufleet.planner.published_runs import stack_calibration
from gpufleet.reliability.defaults import checkpoint_bytes_per_param
from gpufleet.reliability.goodput import goodput
from gpufleet.workload.params import count_params

#: GPU counts the one-count scaling chart tries, as multiples of the planned count (judgement: two halvings and
#: two doublings show the trend at five estimates per curve).
SCALING_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
#: Oversubscriptions drawn next to the request's own (judgement: the ratios fabric designs commonly offer).
SCALING_OVERSUBSCRIPTIONS = (1.0, 2.0, 4.0)
#: Checkpoint intervals drawn around Daly's optimum, as multiples of it (log-spaced from 1/30 to 30x).
GOODPUT_SPAN = 30.0
GOODPUT_POINTS = 41
#: Cloud lines on the cost chart: the cheapest offer of each pricing model, at most this many (the palette has
#: eight colours, one goes to on-prem; more lines would not be told apart).
MAX_CLOUD_LINES = 5


@dataclass(frozen=True)
class ScalingPoint:
    curve: str  # e.g. "fat-tree 1:1"
    gpus: int
    tokens_per_s_per_gpu: float
    time_to_train_s: float


@dataclass(frozen=True)
class CostLine:
    """Cumulative dollars after m calendar months: upfront_usd + usd_per_month x m."""

    name: str
    upfront_usd: float
    usd_per_month: float


@dataclass(frozen=True)
class CostOverTime:
    lines: tuple[CostLine, ...]  # on-prem first, then cloud offers
    utilization: float  # fraction of hours the cluster does work, for both cloud and on-prem
    breakeven_months: float | None  # on-prem against `reference`
    reference: str  # the cloud line the break-even is against (the cheapest shown)
    run_months: float  # this run's wall time
    horizon_months: float
    hardware_life_months: float  # the amortization period of the owned hardware


@dataclass(frozen=True)
class GoodputCurve:
    points: tuple[tuple[float, float], ...]  # (checkpoint interval s, goodput)
    chosen_interval_s: float
    write_s: float
    restart_s: float
    mtti_s: float


@dataclass(frozen=True)
class PlanFigures:
    """Everything the plan report draws."""

    result: PlanResult
    stages: tuple[tuple[MemoryBreakdown, ...], ...]  # per shown plan, per pipeline stage
    scaling: tuple[ScalingPoint, ...]
    scaling_searched: bool  # True: best plan per count from a sweep; False: plan #1's layout, dp scaled
    cost: CostOverTime | None
    goodput: GoodputCurve | None
    deadline_s: float | None = None


def plan_figures(result: PlanResult, catalog: Catalog, sweep: tuple[ScalingPoint, ...] | None = None,
                 deadline_s: float | None = None) -> PlanFigures:
    """The report's numbers for `result`; `sweep` (from `plan -n A-B`) replaces the one-count scaling estimate."""
    best = result.plans[0]
    return PlanFigures(
        result=result,
        stages=tuple(stages_of(result, plan) for plan in result.plans),
        scaling=sweep if sweep is not None else scaling_points(result, catalog),
        scaling_searched=sweep is not None,
        cost=cost_over_time(result, best, catalog),
        goodput=goodput_curve(best.economics) if best.economics else None,
        deadline_s=deadline_s,
    )


def stages_of(result: PlanResult, plan: Plan) -> tuple[MemoryBreakdown, ...]:
    job, layout = result.job, plan.layout
    return tuple(stage_memory(job.model, layout, seq_len=job.seq_len, global_batch=job.global_batch,
                              precision=job.precision, stage=stage, assumptions=result.request.options.memory)
                 for stage in range(layout.pp))


def scaling_points(result: PlanResult, catalog: Catalog) -> tuple[ScalingPoint, ...]:
    """Plan #1's layout at nearby GPU counts (dp scaled) and oversubscriptions, where it is legal and fits."""
    request, layout = result.request, result.plans[0].layout
    ratios = sorted({request.oversubscription, *SCALING_OVERSUBSCRIPTIONS})
    calibration = stack_calibration(catalog.calibration(result.cluster.gpu.id), request.attention_kernel)
    checkpoint_bytes = count_params(result.job.model).total * checkpoint_bytes_per_param(catalog)
    points: list[ScalingPoint] = []
    for ratio in ratios:
        curve = f"{request.topology} {ratio:g}:1"
        for factor in SCALING_FACTORS:
            dp = layout.dp * factor
            gpus = round(result.cluster.gpus * factor)
            if dp < 1 or dp != int(dp):
                continue
            sized = replace(request, gpus=gpus, oversubscription=ratio)
            try:
                job, cluster = build_job(sized, catalog), build_cluster(sized, catalog)
                scaled = replace(layout, dp=int(dp))
                _, memory = peak_stage_memory(job.model, scaled, seq_len=job.seq_len, global_batch=job.global_batch,
                                              precision=job.precision, assumptions=request.options.memory)
                if memory.total_bytes > cluster.gpu.hbm_bytes:
                    continue
                step = estimate_step(job, scaled, cluster, calibration, request.options)
                train_s = run_time_s(job, step)
                wall_s = _wall_time_s(catalog, sized, cluster.gpus, train_s, checkpoint_bytes, step.mfu)
            except GpufleetError:  # not a legal layout at that count: no point
                continue
            points.append(ScalingPoint(curve, gpus, step.tokens_per_s_per_gpu, wall_s))
    return tuple(points)


def _wall_time_s(catalog: Catalog, request: PlanRequest, gpus: int, train_s: float, checkpoint_bytes: float,
                 mfu: float) -> float:
    """Time-to-train with failures where the economics can be computed, else the failure-free time."""
    node = request_node(request, catalog)
    try:
        return run_economics(catalog, node=node, gpus=gpus, train_time_s=train_s, checkpoint_bytes=checkpoint_bytes,
                             utilization_mfu=mfu).wall_time_s
    except GpufleetError:
        return train_s


def _cloud_lines(offers: list[CloudOffer], gpus: int, utilization: float) -> list[CostLine]:
    """The cheapest offer of each pricing model (on-demand, spot, reserved …), cheapest first."""
    cheapest: dict[str, CloudOffer] = {}
    for offer in offers:  # offers_for_gpu sorts cheapest first
        cheapest.setdefault(offer.pricing, offer)
    return [CostLine(f"cloud: {offer.id} ({offer.pricing}, ${offer.usd_per_gpu_hour:g}/GPU-h)", 0.0,
                     offer.usd_per_gpu_hour * billed_gpus(gpus, offer) * HOURS_PER_MONTH * utilization)
            for offer in list(cheapest.values())[:MAX_CLOUD_LINES]]


def cost_over_time(result: PlanResult, plan: Plan, catalog: Catalog) -> CostOverTime | None:
    """Cumulative cost of keeping this cluster busy a fraction u of the hours: rented (each pricing model's
    cheapest offer) against owned (capex up front, then opex at u). None if the cluster cannot be priced."""
    econ = plan.economics
    if econ is None:
        return None
    defaults = facility_defaults(catalog)
    node, gpus, u = result.cluster.node, result.cluster.gpus, econ.onprem_utilization
    network = catalog.records("networks").get(node.default_network)
    lines = _cloud_lines(offers_for_gpu(catalog, node.gpu), gpus, u)
    breakeven = None
    reference = lines[0].name if lines else ""
    try:
        tco = onprem_tco(catalog, node, gpus, defaults, network if isinstance(network, NetworkSpec) else None,
                         mfu=plan.candidate.step.mfu)
    except GpufleetError:  # no purchase price: the cloud lines alone
        onprem: list[CostLine] = []
    else:
        onprem = [CostLine(f"on-prem: buy and run ({defaults.amortization_years:g}-year hardware)",
                           tco.capex.total_usd, tco.opex_usd_per_month(u))]
        if lines:
            breakeven = _crossing_months(onprem[0], lines[0])
    run_months = econ.wall_time_s / 3600.0 / HOURS_PER_MONTH
    horizon = max(defaults.amortization_years * 12.0, run_months * 1.2, (breakeven or 0.0) * 1.2)
    return CostOverTime(tuple(onprem + lines), u, breakeven, reference, run_months, horizon,
                        defaults.amortization_years * 12.0)


def _crossing_months(owned: CostLine, rented: CostLine) -> float | None:
    """Month at which owning has cost as much as renting (equal to `OnPremTco.breakeven_months`), or None."""
    saving = rented.usd_per_month - owned.usd_per_month
    return (owned.upfront_usd - rented.upfront_usd) / saving if saving > 0 else None


def goodput_curve(econ: RunEconomics) -> GoodputCurve:
    """Goodput at checkpoint intervals from 1/30 to 30x the chosen (Daly-optimal) one, log-spaced."""
    chosen = econ.checkpoint_interval_s
    points = []
    for i in range(GOODPUT_POINTS):
        interval = chosen * GOODPUT_SPAN ** (2 * i / (GOODPUT_POINTS - 1) - 1)
        try:
            points.append((interval, goodput(interval_s=interval, write_s=econ.checkpoint_write_s,
                                             restart_s=econ.restart_s, mtti_s=econ.mtti_s)))
        except GpufleetError:  # the job cannot progress at this interval
            continue
    return GoodputCurve(tuple(points), chosen, econ.checkpoint_write_s, econ.restart_s, econ.mtti_s)

