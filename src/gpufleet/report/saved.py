"""Reading back what `plan --json` wrote, so `gpufleet report PLAN.json` can draw it.

The JSON keeps the plan's numbers for scripts but not everything the report draws (memory of every stage,
nearby GPU counts, cost curves). Rather than widen the JSON for every caller, plan records the exact request
(`"request"`, every field of `PlanRequest`) and the version that wrote it; the report re-runs that request with
today's catalog and checks that it finds the same plans, with the same step times, before drawing anything.
A file from another version, or one whose plans a re-run no longer reproduces, is refused with one line.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from gpufleet import __version__
from gpufleet.catalog.registry import Catalog
from gpufleet.errors import GpufleetError, InfeasibleError, InputError, NoLegalLayoutError
from gpufleet.planfile import read_plan_file
from gpufleet.planner.plan import Plan, PlanRequest, PlanResult, make_plan
from gpufleet.planner.request_file import request_from_dict
from gpufleet.report.plan_figures import PlanFigures, ScalingPoint, plan_figures

#: Relative difference in a step time above which a re-run is "not the same plan" (float noise is ~1e-15).
RERUN_TOLERANCE = 1e-6


@dataclass(frozen=True)
class SavedPlan:
    request: PlanRequest
    #: one count: the layouts shown, in order, with their step times; a sweep: each count's best, keyed "N GPUs"
    plans: tuple[tuple[str, float], ...]
    counts: tuple[int, ...] | None  # a sweep's GPU counts
    deadline_s: float | None


def read_saved_plan(data: Any, name: str) -> SavedPlan:
    """Check that `data` is a plan written by this version of gpufleet and take out what a re-run needs."""
    saved = read_plan_file(data, name)
    if saved.gpufleet_version != __version__:
        raise InputError(f"{name} was written by gpufleet {saved.gpufleet_version}; this is {__version__} — plan it "
                         "again with this version (gpufleet plan ... --json)")
    request = request_from_dict(saved.request, where=f"{name}: request")
    if saved.sweep is not None:
        counts = tuple(row.gpus for row in saved.sweep)
        best = tuple((f"{row.gpus}:{row.layout.label}", float(row.step_s)) for row in saved.sweep
                     if row.fits and row.layout is not None and row.step_s is not None)
        return SavedPlan(request, best, counts, saved.deadline_s)
    plans = tuple((plan.layout.label, plan.step_s) for plan in saved.plans or [])
    if not plans:
        raise InputError(f"{name} holds no plan to report (the plan it records found none)")
    return SavedPlan(request, plans, None, None)


def rerun_figures(saved: SavedPlan, catalog: Catalog, name: str) -> PlanFigures:
    """Re-run the saved request and return the report's figures, if the re-run reproduces the saved plans."""
    if saved.counts is not None:
        results = sweep_results(saved.request, saved.counts, catalog)
        found = {f"{count}:{r.plans[0].layout.short()}": r.plans[0] for count, r in results.items()}
        _check_same(found, saved.plans, name)
        return sweep_report_figures(results, catalog, saved.deadline_s)
    result = make_plan(saved.request, catalog)
    found = {plan.layout.short(): plan for plan in result.plans}
    _check_same(found, saved.plans, name)
    result.plans = [found[label] for label, _ in saved.plans]
    return plan_figures(result, catalog)


def _check_same(found: dict[str, Plan], saved: tuple[tuple[str, float], ...], name: str) -> None:
    """Every saved plan (by label) is among the re-run's, with the same step time."""
    for label, step_s in saved:
        plan = found.get(label)
        if plan is None or not math.isclose(plan.candidate.step.step_s, step_s, rel_tol=RERUN_TOLERANCE):
            raise InputError(f"{name}: re-planning its request no longer gives plan {label} with a {step_s:.4g} s "
                             "step — the catalog differs from the one it was planned with (pass the same "
                             "--catalog files) or the model changed; plan it again")


def sweep_results(base: PlanRequest, counts: tuple[int, ...], catalog: Catalog) -> dict[int, PlanResult]:
    """The best plan at each count of a sweep that has one (as `plan -n A-B` plans them)."""
    results: dict[int, PlanResult] = {}
    for count in sorted(counts):
        try:
            results[count] = make_plan(dataclasses.replace(base, gpus=count, top=1), catalog)
        except (InfeasibleError, NoLegalLayoutError):
            continue
    if not results:
        raise GpufleetError(f"no GPU count of {', '.join(map(str, counts))} has a plan")
    return results


def sweep_report_figures(results: dict[int, PlanResult], catalog: Catalog, deadline_s: float | None) -> PlanFigures:
    """Figures for a sweep whose per-count results are at hand (`plan -n A-B --html`)."""
    points = tuple(ScalingPoint("best plan per count", count, r.plans[0].candidate.step.tokens_per_s_per_gpu,
                                r.plans[0].wall_time_s) for count, r in sorted(results.items()))
    return plan_figures(results[chosen_count(results, deadline_s)], catalog, sweep=points, deadline_s=deadline_s)


def chosen_count(results: dict[int, PlanResult], deadline_s: float | None) -> int:
    """The count a sweep's report details: the smallest that meets the deadline, else the fastest."""
    meeting = [count for count, r in sorted(results.items())
               if deadline_s is not None and r.plans[0].wall_time_s <= deadline_s]
    if meeting:
        return meeting[0]
    return min(results, key=lambda count: results[count].plans[0].wall_time_s)
