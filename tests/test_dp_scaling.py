"""The straggler term (perf/dp_scaling.py): the expected slowest of N GPUs, by hand and by a second method, its
invariants, its place in a step, and the direction it gives the published weak-scaling series."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.registry import load_catalog
from gpufleet.errors import InputError
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.parallel.layout import Layout
from gpufleet.perf.dp_scaling import GPU_SPEED_SIGMA, expected_max_normal, straggler_fraction, straggler_s
from gpufleet.perf.step import StepOptions, estimate_step
from gpufleet.planner.published_runs import load_runs, shipped_runs_path
from gpufleet.planner.validate import predict_run
from gpufleet.workload.job import Job

CATALOG = load_catalog()


def test_expected_maximum_of_a_few_normals_by_hand() -> None:
    # Closed forms (order statistics of the standard normal): E[max of 2] = 1/sqrt(pi), of 3 = 3/(2 sqrt(pi)),
    # of 4 = 3/(2 sqrt(pi)) (1 + (2/pi) asin(1/3)), of 5 = 5/(4 sqrt(pi)) (1 + (6/pi) asin(1/3)).
    root_pi = math.sqrt(math.pi)
    asin = math.asin(1 / 3)
    assert expected_max_normal(1) == 0.0
    assert math.isclose(expected_max_normal(2), 1 / root_pi, rel_tol=1e-6)
    assert math.isclose(expected_max_normal(3), 3 / (2 * root_pi), rel_tol=1e-6)
    assert math.isclose(expected_max_normal(4), 3 / (2 * root_pi) * (1 + 2 / math.pi * asin), rel_tol=1e-6)
    assert math.isclose(expected_max_normal(5), 5 / (4 * root_pi) * (1 + 6 / math.pi * asin), rel_tol=1e-6)


@pytest.mark.parametrize("n", [128, 4096])
def test_expected_maximum_agrees_with_sampling(n: int) -> None:
    # A second method: the mean of 4,000 sampled maxima, within four standard errors.
    maxima = np.random.default_rng(21).standard_normal((4000, n)).max(axis=1)
    standard_error = maxima.std() / math.sqrt(len(maxima))
    assert abs(expected_max_normal(n) - maxima.mean()) < 4 * standard_error


def test_straggler_seconds_by_hand() -> None:
    # 2 GPUs at 1.5 % spread: the slower is 0.015 / sqrt(pi) = 0.846 % behind the median; of a 10 s critical path
    # that is 84.6 ms.
    assert math.isclose(straggler_s(10.0, 2, 0.015), 10.0 * 0.015 / math.sqrt(math.pi), rel_tol=1e-6)
    assert straggler_s(10.0, 1, 0.015) == 0.0
    assert straggler_s(10.0, 4096, 0.0) == 0.0


def test_bad_counts_and_spreads_are_refused() -> None:
    with pytest.raises(InputError, match="gpus >= 1"):
        straggler_fraction(0)
    with pytest.raises(InputError, match="already_paced <= gpus"):
        straggler_fraction(8, 0.015, already_paced=16)
    with pytest.raises(InputError, match="sigma >= 0"):
        straggler_fraction(8, -0.01)
    with pytest.raises(InputError, match="n >= 1"):
        expected_max_normal(0)


@given(st.integers(1, 200_000), st.integers(1, 64), st.floats(0.0, 0.2))
def test_straggler_fraction_grows_with_dp_and_stays_under_its_bound(replica: int, dp: int, sigma: float) -> None:
    for paced in (1, replica):  # the "job" and the "replicas" scope
        fewer = straggler_fraction(replica * dp, sigma, paced)
        more = straggler_fraction(replica * (dp + 1), sigma, paced)
        assert 0.0 <= fewer <= more + 1e-12  # non-decreasing in dp at a fixed replica (tp*pp*cp GPUs)
        # E[max of n standard normals] <= sqrt(2 ln n) for every n
        assert more <= sigma * math.sqrt(2 * math.log(replica * (dp + 1))) + 1e-12


@given(st.integers(1, 100_000), st.floats(0.0, 0.2))
def test_nothing_to_wait_for_at_dp_1_or_on_one_gpu(replica: int, sigma: float) -> None:
    assert straggler_fraction(replica, sigma, already_paced=replica) == 0.0  # replicas scope, dp = 1
    assert straggler_fraction(1, sigma) == 0.0  # job scope, one GPU


H100 = CATALOG.gpu("h100-sxm")
CAL = CATALOG.get("calibrations", "h100-sxm", CalibrationProfile)


def test_the_step_adds_sigma_times_the_expected_slowest_of_its_gpus() -> None:
    # Llama 3 70B on 64 H100 (tp8 pp2 dp4): the term is sigma * e(64) of the pipeline's critical path, which is the
    # step less its data-parallel, optimizer and overhead parts (the overlap contention off: this isolates the term).
    job = Job(CATALOG.model("llama3-70b"), tokens=1e12, seq_len=4096, global_batch=64)
    layout = Layout(tp=8, pp=2, dp=4, micro_batch=1, sequence_parallel=True, recompute="full")
    cluster = Cluster(H100, CATALOG.node("dgx-h100"), 64, Fabric(CATALOG.network("ndr400")))
    off = estimate_step(job, layout, cluster, CAL, StepOptions(straggler_sigma=0.0, overlap_slowdown=0.0))
    on = estimate_step(job, layout, cluster, CAL, StepOptions(straggler_sigma=GPU_SPEED_SIGMA, overlap_slowdown=0.0))
    assert "sync.stragglers" not in off.parts
    pipeline_s = off.step_s - sum(off.parts[name].exposed_s for name in ("comm.dp", "optimizer", "overhead"))
    expected = pipeline_s * GPU_SPEED_SIGMA * expected_max_normal(64)
    assert math.isclose(on.parts["sync.stragglers"].exposed_s, expected, rel_tol=1e-9)
    assert math.isclose(on.step_s - off.step_s, expected, rel_tol=1e-9)
    # replicas scope: only what 4 replicas of 16 GPUs add over one, sigma * (e(64) - e(16))
    replicas = estimate_step(job, layout, cluster, CAL, StepOptions(straggler_sigma=GPU_SPEED_SIGMA,
                                                                    straggler_scope="replicas", overlap_slowdown=0.0))
    assert math.isclose(replicas.parts["sync.stragglers"].exposed_s, pipeline_s * GPU_SPEED_SIGMA * (
        expected_max_normal(64) - expected_max_normal(16)), rel_tol=1e-9)


@pytest.mark.parametrize("series", [
    ("mpt-7b-h100-8gpu-s2048-bf16", "mpt-7b-h100-128gpu-s2048-bf16", "mpt-7b-h100-512gpu-s2048-bf16"),
    ("torchtitan-8b-8gpu-fsdp-eager", "torchtitan-8b-128gpu-fsdp-eager"),
])
@pytest.mark.parametrize("scope", ["job", "replicas"])
def test_weak_scaling_series_slope_down_with_dp_as_measured(series: tuple[str, ...], scope: str) -> None:
    # Constant sequences per GPU, growing dp: the measured tokens/s per GPU fall; with the term on, the predicted
    # ones fall too (tp = pp = 1 here, so both scopes charge the same).
    runs = {run.id: run for run in load_runs(shipped_runs_path())}
    chosen = [runs[name] for name in series]
    assert len({run.global_batch / run.hardware.num_gpus for run in chosen if run.global_batch}) == 1
    measured = [run.target.tokens_per_s_per_gpu for run in chosen]
    options = StepOptions(straggler_sigma=GPU_SPEED_SIGMA, straggler_scope=scope)  # type: ignore[arg-type]
    predicted = [predict_run(run, CATALOG, options).predicted_tokens_per_s_per_gpu or math.nan for run in chosen]
    assert all(later < earlier for earlier, later in itertools.pairwise(measured))
    assert all(later < earlier for earlier, later in itertools.pairwise(predicted))


def _expected_max_by_the_old_loop(n: int) -> float:
    """The previous implementation, kept as the reference: log Phi by math.erfc one grid point at a time (18,001 of
    them over +-9 sigma) and the same trapezoid integral."""
    x = np.linspace(-9.0, 9.0, 18001)
    x[9000] = 0.0
    cdf_n = np.exp(n * np.log(np.array([0.5 * math.erfc(-value / math.sqrt(2.0)) for value in x])))
    return float(np.trapezoid(1.0 - cdf_n[9000:], x[9000:]) - np.trapezoid(cdf_n[:9001], x[:9001]))


@pytest.mark.parametrize("n", [2, 3, 7, 64, 1000, 16384, 10**6])
def test_vectorised_expected_max_matches_the_old_loop(n: int) -> None:
    assert expected_max_normal(n) == pytest.approx(_expected_max_by_the_old_loop(n), rel=1e-9)
