"""Predict published runs with their own layouts and score the error (docs/runs.md, Scoring)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.registry import Catalog
from gpufleet.errors import GpufleetError
from gpufleet.fabric.topology import Cluster
from gpufleet.parallel.layout import Layout, validate_layout
from gpufleet.perf.step import StepEstimate, StepOptions, estimate_step
from gpufleet.planner.runs import (
    PublishedRun,
    matched_stack,
    pinned_layout_problem,
    recipe_search_space,
    run_calibration,
    run_cluster,
    run_job,
    run_step_options,
)
from gpufleet.planner.search import Candidate, SearchSpace, evaluate, search
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
    stack: str | None = None  # the STACK_RECIPES key whose documented settings validation applied
    eager: bool = False  # priced with eager PyTorch's unfused element-wise kernels (the run says it ran eager)

    @property
    def note(self) -> str:
        """Why it was skipped or what it assumed: filled layout fields, a non-default attention kernel."""
        notes = [self.reason or (f"filled: {', '.join(self.filled)}" if self.filled else "")]
        if self.attention_kernel and self.attention_kernel != "flash":
            notes.append(f"attention: {self.attention_kernel}")
        if self.stack:
            notes.append(f"stack: {self.stack}")
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
            "eager": self.eager,
        }


#: How far over HBM (as a fraction) a layout filling a published run's null fields may be (FILL_SPACE's
#: hbm_tolerance; `plan` admits nothing over). A judgement: 3.6 % was the memory model's largest over-estimate
#: in docs/memory.md's calibration table when it was set; that table's largest is now +1.2 %. A published run
#: did fit, so a layout that the model puts within this margin over HBM may be the one it ran.
MEMORY_MODEL_OVERESTIMATE = 0.036
#: Values tried for a run's null layout fields: every degree the stacks offer, wider than `plan`'s default
#: search (ZeRO-2, as FSDP's SHARD_GRAD_OP and Llama 3's training used; up to 8 virtual stages, as
#: Megatron-Bridge's 405B recipes use).
FILL_SPACE = SearchSpace(max_tp=64, shardings=("none", "zero1", "zero2", "zero3"), vpps=(1, 2, 4, 8),
                         hbm_tolerance=MEMORY_MODEL_OVERESTIMATE)


def predict_run(run: PublishedRun, catalog: Catalog, options: StepOptions | None = None,
                node_id: str | None = None) -> RunPrediction:
    """Predict one run with its own layout; nulls other than tp/pp/dp are filled by the planner."""
    result = RunPrediction(run.id, run.quality, run.target.tokens_per_s_per_gpu)
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
        calibration = run_calibration(run, catalog, cluster.gpu.id)
        options = run_step_options(run, options)
        result.eager = not options.fused_elementwise
        result.attention_kernel = calibration.attention_kernel
        fixed = {name: getattr(given, name) for name in ("tp", "pp", "dp", *_FILLABLE)}
        if fixed["cp"] is None:
            fixed["cp"] = 1 if (given.tp or 1) * (given.pp or 1) * (given.dp or 1) == run.hardware.num_gpus \
                else None
        matched = matched_stack(run)
        recipe = matched[1] if matched else None
        result.stack = matched[0] if matched else None
        space = FILL_SPACE
        if recipe is not None:  # what the stack is documented to use is not the planner's to choose
            if recipe.sharding is not None and fixed["sharding"] is None:
                fixed["sharding"] = recipe.sharding
            if recipe.sequence_parallel is not None and fixed["sequence_parallel"] is None:
                fixed["sequence_parallel"] = recipe.sequence_parallel
            if job.model.moe is not None and recipe.expert_tp is not None:
                fixed["expert_tp"] = recipe.expert_tp
            local_batches = (given.dp or 1) * (given.pp or 1)  # tp, pp, dp are known here
            if (recipe.micro_batches_per_pp_stage and fixed["micro_batch"] is None
                    and run.global_batch % local_batches == 0):
                fixed["micro_batch"] = run.global_batch // local_batches
            if recipe.vpps is not None:
                space = replace(space, vpps=recipe.vpps)
            space = recipe_search_space(recipe, space)
        if job.model.moe is not None and given.expert_tp is not None:  # the run's own word wins
            fixed["expert_tp"] = given.expert_tp
        result.filled = [name for name in _FILLABLE if fixed[name] is None]
        if not result.filled:
            layout = Layout(**dict(fixed.items()))
            validate_layout(layout, job.model, cluster.gpus, job.global_batch, job.seq_len)  # says what is wrong
            outcome = evaluate(job, layout, cluster, calibration, options)
            if isinstance(outcome, Candidate):
                candidate = outcome
            else:
                reason, over = outcome
                if reason != "memory":
                    result.status, result.reason = "skipped", reason
                    return result
                return _predict_despite_memory(result, job, layout, cluster, calibration, options, over)
        else:
            found = search(job, cluster, calibration, space=space, fixed=fixed, options=options)
            if found.best is None:
                if not found.closest_misses:
                    result.status, result.reason = "skipped", f"no legal layout ({dict(found.infeasible)})" \
                        if found.infeasible else f"no legal layout: {pinned_layout_problem(run)}"
                    return result
                layout, over = found.closest_misses[0]
                return _predict_despite_memory(result, job, layout, cluster, calibration, options, over)
            candidate = found.best
        result.layout, result.step = candidate.layout, candidate.step
        result.predicted_tokens_per_s_per_gpu = candidate.step.tokens_per_s_per_gpu
    except GpufleetError as error:
        result.status, result.reason = "skipped", str(error)
    return result


def _predict_despite_memory(result: RunPrediction, job: Job, layout: Layout, cluster: Cluster,
                            calibration: CalibrationProfile, options: StepOptions | None,
                            over_bytes: float) -> RunPrediction:
    """A published run did fit: predict it anyway and say that the memory model disagrees."""
    step = estimate_step(job, layout, cluster, calibration, options)
    result.reason = f"memory model says {over_bytes / 2**30:.1f} GiB over HBM"
    result.layout, result.step = layout, step
    result.predicted_tokens_per_s_per_gpu = step.tokens_per_s_per_gpu
    return result


def summarize(predictions: list[RunPrediction]) -> dict[str, Any]:
    """Median |error| and worst per quality level and over all runs that were predicted."""

    def stats(rows: list[RunPrediction]) -> dict[str, Any]:
        errors = [abs(r.error) for r in rows if r.error is not None]
        if not errors:
            return {"runs": 0, "median_abs_error": None, "worst_abs_error": None, "worst_id": None}
        worst = max((r for r in rows if r.error is not None), key=lambda r: abs(r.error or 0))
        return {"runs": len(errors), "median_abs_error": statistics.median(errors),
                "worst_abs_error": max(errors), "worst_id": worst.id}

    ok = [p for p in predictions if p.status == "ok"]
    summary: dict[str, Any] = {"all": stats(ok)}
    for quality in ("high", "medium", "low"):
        summary[quality] = stats([p for p in ok if p.quality == quality])
    summary["high+medium"] = stats([p for p in ok if p.quality in ("high", "medium")])
    summary["skipped"] = [p.id for p in predictions if p.status == "skipped"]
    return summary
