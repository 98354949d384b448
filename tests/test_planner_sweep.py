"""planner/sweep.py's verdict on a sweep: which failure a user gets (no plan anywhere, a usage error when no count has
a legal layout, a deadline no count meets) and which counts the deadline picks; units.format_long_duration."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from gpufleet.catalog.registry import Catalog, load_catalog
from gpufleet.planner.plan import PlanResult
from gpufleet.planner.plan_options import WorkloadOptions
from gpufleet.planner.sweep import Sweep, SweepPoint, judge_sweep, sweep_counts
from gpufleet.units import format_long_duration

DAY_S = 86_400.0


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog([])


def test_long_durations_read_in_hours_days_then_years() -> None:
    assert [format_long_duration(s) for s in (5 * 3600, 3 * DAY_S, 400 * DAY_S, 5 * 365.25 * DAY_S)] == \
        ["5.0 h", "3.0 d", "400.0 d", "5 y"]
    assert format_long_duration(2e10 * 365.25 * DAY_S) == "2e+10 y"


def test_no_count_with_a_legal_layout_is_a_usage_error_naming_the_first_count() -> None:
    sweep = Sweep((SweepPoint(8, verdict="no legal layout", reason="8 GPUs do not divide 3 heads"),
                   SweepPoint(16, verdict="no legal layout", reason="16 GPUs do not divide 3 heads")))
    verdict = judge_sweep(sweep)
    assert verdict.failure == "no GPU count in the sweep has a plan; at 8 GPUs: 8 GPUs do not divide 3 heads"
    assert verdict.failure_is_usage and verdict.warning is None


def test_a_count_that_does_not_fit_makes_it_a_failed_check_not_a_usage_error() -> None:
    sweep = Sweep((SweepPoint(8, verdict="does not fit", reason="needs 120 GiB"),
                   SweepPoint(16, verdict="no legal layout", reason="no layout")))
    verdict = judge_sweep(sweep)
    assert verdict.failure is not None and verdict.failure.endswith("at 8 GPUs: needs 120 GiB")
    assert not verdict.failure_is_usage


def test_counts_without_economics_are_named_in_one_warning() -> None:
    def priced(error: str | None) -> PlanResult:
        return cast(PlanResult, SimpleNamespace(economics_error=error, plans=[]))

    sweep = Sweep((SweepPoint(8, priced("no offer for h100")), SweepPoint(16, priced(None)),
                   SweepPoint(32, priced("no offer for h100"))))
    verdict = judge_sweep(sweep)
    assert verdict.warning == "step times stand, but no cost, power or goodput at 8, 32 GPUs: no offer for h100"
    assert verdict.failure is None


def test_a_deadline_picks_the_fewest_gpus_that_meet_it(cat: Catalog) -> None:
    base = WorkloadOptions(tokens="100B").plan_request(cat, 8, 1)
    times = {point.gpus: point.best.wall_time_s for point in sweep_counts(base, [8, 16], cat).points}
    assert times[16] < times[8]  # twice the GPUs train faster
    between = (times[8] + times[16]) / 2
    met = sweep_counts(base, [16, 8], cat, between)
    assert [point.gpus for point in met.points] == [8, 16]  # smallest first, whatever order given
    assert met.smallest_meeting_deadline is not None and met.smallest_meeting_deadline.gpus == 16
    assert judge_sweep(met).failure is None
    both = sweep_counts(base, [8, 16], cat, times[8] * 1.01)
    assert both.smallest_meeting_deadline is not None and both.smallest_meeting_deadline.gpus == 8
    cheapest = both.cheapest_meeting_deadline
    prices = {point.gpus: point.best.cheapest_usd for point in both.points}
    assert cheapest is not None and cheapest.offer.usd == min(p for p in prices.values() if p is not None)


def test_a_deadline_no_count_meets_names_the_fastest(cat: Catalog) -> None:
    base = WorkloadOptions(tokens="100B").plan_request(cat, 8, 1)
    missed = sweep_counts(base, [8, 16], cat, 3600.0)
    fastest = min(missed.points, key=lambda point: point.best.wall_time_s)
    assert fastest.gpus == 16
    verdict = judge_sweep(missed)
    assert verdict.failure == (f"no GPU count in the sweep meets the deadline of 1.0 h; the fastest, 16 GPUs, takes "
                               f"{format_long_duration(fastest.best.wall_time_s)}")
    assert not verdict.failure_is_usage
