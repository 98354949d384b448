"""`gpufleet plan` as a request: the workload, the GPU counts (one, or a sweep), and what to show of the answer (the
top plans, one explained, those within a budget, the smallest count meeting a deadline, a plot and an HTML report).
The CLI parses flags into a PlanCommand, plans, and prints (cli/plan.py); the rules between the flags live here,
so the Python API refuses what the CLI refuses."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import model_validator

from gpufleet.catalog.registry import Catalog
from gpufleet.errors import InputError
from gpufleet.planner.plan import Plan, PlanRequest, PlanResult
from gpufleet.planner.plan_options import WorkloadOptions
from gpufleet.planner.sites import sites_fields
from gpufleet.request import MAX_SWEEP_COUNTS, Request, check_gpu_count
from gpufleet.units import parse_duration_s, parse_int_list

#: How many plans one count shows when --top is not given.
DEFAULT_TOP = 5


class PlanCommand(Request):
    """What `gpufleet plan` was asked: `gpus` as given (64, a list 64,128 or a range 64-1024 sweeps the scale)."""

    workload: WorkloadOptions = WorkloadOptions()
    gpus: str = "64"
    top: int | None = None
    explain: int | None = None
    budget_usd: float | None = None
    deadline: str | None = None  # e.g. 30d
    sites: int | None = None
    wan_gbps: float | None = None
    wan_latency: str | None = None  # e.g. 5ms
    plot: Path | None = None
    html: Path | None = None

    @model_validator(mode="after")
    def _consistent(self) -> PlanCommand:
        if self.budget_usd is not None and not (math.isfinite(self.budget_usd) and self.budget_usd > 0):
            raise InputError(f"--budget must be a positive number of dollars, got {self.budget_usd}")
        check_gpu_count(max(self.counts))
        self.site_fields()  # --sites, --wan-gbps, --wan-latency checked against the counts
        single_given = [flag for flag, value in (("--top", self.top), ("--explain", self.explain),
                                                 ("--budget", self.budget_usd)) if value is not None]
        if self.is_sweep and single_given:
            verb = "applies" if len(single_given) == 1 else "apply"
            raise InputError(f"{', '.join(single_given)} {verb} to one GPU count; a sweep (--gpus list or range, or "
                             "--deadline) shows the best plan per count — plan one count to use them")
        if not self.is_sweep and self.plot is not None:
            raise InputError("--plot draws a GPU-count sweep: give --gpus a list or a range, e.g. 64,128 or 64-1024")
        self._check_output_paths()
        if self.shown < 1:
            raise InputError(f"--top must be at least 1, got {self.shown}")
        if self.explain is not None and not 1 <= self.explain <= self.shown:
            raise InputError(f"--explain RANK must be between 1 and --top ({self.shown})")
        return self

    def _check_output_paths(self) -> None:
        from gpufleet.output_paths import check_output_path

        if self.plot is not None:
            check_output_path(self.plot, "--plot")
        if self.html is not None:
            check_output_path(self.html, "--html", (".html", ".htm"))

    @property
    def counts(self) -> list[int]:
        return parse_int_list(self.gpus, "--gpus", most=MAX_SWEEP_COUNTS)

    @property
    def deadline_s(self) -> float | None:
        return parse_duration_s(self.deadline, "--deadline") if self.deadline else None

    @property
    def is_sweep(self) -> bool:
        """Several counts, or a deadline: the best plan per count."""
        return len(self.counts) > 1 or self.deadline_s is not None

    @property
    def shown(self) -> int:
        """How many plans one count shows (--top, else DEFAULT_TOP)."""
        return DEFAULT_TOP if self.top is None else self.top

    def site_fields(self) -> dict[str, Any]:
        return sites_fields(self.sites, self.wan_gbps, self.wan_latency, self.counts, self.workload.fabric_model)

    def base_request(self, cat: Catalog) -> PlanRequest:
        """The PlanRequest of the first count (a sweep replaces the count)."""
        return replace(self.workload.plan_request(cat, self.counts[0], self.shown), **self.site_fields())


@dataclass(frozen=True)
class Shown:
    """What one count's answer shows: the plans (within the budget, if one was given; at most --top), the plan to
    explain, and why the check failed or what to warn of."""

    plans: tuple[Plan, ...]
    explained: Plan | None = None
    failure: str | None = None  # the check the user asked for (a cost ranking, a budget) failed
    over_budget: bool = False  # the failure is that no plan fits the budget
    warning: str | None = None

    def view(self, result: PlanResult) -> PlanResult:
        """The result with only the shown plans."""
        return PlanResult(result.request, result.job, result.cluster, result.search, list(self.plans),
                          result.economics_error)


def shown_plans(result: PlanResult, command: PlanCommand) -> Shown:
    """The plans to show of one count's result: a cost ranking or a budget needs the plans' cost; a budget keeps
    the plans whose cheapest cloud cost fits it, fastest first; --explain names one of those left."""
    from gpufleet.planner.sweep import within_budget

    budget = command.budget_usd
    missing = result.economics_error
    if missing is not None and (result.request.rank_by == "cost" or budget is not None):
        flag = "--rank-by cost" if result.request.rank_by == "cost" else "--budget"
        return Shown((), failure=f"{flag} needs the plans' cost, which cannot be computed: {missing}")
    warning = f"step times stand, but no cost, power or goodput: {missing}" if missing is not None else None
    plans = result.plans
    if budget is not None:
        plans = within_budget(result.plans, budget)
        if not plans:
            cheapest = min((p.cheapest_usd or float("inf")) for p in result.plans)
            return Shown((), failure=f"no plan's cheapest cloud cost fits the ${budget:,.0f} budget; cheapest is "
                         f"${cheapest:,.0f}", over_budget=True)
    if command.explain is not None and not 1 <= command.explain <= len(plans):
        raise InputError(f"--explain must be between 1 and {len(plans)}")
    explained = plans[command.explain - 1] if command.explain is not None else None
    return Shown(tuple(plans[:command.shown]), explained, warning=warning)
