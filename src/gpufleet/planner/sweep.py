"""Plans over several GPU counts (a scaling sweep), the smallest and the cheapest count that meet a deadline, and
the fastest plans within a budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gpufleet.catalog.registry import Catalog
from gpufleet.economics.cloud import OfferCost
from gpufleet.errors import InfeasibleError, NoLegalLayoutError
from gpufleet.planner.plan import Plan, PlanRequest, PlanResult, make_plan
from gpufleet.units import format_long_duration


@dataclass(frozen=True)
class SweepPoint:
    """One GPU count of a sweep: its plan (the best layout only), or why it has none."""

    gpus: int
    result: PlanResult | None = None
    verdict: str | None = None  # "no legal layout" or "does not fit" when `result` is None
    reason: str | None = None

    @property
    def fits(self) -> bool:
        return self.result is not None

    @property
    def best(self) -> Plan:
        """The count's best plan (only for a point that fits)."""
        if self.result is None:
            raise ValueError(f"{self.gpus} GPUs has no plan: {self.reason}")
        return self.result.plans[0]


@dataclass(frozen=True)
class DeadlineChoice:
    """The cheapest count meeting a deadline, on its cheapest cloud offer."""

    gpus: int
    offer: OfferCost


@dataclass(frozen=True)
class Sweep:
    """Every count's best plan, in increasing GPU count, and what a deadline picks among them."""

    points: tuple[SweepPoint, ...]
    deadline_s: float | None = None
    smallest_meeting_deadline: SweepPoint | None = None  # the fewest GPUs whose best plan meets the deadline
    cheapest_meeting_deadline: DeadlineChoice | None = None

    @property
    def fitting(self) -> list[SweepPoint]:
        return [point for point in self.points if point.fits]


@dataclass(frozen=True)
class SweepVerdict:
    """What a sweep's answer says beyond its rows: counts priced without economics, and why it failed, if it did."""

    warning: str | None = None  # step times stand, but some counts have no cost, power or goodput
    failure: str | None = None  # no count has a plan, or none meets the deadline
    failure_is_usage: bool = False  # no count has a legal layout: the counts to change, as for one count


def judge_sweep(sweep: Sweep) -> SweepVerdict:
    """The sweep's warning and failure: no count with a plan (a usage error when none has a legal layout), or a
    deadline that no count meets (naming the fastest)."""
    unavailable = {point.gpus: point.result.economics_error for point in sweep.points
                   if point.result is not None and point.result.economics_error}
    warning = (f"step times stand, but no cost, power or goodput at {', '.join(map(str, unavailable))} GPUs: "
               f"{next(iter(unavailable.values()))}") if unavailable else None
    if not sweep.fitting:
        first_point = sweep.points[0]
        return SweepVerdict(warning, f"no GPU count in the sweep has a plan; at {first_point.gpus} GPUs: "
                            f"{first_point.reason}",
                            all(point.verdict == "no legal layout" for point in sweep.points))
    if sweep.deadline_s is not None and sweep.smallest_meeting_deadline is None:
        fastest = min(sweep.fitting, key=lambda point: point.best.wall_time_s)
        return SweepVerdict(warning, f"no GPU count in the sweep meets the deadline of "
                            f"{format_long_duration(sweep.deadline_s)}; the fastest, {fastest.gpus} GPUs, takes "
                            f"{format_long_duration(fastest.best.wall_time_s)}")
    return SweepVerdict(warning)


def plan_count(base: PlanRequest, gpus: int, catalog: Catalog) -> SweepPoint:
    """The best plan at `gpus` (the base request with that count and one plan), or why there is none."""
    request = replace(base, gpus=gpus, top=1)
    try:
        result = make_plan(request, catalog)
    except (InfeasibleError, NoLegalLayoutError) as error:
        verdict = "no legal layout" if isinstance(error, NoLegalLayoutError) else "does not fit"
        return SweepPoint(gpus, verdict=verdict, reason=str(error))
    return SweepPoint(gpus, result)


def meets(point: SweepPoint, deadline_s: float) -> bool:
    return point.fits and point.best.wall_time_s <= deadline_s


def sweep_counts(base: PlanRequest, counts: Sequence[int], catalog: Catalog, deadline_s: float | None = None,
                 progress: Callable[[], None] | None = None) -> Sweep:
    """Plan each count (smallest first); with a deadline, the smallest count that meets it and the cheapest
    (its cheapest cloud offer) among the counts that do. `progress` is called after each count."""
    points = []
    for count in sorted(counts):
        points.append(plan_count(base, count, catalog))
        if progress is not None:
            progress()
    if deadline_s is None:
        return Sweep(tuple(points))
    smallest = next((point for point in points if meets(point, deadline_s)), None)
    priced = [(point, offer) for point in points if meets(point, deadline_s)
              for offer in (_cheapest_offer(point.best),) if offer is not None]
    cheapest = min(priced, key=lambda pair: pair[1].usd, default=None)
    return Sweep(tuple(points), deadline_s, smallest,
                 DeadlineChoice(cheapest[0].gpus, cheapest[1]) if cheapest else None)


def _cheapest_offer(plan: Plan) -> OfferCost | None:
    return plan.economics.cheapest_offer if plan.economics is not None else None


def within_budget(plans: Sequence[Plan], budget_usd: float) -> list[Plan]:
    """The plans whose cheapest cloud cost fits the budget, fastest (wall-clock time-to-train) first."""
    return sorted((p for p in plans if p.cheapest_usd is not None and p.cheapest_usd <= budget_usd),
                  key=lambda p: p.wall_time_s)
