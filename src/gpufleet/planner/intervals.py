"""80 % prediction intervals from the model's own leave-one-source-out residuals, by regime (conformal-style).

A run's out-of-sample residual is log(predicted / measured tokens/s per GPU) with the recorded fits refitted
without its source family (`validate --cross-validate`, planner/fit.py). Every prediction falls in a regime
(`classify_regime`: a pure function of model, layout, precision and GPU count). A regime's band is the split-conformal
quantile of its residuals' |log error|: the ⌈(n + 1)·level⌉-th smallest of n, so that a new run exchangeable with
them lands inside with probability at least `level`. A regime with fewer than `min_runs` residuals is sparse: it
borrows its parent's band (dense-dp, model-parallel and fp8 → dense → all; moe → all), widened to its own quantile
(its largest residual where it has too few for one) when that is larger, and says so (`widened`, `note`).

The band is symmetric in log: measured ∈ [p·e^-q, p·e^q] for a predicted tokens/s p. Step time is the inverse of
tokens/s, so the same factor bounds it; time to train and cost scale with step time.

The recorded table (catalog `intervals:`, data/intervals.yaml) is rebuilt by `scripts/build_intervals.py --write`;
`validate --cross-validate` measures coverage with nested folds (`coverage`): each source family's runs get the
band built from the other families' residuals only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.catalog.intervals import IntervalRecord, RecordedBand, RecordedResidual
from gpufleet.catalog.records import ModelSpec
from gpufleet.parallel.layout import Layout
from gpufleet.workload.job import Job

#: The level every interval is built for.
LEVEL = 0.8
#: Below this many residuals a regime borrows its parent's band (a judgement: with fewer than 10 runs the 80 %
#: conformal quantile is the largest or second-largest residual, set by one run). Recorded in the table.
MIN_RUNS = 10
#: More GPUs than one 8-GPU node: tensor or pipeline parallelism "at scale" spans nodes (a definition, not fitted).
SCALE_GPUS = 8


class Regime(StrEnum):
    """Where a prediction sits; each leaf's residuals are scored apart."""

    DENSE_DP = "dense-dp"  # dense model, data parallel / FSDP / ZeRO (tp = pp = 1, or model parallel in one node)
    MODEL_PARALLEL = "model-parallel"  # dense, tensor or pipeline parallel over more than one node
    FP8 = "fp8"  # dense, FP8 GEMMs
    MOE = "moe"  # mixture of experts (any precision and layout)
    DENSE = "dense"  # parent of the three dense leaves
    ALL = "all"  # parent of dense and moe


#: Each regime's parent (a sparse regime borrows its parent's band).
PARENT: Mapping[Regime, Regime | None] = {
    Regime.DENSE_DP: Regime.DENSE, Regime.MODEL_PARALLEL: Regime.DENSE, Regime.FP8: Regime.DENSE,
    Regime.MOE: Regime.ALL, Regime.DENSE: Regime.ALL, Regime.ALL: None,
}
LEAVES = (Regime.DENSE_DP, Regime.MODEL_PARALLEL, Regime.FP8, Regime.MOE)


def classify_regime(model: ModelSpec, layout: Layout, precision: str, gpus: int) -> Regime:
    """The regime of a job: MoE first (its error dominates), then FP8, then tensor/pipeline parallel across nodes,
    else data parallel."""
    if model.moe is not None:
        return Regime.MOE
    if precision == "fp8":
        return Regime.FP8
    if layout.tp * layout.pp > 1 and gpus > SCALE_GPUS:
        return Regime.MODEL_PARALLEL
    return Regime.DENSE_DP


def members(regime: Regime) -> tuple[Regime, ...]:
    """The leaves whose residuals a regime pools (a leaf: itself)."""
    return tuple(leaf for leaf in LEAVES if regime in _ancestry(leaf))


def _ancestry(regime: Regime) -> list[Regime]:
    chain: list[Regime] = []
    current: Regime | None = regime
    while current is not None:
        chain.append(current)
        current = PARENT[current]
    return chain


def conformal_quantile(scores: Sequence[float], level: float = LEVEL) -> float | None:
    """The ⌈(n + 1)·level⌉-th smallest of n scores (split-conformal, finite-sample corrected); None when n is too
    small for one (⌈(n + 1)·level⌉ > n)."""
    rank = math.ceil((len(scores) + 1) * level - 1e-12)
    if not scores or rank > len(scores):
        return None
    return sorted(scores)[rank - 1]


@dataclass(frozen=True, slots=True)
class Residual:
    """One run's out-of-sample residual, with the fold it was left out in and its regime."""

    id: str
    family: str
    regime: Regime
    log_error: float  # log(predicted / measured tokens/s per GPU)


class Interval(BaseModel):
    """An 80 % range around one prediction, in the prediction's own unit."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    level: float = Field(gt=0, lt=1)
    low: float
    high: float
    regime: str
    runs: int  # the regime's own residuals (where they are fewer than the table's min_runs: borrowed, `widened`)
    widened: bool  # the regime is sparse: the parent's band, widened where the regime's own residuals reach further
    note: str

    def scaled(self, factor: float) -> Interval:
        """The interval of `factor` × the prediction (time to train = steps × step time; cost ∝ time)."""
        low, high = sorted((self.low * factor, self.high * factor))
        return self.model_copy(update={"low": low, "high": high})

    def inverted(self, numerator: float = 1.0) -> Interval:
        """The interval of `numerator` / the prediction (tokens/s per GPU = tokens per step per GPU / step time)."""
        return self.model_copy(update={"low": numerator / self.high, "high": numerator / self.low})

    def half_width(self, value: float) -> float:
        """Half the range relative to the prediction `value` ((high − low) / 2 / value)."""
        return (self.high - self.low) / 2 / value

    def as_json(self) -> dict[str, Any]:
        """`{"level", "low", "high", "regime", "runs", "widened", "note"}`."""
        return self.model_dump()

    def text(self, fmt: str = ",.3g") -> str:
        """`(3.2–3.9)`: the range for a table cell after the prediction."""
        return f"({self.low:{fmt}}–{self.high:{fmt}})"


@dataclass(frozen=True)
class IntervalTable:
    """A band per regime (|log(predicted / measured)| ≤ quantile_log at `level`), built from residuals."""

    level: float
    min_runs: int
    bands: Mapping[Regime, RecordedBand]

    @classmethod
    def from_residuals(cls, residuals: Iterable[Residual], level: float = LEVEL,
                       min_runs: int = MIN_RUNS) -> IntervalTable:
        """Each regime's conformal quantile; sparse regimes borrow their parent's (parents first)."""
        rows = list(residuals)
        bands: dict[Regime, RecordedBand] = {}
        for regime in (Regime.ALL, Regime.DENSE, *LEAVES):  # parents before children
            pooled = members(regime)
            scores = [abs(r.log_error) for r in rows if r.regime in pooled]
            own = conformal_quantile(scores, level)
            parent = PARENT[regime]
            if len(scores) >= min_runs or parent is None:
                quantile = own if own is not None else (max(scores) if scores else math.inf)
                note = (f"{regime.value}: the {level:.0%} conformal quantile of {len(scores)} leave-one-source-out "
                        "residuals")
                bands[regime] = RecordedBand(quantile_log=quantile, runs=len(scores), widened=False, note=note)
                continue
            inherited = bands[parent]
            reach = own if own is not None else max(scores, default=0.0)
            quantile = max(inherited.quantile_log, reach)
            note = (f"{regime.value}: {len(scores)} runs, fewer than {min_runs}: {parent.value}'s band "
                    f"({inherited.runs} runs)" + (f", widened to this regime's own {reach:.3f}"
                                                  if reach > inherited.quantile_log else ""))
            bands[regime] = RecordedBand(quantile_log=quantile, runs=len(scores), widened=True, note=note)
        return cls(level, min_runs, bands)

    @classmethod
    def from_record(cls, record: IntervalRecord) -> IntervalTable:
        return cls(record.level, record.min_runs, {Regime(name): band for name, band in record.regimes.items()})

    def around(self, value: float, regime: Regime) -> Interval:
        """The interval of a predicted `value` whose error is symmetric in log (tokens/s, step time)."""
        band = self.bands[regime]
        factor = math.exp(band.quantile_log)
        return Interval(level=self.level, low=value / factor, high=value * factor, regime=regime.value,
                        runs=band.runs,
                        widened=band.widened, note=band.note)


def residuals_from_record(record: IntervalRecord) -> list[Residual]:
    return [Residual(r.id, r.family, Regime(r.regime), r.log_error) for r in record.residuals]


def recorded_residual(residual: Residual) -> RecordedResidual:
    return RecordedResidual(id=residual.id, family=residual.family, regime=residual.regime.value,
                            log_error=residual.log_error)


def step_interval(job: Job, layout: Layout, gpus: int, predicted_step_s: float, table: IntervalTable) -> Interval:
    """The 80 % interval of a predicted step time, in seconds.

    `plan` calls it once per ranked plan with the plan's job, layout and GPU count and the table from the catalog
    (`IntervalTable.from_record(catalog.interval_table())`, built once per command). From the step time's interval:

    * tokens/s per GPU = tokens per step per GPU / step time: `interval.inverted(tokens_per_step / gpus)`;
    * time to train = steps × step time: `interval.scaled(steps)` (seconds; any later factor likewise);
    * cost ∝ time: `interval.scaled(cost / predicted_step_s)`.

    `interval.as_json()` is the `"interval"` value of `--json`; text: `f"{step:.3g} s {interval.text()}"`.
    """
    regime = classify_regime(job.model, layout, job.precision, gpus)
    return table.around(predicted_step_s, regime)


@dataclass(frozen=True, slots=True)
class RegimeCoverage:
    """Nested leave-one-source-out coverage of one regime."""

    runs: int
    inside: int
    median_half_width: float | None

    @property
    def coverage(self) -> float | None:
        return self.inside / self.runs if self.runs else None

    def as_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "inside": self.inside, "coverage": self.coverage,
                "median_half_width": self.median_half_width}


def coverage(residuals: Sequence[Residual], level: float = LEVEL,
             min_runs: int = MIN_RUNS) -> dict[str, RegimeCoverage]:
    """For each family, the band built from every other family's residuals; the share of the family's runs inside
    it and the median relative half-width (sinh q), by leaf regime, dense and all."""
    hits: dict[Regime, list[tuple[bool, float]]] = {regime: [] for regime in (*LEAVES, Regime.DENSE, Regime.ALL)}
    for family in sorted({r.family for r in residuals}):
        table = IntervalTable.from_residuals([r for r in residuals if r.family != family], level, min_runs)
        for residual in (r for r in residuals if r.family == family):
            quantile = table.bands[residual.regime].quantile_log
            outcome = (abs(residual.log_error) <= quantile, math.sinh(quantile))
            for regime in _ancestry(residual.regime):
                hits[regime].append(outcome)
    return {regime.value: RegimeCoverage(len(rows), sum(inside for inside, _ in rows),
                                         statistics.median(width for _, width in rows) if rows else None)
            for regime, rows in hits.items()}


#: The command that rebuilds the recorded table (catalog data/intervals.yaml).
BUILD_COMMAND = "PYTHONPATH=src python scripts/build_intervals.py --write"
#: Decimals a recorded residual keeps (its quantiles are computed from the rounded values).
RESIDUAL_DECIMALS = 6


def interval_record_data(residuals: Sequence[Residual], run_files: Sequence[str], built: str,
                         level: float = LEVEL, min_runs: int = MIN_RUNS) -> dict[str, Any]:
    """The `intervals:` record (a dict ready for YAML) of a table built from `residuals`."""
    rounded = [Residual(r.id, r.family, r.regime, round(r.log_error, RESIDUAL_DECIMALS)) for r in residuals]
    table = IntervalTable.from_residuals(rounded, level, min_runs)
    return {
        "id": "leave-one-source-out",
        "source": ("leave-one-source-out residuals of the fitted run files: each source family predicted with the "
                   "calibration fits refitted without it (planner/fit.py cross_validate); split-conformal quantiles "
                   "of |log(predicted / measured tokens/s per GPU)| per regime (planner/intervals.py)"),
        "level": level, "min_runs": min_runs, "built": built, "command": BUILD_COMMAND,
        "run_files": list(run_files),
        "regimes": {regime.value: {"quantile_log": round(band.quantile_log, RESIDUAL_DECIMALS), "runs": band.runs,
                                   "widened": band.widened, "note": band.note}
                    for regime, band in table.bands.items()},
        "residuals": [recorded_residual(r).model_dump() for r in rounded],
    }
