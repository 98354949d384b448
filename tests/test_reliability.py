"""Reliability model against hand-derived numbers, Llama 3's published run and a Monte Carlo simulation."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.catalog.economics_records import FailureStats
from gpufleet.catalog.registry import Catalog
from gpufleet.errors import InfeasibleError, InputError
from gpufleet.reliability.checkpoint_interval import (
    checkpoint_bytes,
    daly_interval_s,
    write_bandwidth_bytes_per_s,
    write_time_s,
    young_interval_s,
)
from gpufleet.reliability.estimate import ReliabilityEstimate, estimate_reliability
from gpufleet.reliability.failures import FailureModel
from gpufleet.reliability.goodput import goodput

HOUR = 3600.0


@pytest.fixture(scope="module")
def llama3() -> FailureModel:
    stats = Catalog().get("failure_stats", "llama3-405b", FailureStats)
    return FailureModel.from_stats(stats)


def test_llama3_reproduces_one_interruption_every_3_09_hours(llama3: FailureModel) -> None:
    # 54 days * 24 h / 419 unexpected interruptions = 3.0931 h (hardware_facts derived job_mtti_hours 3.09)
    assert llama3.mtti_s(16384) / HOUR == pytest.approx(54 * 24 / 419, rel=1e-12)
    assert llama3.mtti_s(16384) / HOUR == pytest.approx(3.09, abs=0.005)
    assert llama3.interruptions_per_day(16384) == pytest.approx(419 / 54, rel=1e-12)  # 7.76/day


def test_llama3_per_gpu_year_rate(llama3: FailureModel) -> None:
    # hardware_facts: 419 / (16384 * 54) * 365 = 0.173 unexpected interruptions per GPU-year
    assert llama3.interruptions_per_gpu_s * 365 * 86400 == pytest.approx(0.173, abs=0.0005)
    # and 1.38 per 8-GPU node-year
    assert llama3.interruptions_per_s(8) * 365 * 86400 == pytest.approx(1.38, abs=0.005)


def test_llama3_causes_add_up_and_gpu_share() -> None:
    stats = Catalog().get("failure_stats", "llama3-405b", FailureStats)
    assert sum(stats.causes.values()) == 419
    # The paper prints "30.1%" beside 148 faulty-GPU interruptions, but 148/419 = 35.3% (and the counts
    # do add up to 419); the other shares match their counts, e.g. HBM3 72/419 = 17.2%, network 35/419 = 8.4%.
    assert stats.causes["faulty_gpu"] / 419 == pytest.approx(0.353, abs=0.001)
    assert stats.causes["network_switch_cable"] / 419 == pytest.approx(0.084, abs=0.001)
    assert stats.causes["gpu_hbm3"] / 419 == pytest.approx(0.172, abs=0.001)  # "17.2%"


def test_rate_scales_inversely_with_gpus(llama3: FailureModel) -> None:
    assert llama3.mtti_s(1024) == pytest.approx(16 * llama3.mtti_s(16384))


def test_causes_must_add_up() -> None:
    with pytest.raises(ValueError, match="causes add up to 3"):
        FailureStats(id="x", source="test", gpus=8, days=1, unexpected_interruptions=4, causes={"gpu": 3})


def test_young_by_hand() -> None:
    # delta = 60 s, M = 3 h: sqrt(2 * 60 * 10800) = sqrt(1,296,000) = 1138.42 s
    assert young_interval_s(60, 10800) == pytest.approx(1138.42, abs=0.01)


def test_daly_tends_to_young_when_write_is_small() -> None:
    for write_s, mtti_s in [(1.0, 1e6), (10.0, 1e7), (0.1, 1e5)]:
        young = young_interval_s(write_s, mtti_s)
        assert daly_interval_s(write_s, mtti_s) == pytest.approx(young, rel=2e-3)


def test_daly_by_hand_and_cap() -> None:
    # delta = 600, M = 3600: ratio = 1/12; sqrt(2*600*3600) = 2078.46
    # 2078.46 * (1 + sqrt(1/12)/3 + 1/108) - 600 = 2078.46 * 1.105483 - 600 = 1697.71
    assert daly_interval_s(600, 3600) == pytest.approx(1697.7, abs=0.1)
    assert daly_interval_s(8000, 3600) == 3600  # delta >= 2M: checkpoint every M


def test_daly_interval_is_near_the_goodput_optimum() -> None:
    write_s, restart_s, mtti_s = 120.0, 600.0, 4 * HOUR
    best = daly_interval_s(write_s, mtti_s)
    at_best = goodput(interval_s=best, write_s=write_s, restart_s=restart_s, mtti_s=mtti_s)
    for factor in (0.5, 0.8, 1.25, 2.0):
        other = goodput(interval_s=best * factor, write_s=write_s, restart_s=restart_s, mtti_s=mtti_s)
        assert other <= at_best + 1e-12


def test_goodput_first_order_budget() -> None:
    # tau, delta, R << M: goodput ~ 1 - delta/tau - tau/(2M) - R/M
    tau, delta, restart, mtti = 600.0, 6.0, 60.0, 1e6
    first_order = 1 - delta / tau - tau / (2 * mtti) - restart / mtti
    assert goodput(interval_s=tau, write_s=delta, restart_s=restart, mtti_s=mtti) == pytest.approx(
        first_order, abs=1e-4
    )


def _simulate_goodput(tau: float, delta: float, restart: float, mtti: float, work: float, seed: int) -> float:
    """Discrete-event simulation of the process Daly's formula models (independent of the formula)."""
    rng = random.Random(seed)
    wall = done = 0.0
    next_failure = rng.expovariate(1 / mtti)
    while done < work:
        segment = min(tau, work - done) + delta
        if wall + segment <= next_failure:
            wall += segment
            done += segment - delta
            continue
        wall = next_failure  # lose the segment; restart (which may itself be interrupted)
        while True:
            next_failure = wall + rng.expovariate(1 / mtti)
            if wall + restart <= next_failure:
                wall += restart
                break
            wall = next_failure
    return work / wall


def test_goodput_matches_simulation() -> None:
    tau, delta, restart, mtti = 1800.0, 120.0, 600.0, 3 * HOUR
    simulated = _simulate_goodput(tau, delta, restart, mtti, work=3e7, seed=7)
    assert goodput(interval_s=tau, write_s=delta, restart_s=restart, mtti_s=mtti) == pytest.approx(
        simulated, rel=0.01
    )


def test_checkpoint_size_and_write_time() -> None:
    # 70e9 params * (2 + 12) B = 980 GB; 16 nodes * 4 GB/s = 64 GB/s -> 15.3 s
    size = checkpoint_bytes(70e9, weight_bytes_per_param=2, optimizer_bytes_per_param=12)
    assert size == pytest.approx(980e9)
    bandwidth = write_bandwidth_bytes_per_s(16, per_node_bytes_per_s=4e9, max_bytes_per_s=500e9)
    assert bandwidth == 64e9
    assert write_time_s(size, bandwidth) == pytest.approx(15.3125)
    assert write_bandwidth_bytes_per_s(2048, per_node_bytes_per_s=4e9, max_bytes_per_s=500e9) == 500e9


def test_estimate_llama3_scale(llama3: FailureModel) -> None:
    # 405B: 405e9 * 14 B = 5.67 TB at 500 GB/s = 11.34 s; M = 11135 s; Young = sqrt(2*11.34*11135) = 502.6 s
    est = estimate_reliability(
        llama3, gpus=16384, checkpoint_bytes=405e9 * 14, write_bytes_per_s=500e9, restart_s=600,
        train_time_s=50 * 86400,
    )
    assert est.checkpoint_write_s == pytest.approx(11.34)
    assert est.young_interval_s == pytest.approx(math.sqrt(2 * 11.34 * 54 * 86400 / 419), rel=1e-9)
    assert 0.9 < est.goodput < 0.96  # Meta reports ">90%" effective training time
    assert est.wall_time_s is not None
    assert est.wall_time_s == pytest.approx(50 * 86400 / est.goodput)
    assert est.interruptions_expected == pytest.approx(est.wall_time_s / est.mtti_s)
    assert est.lost_gpu_hours == pytest.approx(16384 * (est.wall_time_s - 50 * 86400) / HOUR)


def test_infeasible_when_failures_outpace_checkpoints() -> None:
    with pytest.raises(InfeasibleError, match="cannot make progress"):
        goodput(interval_s=3600, write_s=3600, restart_s=36000, mtti_s=60)


def test_bad_inputs() -> None:
    with pytest.raises(InputError):
        FailureModel(1e-9, "x").mtti_s(0)
    with pytest.raises(InputError):
        young_interval_s(0, 100)
    with pytest.raises(InputError):
        goodput(interval_s=-1, write_s=1, restart_s=1, mtti_s=100)


rates = st.floats(min_value=1e-10, max_value=1e-6)
gpu_counts = st.integers(min_value=1, max_value=100_000)


@settings(max_examples=200, deadline=None)
@given(rate=rates, gpus=gpu_counts, extra=st.integers(min_value=1, max_value=100_000),
       size=st.floats(min_value=1e9, max_value=1e13), train=st.floats(min_value=3600, max_value=1e8))
def test_more_gpus_never_fewer_interruptions(
    rate: float, gpus: int, extra: int, size: float, train: float
) -> None:
    model = FailureModel(rate, "hypothesis")

    def at(n: int) -> ReliabilityEstimate:
        return estimate_reliability(
            model, gpus=n, checkpoint_bytes=size, write_bytes_per_s=1e11, restart_s=300.0, train_time_s=train
        )

    try:
        small, large = at(gpus), at(gpus + extra)
    except InfeasibleError:
        return
    assert large.interruptions_expected is not None and small.interruptions_expected is not None
    assert large.interruptions_expected >= small.interruptions_expected
    assert large.goodput <= small.goodput + 1e-12


@settings(max_examples=300, deadline=None)
@given(interval=st.floats(min_value=1, max_value=1e6), write=st.floats(min_value=0, max_value=1e4),
       restart=st.floats(min_value=0, max_value=1e4), mtti=st.floats(min_value=60, max_value=1e9))
def test_goodput_in_unit_interval(interval: float, write: float, restart: float, mtti: float) -> None:
    try:
        value = goodput(interval_s=interval, write_s=write, restart_s=restart, mtti_s=mtti)
    except InfeasibleError:
        return
    assert 0 < value <= 1


@settings(max_examples=200, deadline=None)
@given(write=st.floats(min_value=1, max_value=1e3), restart=st.floats(min_value=0, max_value=3600),
       mtti=st.floats(min_value=600, max_value=1e7), shrink=st.floats(min_value=1.01, max_value=10))
def test_goodput_falls_as_failures_grow(write: float, restart: float, mtti: float, shrink: float) -> None:
    def at(m: float) -> float:
        return goodput(interval_s=daly_interval_s(write, m), write_s=write, restart_s=restart, mtti_s=m)

    try:
        worse = at(mtti / shrink)
    except InfeasibleError:
        return
    assert worse <= at(mtti) + 1e-12


@pytest.mark.parametrize(("write", "restart", "mtti"), [(0.3125, 600.0, 2.85e6), (30.0, 600.0, 11000.0)])
def test_progress_interval_range_brackets_the_intervals_goodput_accepts(write: float, restart: float,
                                                                       mtti: float) -> None:
    from gpufleet.reliability.goodput import progress_interval_range_s

    span = progress_interval_range_s(write_s=write, restart_s=restart, mtti_s=mtti)
    assert span is not None
    shortest, longest = span
    assert shortest < daly_interval_s(write, mtti) < longest
    for inside in (shortest * 1.001, longest * 0.999):
        assert goodput(interval_s=inside, write_s=write, restart_s=restart, mtti_s=mtti) > 0
    for outside in (shortest * 0.99, longest * 1.01):
        with pytest.raises(InfeasibleError):
            goodput(interval_s=outside, write_s=write, restart_s=restart, mtti_s=mtti)


def test_no_progress_interval_when_failures_outpace_checkpoints() -> None:
    from gpufleet.reliability.goodput import progress_interval_range_s

    assert progress_interval_range_s(write_s=1e5, restart_s=600.0, mtti_s=100.0) is None
