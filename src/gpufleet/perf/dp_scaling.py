"""Costs of a step that grow with dp (docs/dp-scaling.md): waiting for the slowest of its GPUs (`straggler_fraction`),
for the slowest data-parallel replica at each FP8 amax all-reduce (`amax_sync_fraction`), and what an interleaved
pipeline's data-parallel reduction leaves exposed (`interleaved_exposed_s`). All three are off by default.

Identical GPUs are not equally fast. Sinha et al. ("Not All GPUs Are Created Equal", SC22, arXiv 2208.11035)
ran the same kernels on more than 90 % of the GPUs of five clusters (V100, MI60) and found an average
performance variation of 8 % (22 % at most) between GPUs of one SKU, with outliers 1.5x slower than the median;
manufacturing spread and power management (clocks under a power cap) are the causes. A training step cannot
finish before its slowest GPU: tensor-parallel collectives wait for the slowest member of each group at every
layer, the pipeline for its slowest stage at every micro-batch, and the gradient reduction for the slowest
replica at every step. With N GPUs whose speeds scatter as a normal law of relative spread sigma, the job runs at
the pace of the expected slowest of N:

    slowdown(N) = sigma * e(N),    e(N) = E[max of N independent standard normals]

e(N) grows like sqrt(2 ln N) (and never exceeds it): e(8) = 1.42, e(128) = 2.59, e(8192) = 3.80. N is every
GPU of the job, not only the data-parallel replicas: a tensor-parallel group waits for its slowest member at every
layer just as replicas wait for the slowest replica, so for a fixed GPU count the term is the same for every layout
(it moves no ranking) and at fixed tp*pp it grows with dp. The reference is one GPU of median speed, which is what
the single-GPU GEMM benchmarks behind the calibration measure.

Growing dp 3x at fixed tp*pp adds sigma * (e(3N) - e(N)) ~ sigma * ln 3 / sqrt(2 ln N): 0.28 sigma at N = 2048.
With sigma of a few per cent that is well under 1 %: this mechanism cannot explain a 5-15 % loss per 3x of dp on
its own; docs/dp-scaling.md gives the arithmetic and what the run files say.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

from gpufleet.errors import InputError

if TYPE_CHECKING:  # numpy is imported where the term is computed (it is off by default; plan starts without numpy)
    import numpy as np

#: Relative spread (one standard deviation) of per-GPU speed within one SKU. Judgement from Sinha et al. (SC22):
#: reading their 8 % average variation as the span between the box plot's whiskers (no outliers), which for a
#: normal law is about 5.4 sigma (Q1 - 1.5 IQR to Q3 + 1.5 IQR = +-2.70 sigma): 8 % / 5.4 = 1.5 %.
GPU_SPEED_SIGMA = 0.015
#: Span of the integration grid for e(n), in standard deviations each side (the tail beyond 9 sigma holds
#: n * 1e-19 of the probability: nothing for any cluster that exists).
_GRID_HALF_WIDTH = 9.0
_GRID_POINTS = 18001


@lru_cache(maxsize=1)
def _grid() -> tuple[np.ndarray, np.ndarray]:
    """The integration grid x and log Phi(x), Phi the standard normal distribution function, accurate in both
    tails: log(erfc(-x/sqrt 2) / 2) below the origin (no cancellation: erfc is computed directly), and
    log1p(-erfc(x/sqrt 2) / 2) above it (what scipy.special.log_ndtr does, without importing scipy: 0.2 s of a
    plan's CPU)."""
    import numpy as np

    x = np.linspace(-_GRID_HALF_WIDTH, _GRID_HALF_WIDTH, _GRID_POINTS)
    x[_GRID_POINTS // 2] = 0.0  # both halves end on the exact origin
    tail = np.array([math.erfc(abs(value) / math.sqrt(2.0)) / 2.0 for value in x.tolist()])  # Phi(-|x|)
    return x, np.where(x <= 0.0, np.log(tail), np.log1p(-tail))


@lru_cache(maxsize=4096)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals], by E[X] = int_0^inf (1 - F) dx - int_-inf^0 F dx with
    F = Phi^n (trapezoid rule on a fine grid; e(2) = 1/sqrt(pi), e(3) = 1.5/sqrt(pi))."""
    if n < 1:
        raise InputError(f"expected_max_normal needs n >= 1, got {n}")
    if n == 1:
        return 0.0
    import numpy as np

    x, log_cdf = _grid()
    cdf_n = np.exp(n * log_cdf)
    origin = _GRID_POINTS // 2
    upper = np.trapezoid(1.0 - cdf_n[origin:], x[origin:])
    lower = np.trapezoid(cdf_n[:origin + 1], x[:origin + 1])
    return float(upper - lower)


def straggler_fraction(gpus: int, sigma: float = GPU_SPEED_SIGMA, already_paced: int = 1) -> float:
    """Share by which the slowest of `gpus` GPUs, all synchronised every step, lengthens the critical path over
    the slowest of `already_paced` of them: sigma * (e(gpus) - e(already_paced)).

    already_paced = 1 ("job" scope): over a GPU of median speed, what the single-GPU GEMM benchmarks behind the
    calibration measure. already_paced = tp*pp*cp ("replicas" scope): only what data-parallel replicas add by
    waiting for each other, zero at dp = 1 (the within-replica spread left to the calibration)."""
    if gpus < 1 or not 1 <= already_paced <= gpus:
        raise InputError(f"straggler_fraction needs gpus >= 1 and 1 <= already_paced <= gpus, got {gpus} and "
                         f"{already_paced}")
    if sigma < 0:
        raise InputError(f"straggler_fraction needs sigma >= 0, got {sigma}")
    if sigma == 0:  # the term is off (the default): no integral to compute, and no numpy to import
        return 0.0
    return sigma * (expected_max_normal(gpus) - expected_max_normal(already_paced))


def straggler_s(critical_path_s: float, gpus: int, sigma: float, already_paced: int = 1) -> float:
    """Seconds the slowest of a job's `gpus` GPUs adds to a step whose critical path at median speed (pipeline
    compute, in-line communication and bubble: all of it runs at the pace of the slowest GPU) is
    `critical_path_s` (`straggler_fraction` for `already_paced`)."""
    return critical_path_s * straggler_fraction(gpus, sigma, already_paced)


def amax_sync_fraction(dp: int, sigma: float) -> float:
    """Share by which FP8 delayed scaling's amax all-reduce over the data-parallel replicas lengthens the pipeline.

    Transformer Engine's DelayedScaling(reduce_amax=True) all-reduces the amax history of every FP8 module at each
    exit of `fp8_autocast`, and Megatron-Core wraps each model chunk's forward in one, with the amax-reduction group
    tp x dp x cp (`parallel_state.get_amax_reduction_group(with_context_parallel=True)`, `tp_only_amax_red` False by
    default; NeMo's later performance scripts set it True). The all-reduce is blocking, so every micro-batch's chunk
    forward becomes a meeting point of all `dp` replicas of that pipeline stage: each interval between two meetings
    ends when the slowest replica arrives. If each replica's time over an interval scatters independently with
    relative spread `sigma`, the pipeline runs at the pace of the slowest of `dp` over every interval:

        amax_sync_s = pipeline_s * sigma * e(dp)

    (the sum of interval x sigma x e(dp) over the intervals is the whole pipeline x sigma x e(dp)). Without the
    dp-spanning reduction (BF16, tp-only amax reduction, current scaling) the replicas meet once per step, at the
    gradient reduction, where the spread of a whole step, sigma / sqrt(intervals), is what waits: this term leaves
    that to `straggler_fraction`. The tiny all-reduce's own latency (2 log2(dp) network steps, 20-70 us per
    chunk forward) is not charged here: about 1 % of a step at most on the runs in docs/dp-scaling.md.
    """
    if dp < 1:
        raise InputError(f"amax_sync_fraction needs dp >= 1, got {dp}")
    if sigma < 0:
        raise InputError(f"amax_sync_fraction needs sigma >= 0, got {sigma}")
    if sigma == 0 or dp == 1:
        return 0.0
    return sigma * expected_max_normal(dp)


def amax_sync_s(pipeline_s: float, dp: int, sigma: float) -> float:
    """Seconds the FP8 amax all-reduce's meetings of `dp` replicas add to a pipeline of `pipeline_s` seconds
    (`amax_sync_fraction`)."""
    return pipeline_s * amax_sync_fraction(dp, sigma)


def interleaved_exposed_s(comm_s: float, window_s: float, granules: int, vpp: int, group_micro_batches: int) -> float:
    """Exposed seconds of a step's data-parallel reduction (or parameter gather) under an interleaved pipeline.

    `comm_s` is the stage's whole collective, `window_s` one micro-batch's backward (forward) over the whole stage,
    `granules` the stage's layers. With vpp model chunks per stage, Megatron-Core's overlapped DDP launches a chunk's
    buckets once that chunk's last micro-batch has passed, and the interleaved 1F1B schedule ends with the last
    `group_micro_batches` (= min(pp, micro-batches)) micro-batches going through the chunks one after the other, last
    chunk first: chunk vpp-1-j is ready j groups into that tail, so the reductions of every chunk but the first hide
    behind the groups that follow them (one stream: each waits for the one before). What is still pending when the
    first chunk's own last backward starts overlaps that backward, and its last bucket (one granule of that chunk)
    never hides. Calculon (calculon-ai/calculon, llm.py) prices the same window: pp micro-batches of a chunk's
    backward per overlappable chunk, the last chunk over its own blocks. With vpp = 1 this is
    `comm_cost.overlap(comm_s, window_s, granules)`: one micro-batch's backward, the last granule exposed.
    """
    if comm_s <= 0:
        return 0.0
    vpp = max(vpp, 1)
    chunk_comm_s, chunk_window_s = comm_s / vpp, window_s / vpp
    group_s = max(group_micro_batches, 1) * chunk_window_s  # one chunk's backward over the tail's group
    comm_end_s = 0.0  # from the start of the tail; chunk vpp-1-j is ready when its group ends, (j + 1) groups in
    for j in range(vpp - 1):
        comm_end_s = max(comm_end_s, (j + 1) * group_s) + chunk_comm_s
    last_backward_s = vpp * group_s - chunk_window_s  # the first chunk's last micro-batch starts its backward
    pending_s = max(0.0, comm_end_s - last_backward_s)
    chunk_granules = max(granules // vpp, 1)
    return max(pending_s + chunk_comm_s - chunk_window_s, chunk_comm_s / chunk_granules)
