"""Predict published runs with their own layouts and score the error (docs/runs.md, Scoring)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.registry import Catalog
from gpufleet.catalog.stacks import StackRecord
from gpufleet.errors import GpufleetError
from gpufleet.fabric.topology import Cluster
from gpufleet.parallel.layout import Layout, validate_layout
from gpufleet.perf.step import StepEstimate, StepOptions, estimate_step
from gpufleet.planner.intervals import Interval, IntervalTable, Regime, classify_regime
from gpufleet.planner.published_runs import (
    PublishedRun,
    pinned_layout_problem,
    resolve_run_model,
    run_calibration,
    run_cluster,
    run_job,
    run_stack,
    run_stack_choice,
    run_step_options,
)
from gpufleet.planner.search import Infeasible, SearchSpace, evaluate, search
from gpufleet.planner.stack import stack_layout_defaults, stack_search_space
from gpufleet.workload.job import Job

_FILLABLE = ("cp", "ep", "vpp", "sequence_parallel", "sharding", "micro_batch", "recompute")


@dataclass
class RunPrediction:
    """One run: predicted vs target tokens/s per GPU, or why it was skipped."""

    id: str
    quality: str
    target_tokens_per_s_per_gpu: float
    predicted_tokens_per_s_per_gpu: float | None = None
    status: str = "ok"
    filled: list[str] = field(default_factory=list)
    reason: str | None = None
    layout: Layout | None = None
    step: StepEstimate | None = None
    attention_kernel: str | None = None  # the kernel the run's stack used, as validation assumed it
    stack: str | None = None  # the catalog stack whose documented settings validation applied
    stack_defaulted: bool = False  # the run names no stack: it got the documented default
    #: how the run's `stack:` resolved when it named no range id (a release, or a bare family name: the
    #: conservative range assumed); None when it named the record's id or no stack
    stack_said: str | None = None
    stack_version_assumed: bool = False  # the run named a framework without a version
    #: the memory model says the published layout (or every fill of its published fields) does not fit; predicted
    #: anyway, since the run did fit, and counted in the summary
    memory_rejected: bool = False
    eager: bool = False  # priced with eager PyTorch's unfused element-wise kernels (the run says it ran eager)
    published_mfu: float | None = None  # the MFU the run file states (measured.mfu), in its source's FLOP count
    family: str | None = None  # the run's source family (its stack's family, else the stack id): its fold
    regime: Regime | None = None  # planner/intervals.py's regime of the predicted layout
    interval: Interval | None = None  # 80 % interval of the predicted tokens/s per GPU (`attach_intervals`)

    @property
    def predicted_mfu(self) -> float | None:
        return self.step.mfu if self.step is not None else None

    @property
    def derived_mfu(self) -> float | None:
        """The run's measured tokens/s per GPU as MFU by gpufleet's convention (the same model FLOPs per token and
        peak as `predicted_mfu`, workload.flops), so the two compare like for like."""
        if self.step is None:
            return None
        return self.step.model_flops_per_token * self.target_tokens_per_s_per_gpu / self.step.peak_flops

    @property
    def measured_mfu(self) -> tuple[float | None, str | None]:
        """The run's MFU and where it comes from: the run file's own figure, else derived (gpufleet's convention)."""
        if self.published_mfu is not None:
            return self.published_mfu, "run file"
        derived = self.derived_mfu
        return derived, "derived" if derived is not None else None

    @property
    def note(self) -> str:
        """Why it was skipped or what it assumed: filled layout fields, a non-default attention kernel."""
        notes = [self.reason or (f"filled: {', '.join(self.filled)}" if self.filled else "")]
        if self.attention_kernel and self.attention_kernel != "flash":
            notes.append(f"attention: {self.attention_kernel}")
        if self.stack:
            notes.append(f"stack: {self.stack_said or self.stack}"
                         + (" (default: the run names none)" if self.stack_defaulted else ""))
        if self.eager:
            notes.append("eager element-wise")
        return "; ".join(note for note in notes if note)

    @property
    def error(self) -> float | None:
        if self.predicted_tokens_per_s_per_gpu is None:
            return None
        return self.predicted_tokens_per_s_per_gpu / self.target_tokens_per_s_per_gpu - 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "quality": self.quality,
            "predicted_tokens_per_s_per_gpu": self.predicted_tokens_per_s_per_gpu,
            "target_tokens_per_s_per_gpu": self.target_tokens_per_s_per_gpu,
            "error": self.error,
            "status": self.status,
            "filled": self.filled,
            "reason": self.reason,
            "layout": self.layout.short() if self.layout else None,
            "attention_kernel": self.attention_kernel,
            "stack": self.stack,
            "stack_defaulted": self.stack_defaulted,
            "stack_named": self.stack_said,
            "stack_version_assumed": self.stack_version_assumed,
            "eager": self.eager,
            "memory_rejected": self.memory_rejected,
            "measured_mfu": self.measured_mfu[0],
            "measured_mfu_source": self.measured_mfu[1],  # "run file" (its FLOP count) or "derived" (gpufleet's)
            "measured_mfu_derived": self.derived_mfu,
            "predicted_mfu": self.predicted_mfu,
            "family": self.family,
            "regime": self.regime.value if self.regime is not None else None,
            "interval": self.interval.as_json() if self.interval is not None else None,
        }


def predict_run(run: PublishedRun, catalog: Catalog, options: StepOptions | None = None,
                node_id: str | None = None, fitted: Mapping[str, float] | None = None,
                fsdp2_copies: bool | None = None) -> RunPrediction:
    """`_predict_run`, with the regime of the layout it predicted (planner/intervals.py)."""
    result = _predict_run(run, catalog, options, node_id, fitted, fsdp2_copies)
    if result.layout is not None and result.predicted_tokens_per_s_per_gpu is not None:
        precision = run.precision or "bf16"  # run_job's default
        result.regime = classify_regime(resolve_run_model(run, catalog), result.layout, precision,
                                        run.hardware.num_gpus)
    return result


def attach_intervals(predictions: list[RunPrediction], table: IntervalTable) -> None:
    """Give each predicted run the 80 % interval of its predicted tokens/s per GPU from `table`."""
    for prediction in predictions:
        if prediction.regime is not None and prediction.predicted_tokens_per_s_per_gpu is not None:
            prediction.interval = table.around(prediction.predicted_tokens_per_s_per_gpu, prediction.regime)


def _predict_run(run: PublishedRun, catalog: Catalog, options: StepOptions | None = None,
                node_id: str | None = None, fitted: Mapping[str, float] | None = None,
                fsdp2_copies: bool | None = None) -> RunPrediction:
    """Predict one run with its own layout; nulls other than tp/pp/dp are filled by plan's own search (its space,
    narrowed only by what the run's stack lacks, and its memory rule: nothing over HBM). `fitted` replaces the
    recorded calibration fits' values by fit id (cross-validation); `fsdp2_copies` (None: the run's stack's)
    overrides the stack's FSDP2 copies (`validate --fsdp2-copies`)."""
    result = RunPrediction(run.id, run.quality, run.target.tokens_per_s_per_gpu, published_mfu=run.measured.mfu)
    given = run.layout
    missing_core = [name for name in ("tp", "pp", "dp") if getattr(given, name) is None]
    if missing_core:
        result.status, result.reason = "skipped", f"layout lacks {', '.join(missing_core)}"
        return result
    if run.global_batch is None:
        result.status, result.reason = "skipped", "global_batch is null"
        return result
    try:
        cluster = run_cluster(run, catalog, node_id)
        job = run_job(run, run.global_batch, catalog)
        calibration = run_calibration(run, catalog, cluster.gpu.id, fitted)
        stack, result.stack_defaulted = run_stack(run, catalog)
        result.stack, result.family = stack.id, stack.fold
        choice = run_stack_choice(run, catalog)
        if choice is not None and (choice.named != stack.id or choice.assumed):
            result.stack_version_assumed = choice.assumed
            result.stack_said = choice.said if choice.assumed else f"{stack.id} (from {choice.named})"
        options = run_step_options(run, catalog, options)
        if fsdp2_copies is not None:
            options = replace(options, fsdp2_copies=fsdp2_copies)
        result.eager = not options.fused_elementwise
        result.attention_kernel = calibration.attention_kernel
        fixed = _published_fields(run, job, stack)
        result.filled = [name for name in _FILLABLE if fixed[name] is None]
        counts = given.layer_counts()  # the run's block-recompute and offload counts, applied over any fill
        if not result.filled:
            layout = Layout(**dict(fixed.items())).with_(**counts)
            return _predict_layout(result, job, layout, cluster, calibration, options)
        space = stack_search_space(stack, SearchSpace())  # plan --stack's space
        # keep=1: only the fastest fill is used; the pruned search's best is the exhaustive one's
        # (tests/test_search_prune.py), and each run's search then skips estimating layouts that cannot win
        found = search(job, cluster, calibration, space=space, fixed=fixed, options=options, keep=1)
        if found.best is not None:
            if counts:
                return _predict_layout(result, job, found.best.layout.with_(**counts), cluster, calibration, options)
            return _with_step(result, found.best.layout, found.best.step)
        if not found.closest_misses:
            result.status, result.reason = "skipped", f"no legal layout ({dict(found.infeasible)})" \
                if found.infeasible else f"no legal layout: {pinned_layout_problem(run)}"
            return result
        layout, over = found.closest_misses[0]
        if counts:  # the fill the memory model rejected without the run's own offload or block recompute
            return _predict_layout(result, job, layout.with_(**counts), cluster, calibration, options)
        result.memory_rejected = True
        result.reason = (f"memory model rejects every fill of the published fields: closest {over / 2**30:.1f} GiB "
                         "over HBM")
        return _predict_despite_memory(result, job, layout, cluster, calibration, options)
    except GpufleetError as error:
        result.status, result.reason = "skipped", str(error)
    return result


def _published_fields(run: PublishedRun, job: Job, stack: StackRecord) -> dict[str, Any]:
    """The layout fields the run publishes, with what its stack does where the run leaves one null (the stack's
    documented sharding, sequence parallelism, expert TP and micro-batch rule: planner/stack.py, as `plan --stack`
    applies them); None: for the search to fill."""
    given = run.layout
    fixed: dict[str, Any] = {name: getattr(given, name) for name in ("tp", "pp", "dp", *_FILLABLE)}
    if fixed["cp"] is None:
        fixed["cp"] = 1 if (given.tp or 1) * (given.pp or 1) * (given.dp or 1) == run.hardware.num_gpus else None
    if job.model.moe is not None:
        fixed["expert_tp"] = given.expert_tp  # the run's own word wins over the stack's
    if given.recompute_layers is not None and fixed["recompute"] is None:
        fixed["recompute"] = "full"  # block recompute of some layers is full recompute of those
    filled = stack_layout_defaults(stack, fixed, job, local_batches=(given.dp or 1) * (given.pp or 1))
    if job.model.moe is None:
        filled.pop("expert_tp", None)
    return filled


def _predict_layout(result: RunPrediction, job: Job, layout: Layout, cluster: Cluster,
                    calibration: CalibrationProfile, options: StepOptions) -> RunPrediction:
    """`result` with the step of one whole published layout; a layout the memory model rejects is predicted anyway
    (the run did fit) and says so; any other reason it cannot run skips the run."""
    validate_layout(layout, job.model, cluster.gpus, job.global_batch, job.seq_len)  # says what is wrong
    outcome = evaluate(job, layout, cluster, calibration, options)
    if isinstance(outcome, Infeasible):
        if outcome.reason != "memory":
            result.status, result.reason = "skipped", outcome.reason
            return result
        result.memory_rejected = True
        result.reason = f"memory model rejects the published layout: {outcome.over_bytes / 2**30:.1f} GiB over HBM"
        return _predict_despite_memory(result, job, layout, cluster, calibration, options)
    return _with_step(result, outcome.layout, outcome.step)


def _predict_despite_memory(result: RunPrediction, job: Job, layout: Layout, cluster: Cluster,
                            calibration: CalibrationProfile, options: StepOptions | None) -> RunPrediction:
    """A published run did fit: predict it anyway; `result` says that the memory model disagrees."""
    return _with_step(result, layout, estimate_step(job, layout, cluster, calibration, options))


def _with_step(result: RunPrediction, layout: Layout, step: StepEstimate) -> RunPrediction:
    """`result` predicted: the layout priced, its step and tokens/s per GPU."""
    result.layout, result.step = layout, step
    result.predicted_tokens_per_s_per_gpu = step.tokens_per_s_per_gpu
    return result


#: the groups a Summary scores: every predicted run, each quality of measurement, and the two better ones together
SUMMARY_GROUPS = ("all", "high", "medium", "low", "high+medium")


@dataclass(frozen=True, slots=True)
class ErrorStats:
    """Median and worst |error| of tokens/s per GPU over a group of predicted runs (None: no run in it)."""

    runs: int
    median_abs_error: float | None = None
    worst_abs_error: float | None = None
    worst_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "median_abs_error": self.median_abs_error,
                "worst_abs_error": self.worst_abs_error, "worst_id": self.worst_id}


@dataclass(frozen=True)
class Summary:
    """Validate's scores: error statistics per group (SUMMARY_GROUPS), the runs skipped, and the published layouts
    the memory model rejects (predicted anyway, counted in the statistics)."""

    groups: dict[str, ErrorStats]
    skipped: tuple[str, ...] = ()
    memory_rejected: tuple[str, ...] = ()

    @property
    def all(self) -> ErrorStats:
        return self.groups["all"]

    def as_dict(self) -> dict[str, Any]:
        """The `--json` form: one key per group, then "skipped" and "memory_rejected" ({"runs", "ids"})."""
        return {**{group: self.groups[group].as_dict() for group in SUMMARY_GROUPS},
                "skipped": list(self.skipped),
                "memory_rejected": {"runs": len(self.memory_rejected), "ids": list(self.memory_rejected)}}


def error_stats(rows: list[RunPrediction]) -> ErrorStats:
    """Median and worst |error| over the rows that were predicted."""
    errors = [abs(r.error) for r in rows if r.error is not None]
    if not errors:
        return ErrorStats(0)
    worst = max((r for r in rows if r.error is not None), key=lambda r: abs(r.error or 0))
    return ErrorStats(len(errors), statistics.median(errors), max(errors), worst.id)


def summarize(predictions: list[RunPrediction]) -> Summary:
    """Median |error| and worst per quality level and over all runs that were predicted."""
    ok = [p for p in predictions if p.status == "ok"]
    groups = {"all": error_stats(ok)}
    for quality in ("high", "medium", "low"):
        groups[quality] = error_stats([p for p in ok if p.quality == quality])
    groups["high+medium"] = error_stats([p for p in ok if p.quality in ("high", "medium")])
    return Summary(groups, tuple(p.id for p in predictions if p.status == "skipped"),
                   tuple(p.id for p in ok if p.memory_rejected))
