"""Turn bench results into a calibration profile (catalog/calibration.py's schema) the model reads.

What is measured and what it sets:
* `bench gemm` rows (achieved FLOP/s at M×N×K, per dtype) fit the model's GEMM curve
  `achieved / peak = gemm_fraction · Π_d d / (d + gemm_half_dim)` (perf/compute.py `shape_factor`): least squares
  in log space, `gemm_half_dim` searched on a grid, `gemm_fraction` then closed-form. bf16/fp16 rows set
  `gemm_fraction_16bit`, fp8 rows `gemm_fraction_fp8`; fp32 rows are not a training precision of the model and
  are left out. The bench is an isolated loop, as the MAMF figures the built-in profiles use.
* `bench memory` sets `hbm_fraction` = copy bandwidth / the GPU's HBM peak.
* `bench collectives` rows become `collectives` (op, size, ranks, ranks per node, bus bandwidth): the collective
  model scales its time for that op and tier by modelled / measured (fabric/collectives.py).
* `bench disk` sets `checkpoint_write_gbytes_per_s` from the largest file written (checkpoint shards are large):
  the reliability model's per-node checkpoint write bandwidth.
* `bench host` sets `host_s_per_kernel` (host seconds per launched op, the MoE step model's launch cost) in place
  of the recorded fit `moe-host-seconds-per-kernel` (a profile that sets a field wins over the fit).
* Everything else (attention fractions and kernel, `in_training_fraction`) is kept from the profile it starts from
  (the built-in one for that GPU), and the note says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpufleet.catalog.calibration import CalibrationProfile, MeasuredCollective
from gpufleet.catalog.records import GPUSpec
from gpufleet.errors import InputError

#: gemm_half_dim candidates: 1 to 8192, 97 log-spaced points (a GEMM dimension below 1 or a half-efficiency
#: dimension above the largest shapes benchmarked cannot be told apart from the data: the search stops at the
#: largest dimension measured, see fit_gemm_curve).
HALF_DIM_GRID = np.unique(np.round(np.logspace(0, 13, 97, base=2)).astype(int))
#: A measured fraction above the peak means the catalog's peak is wrong for this device; the profile caps it here
#: (the schema's bound) and says so.
MAX_FRACTION = 1.0


@dataclass(frozen=True, slots=True)
class GemmPoint:
    m: int
    n: int
    k: int
    dtype: str
    flops_per_s: float


@dataclass(frozen=True, slots=True)
class GemmFit:
    fraction: float
    half_dim: int
    points: int
    rms_log_error: float
    capped: bool
    #: the best half_dim is the largest dimension measured: beyond it the data cannot tell half_dim from fraction
    #: (a larger half_dim with a larger fraction fits as well), so the fit stops there
    half_dim_at_bound: bool = False


def fit_gemm_curve(points: Sequence[GemmPoint], peak_flops: float) -> GemmFit:
    """(gemm_fraction, gemm_half_dim) minimising the squared log error of the model's curve over `points`."""
    if not points:
        raise InputError("no GEMM rows to fit")
    from scipy.optimize import minimize_scalar

    observed = np.log([p.flops_per_s / peak_flops for p in points])
    dims = np.array([[p.m, p.n, p.k] for p in points], dtype=float)

    def solve(half: float) -> tuple[float, float]:
        """The best log fraction for this half_dim (closed form: the mean residual) and the rms log error."""
        shape = np.log(dims / (dims + half)).sum(axis=1)
        log_fraction = float(np.mean(observed - shape))
        return log_fraction, float(np.sqrt(np.mean((observed - shape - log_fraction) ** 2)))

    # A half_dim beyond the largest dimension measured trades off against the fraction without changing the fit
    # much (on a noisy, loaded machine the optimum can run off to the grid's end with a fraction at the peak), so
    # the search stops at the largest dimension measured.
    largest = float(dims.max())
    grid = [float(half) for half in HALF_DIM_GRID if half <= largest] or [1.0]
    coarse = min(grid, key=lambda half: solve(half)[1])  # the grid finds the basin, then refine
    fine = minimize_scalar(lambda half: solve(half)[1], bounds=(max(1.0, coarse / 1.2), min(coarse * 1.2, largest)),
                           method="bounded", options={"xatol": 0.25})
    half_dim = max(1, min(round(float(fine.x)), int(largest)))
    log_fraction, error = solve(half_dim)
    fraction = math.exp(log_fraction)
    return GemmFit(min(fraction, MAX_FRACTION), half_dim, len(points), error, fraction > MAX_FRACTION,
                   half_dim_at_bound=half_dim >= largest / 1.2)


def _fraction(value: float, what: str) -> float:
    if not value > 0:
        raise InputError(f"{what} must be positive, got {value}")
    return min(value, MAX_FRACTION)


@dataclass(frozen=True)
class Measurements:
    gemm: Sequence[GemmPoint] = ()
    memory_bytes_per_s: float | None = None
    extra_notes: Sequence[str] = ()
    collectives: Sequence[MeasuredCollective] = ()
    disk_write_bytes_per_s: float | None = None
    host_s_per_kernel: float | None = None


def build_profile(gpu: GPUSpec, base: CalibrationProfile, measured: Measurements, provenance: str
                  ) -> CalibrationProfile:
    """`base` with every field the measurements determine replaced; `provenance` (host, date, version) is the
    profile's source."""
    updates: dict[str, object] = {}
    notes: list[str] = []
    sixteen = [p for p in measured.gemm if p.dtype in ("bf16", "fp16")]
    if sixteen:
        fit = fit_gemm_curve(sixteen, gpu.peak_flops(sixteen[0].dtype))  # type: ignore[arg-type]
        updates |= {"gemm_fraction_16bit": fit.fraction, "gemm_half_dim": fit.half_dim}
        notes.append(f"gemm: {fit.points} 16-bit shapes, fraction {fit.fraction:.4g}, half_dim {fit.half_dim}, "
                     f"rms log error {fit.rms_log_error:.3f}" + (" (capped at the peak)" if fit.capped else "")
                     + (" (half_dim at the largest dimension measured: benchmark larger shapes to pin it)"
                        if fit.half_dim_at_bound else ""))
    fp8 = [p for p in measured.gemm if p.dtype == "fp8"]
    if fp8:
        fit8 = fit_gemm_curve(fp8, gpu.peak_flops("fp8"))
        updates["gemm_fraction_fp8"] = fit8.fraction
        notes.append(f"gemm fp8: {fit8.points} shapes, fraction {fit8.fraction:.4g}")
    if measured.memory_bytes_per_s is not None:
        updates["hbm_fraction"] = _fraction(measured.memory_bytes_per_s / gpu.hbm_bytes_per_s, "memory bandwidth")
        notes.append(f"memory: {measured.memory_bytes_per_s / 1e9:.4g} GB/s copy = {updates['hbm_fraction']:.4g} "
                     "of the HBM peak")
    if measured.collectives:
        updates["collectives"] = tuple(measured.collectives)
        ops = sorted({point.op for point in measured.collectives})
        notes.append(f"collectives: {len(measured.collectives)} measured sizes of {', '.join(ops)}")
    if measured.disk_write_bytes_per_s is not None:
        updates["checkpoint_write_gbytes_per_s"] = measured.disk_write_bytes_per_s / 1e9
        notes.append(f"disk: checkpoint write {measured.disk_write_bytes_per_s / 1e9:.4g} GB/s with fsync")
    if measured.host_s_per_kernel is not None:
        if not (0 < measured.host_s_per_kernel < math.inf):
            raise InputError(f"host seconds per kernel must be positive and finite, got {measured.host_s_per_kernel}")
        updates["host_s_per_kernel"] = measured.host_s_per_kernel
        notes.append(f"host: {measured.host_s_per_kernel * 1e6:.4g} us per launched op (bench host)")
    if not updates:
        raise InputError("nothing to calibrate: give bench gemm (16-bit or fp8), memory, collectives, disk or host "
                         "results")
    kept = [name for name in ("attention_fraction", "cudnn_attention_fraction", "in_training_fraction",
                              "attention_kernel") if getattr(base, name) is not None]
    notes.append(f"kept from the built-in {base.id} profile: {', '.join(kept)}")
    notes += list(measured.extra_notes)
    return base.model_copy(update={**updates, "source": provenance, "note": "; ".join(notes)})
