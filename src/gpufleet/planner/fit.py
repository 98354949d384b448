"""Refit the recorded calibration fits (`catalog/data/fits.yaml`) from run files, and score them out of sample.

`refit` searches each fit's grid for the value with the smallest mean |log(predicted / measured)| of tokens/s per
GPU over the runs its selector picks, all fits together (coordinate descent, then profile moves that shift one fit
and re-descend the rest, so that where the search starts does not decide where it ends; the mean of the log error
rather than the median, which is flat over ranges and made refits jump). While fitting, each run keeps the layout
the search chose for it (re-searching every candidate value would cost minutes); `fit_runs` then re-searches every
run with the new values and refits, until the values stop changing: the recorded values are that fixed point, so
running the fit again reproduces them. The runs a fold scores are predicted from scratch, search included.

`cross_validate` leaves one source out at a time — a source being one stack family's published tables
(`stacks.yaml`: `family`, else the stack id) — refits every fit on the rest, and scores the source left out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.fits import FitRecord
from gpufleet.catalog.registry import Catalog
from gpufleet.fabric.topology import Cluster
from gpufleet.parallel.layout import Layout
from gpufleet.perf.step import StepOptions, estimate_step
from gpufleet.planner.intervals import LEAVES, Regime, Residual, coverage, members, recorded_residual
from gpufleet.planner.published_runs import (
    PublishedRun,
    run_calibration,
    run_cluster,
    run_job,
    run_stack,
    run_step_options,
)
from gpufleet.planner.validate import RunPrediction, predict_run
from gpufleet.workload.job import Job

#: Most sweeps of the search (coordinate descent to a fixed point, then the profile moves) `refit` makes (a judgement:
#: the shipped runs settle in two or three).
MAX_SWEEPS = 8
#: How many grid steps a profile move shifts a fit by, either way (a judgement: on the shipped runs, shifts of one
#: step reach the point shifts of one and two steps reach, from every start scripts/refit_starts.py tries).
PROFILE_STEPS = (1,)
#: |error| at or under which a prediction counts as close (the issue's "within 10 %").
CLOSE_ERROR = 0.10


@dataclass(frozen=True)
class FitCase:
    """One predicted run, its layout held at the search's choice, ready to be re-estimated with other values."""

    run: PublishedRun
    fold: str
    job: Job
    layout: Layout
    cluster: Cluster
    options: StepOptions
    raw_calibration: CalibrationProfile  # before fits

    def log_error(self, catalog: Catalog, values: Mapping[str, float]) -> float:
        """log(predicted / measured tokens/s per GPU) with the fits' `values`."""
        calibration = run_calibration(self.run, catalog, self.cluster.gpu.id, values)
        step = estimate_step(self.job, self.layout, self.cluster, calibration, self.options)
        return math.log(step.tokens_per_s_per_gpu / self.run.target.tokens_per_s_per_gpu)


@dataclass(frozen=True)
class FitResult:
    """Fitted values by fit id, the runs each was fitted on, and its in-sample mean |log error| over them."""

    values: dict[str, float]
    chosen_on: dict[str, tuple[str, ...]]
    mean_abs_log_error: dict[str, float | None]


def run_fold(run: PublishedRun, catalog: Catalog) -> str:
    """The cross-validation group of a run: its stack's family, else its stack id (the default stack's)."""
    return run_stack(run, catalog)[0].fold


def fit_cases(runs: Sequence[PublishedRun], predictions: Sequence[RunPrediction], catalog: Catalog,
              options: StepOptions | None = None, node_id: str | None = None) -> list[FitCase]:
    """A FitCase for every run that was predicted (its prediction's layout)."""
    cases = []
    for run, prediction in zip(runs, predictions, strict=True):
        if prediction.layout is None or prediction.error is None or run.global_batch is None:
            continue
        cluster = run_cluster(run, catalog, node_id)
        cases.append(FitCase(run, run_fold(run, catalog), run_job(run, run.global_batch, catalog), prediction.layout,
                             cluster, run_step_options(run, catalog, options),
                             catalog.get("calibrations", cluster.gpu.id, CalibrationProfile)))
    return cases


def selects(fit: FitRecord, case: FitCase, catalog: Catalog) -> bool:
    """Whether `fit` is fitted on `case`: it governs the run's GPU, and the run matches its selector."""
    if not fit.governs(case.raw_calibration):
        return False
    if fit.runs.moe is not None and (case.job.model.moe is not None) != fit.runs.moe:
        return False
    kernel = fit.runs.attention_kernel
    return kernel is None or run_calibration(case.run, catalog, case.cluster.gpu.id).attention_kernel == kernel


class _Scorer:
    """|log error| of each case under fitted values, remembered by the values of the fits that select the case (the
    only ones its prediction reads), so a search that comes back to a point costs nothing."""

    def __init__(self, cases: Sequence[FitCase], catalog: Catalog, fits: Sequence[FitRecord]) -> None:
        self.cases, self.catalog = cases, catalog
        self.chosen = {fit.id: [i for i, case in enumerate(cases) if selects(fit, case, catalog)] for fit in fits}
        self.reads = [tuple(fit.id for fit in fits if i in self.chosen[fit.id]) for i in range(len(cases))]
        #: every case some fit selects, each once: the cases the objective sums over
        self.every = [i for i, reads in enumerate(self.reads) if reads]
        self.memo: dict[tuple[int, tuple[float, ...]], float] = {}

    def total(self, indices: Sequence[int], values: Mapping[str, float]) -> float:
        """Sum of |log error| over the cases at `indices` (rounded, so that sums equal in exact arithmetic tie)."""
        return round(math.fsum(self._abs_error(i, values) for i in indices), 12)

    def _abs_error(self, index: int, values: Mapping[str, float]) -> float:
        key = (index, tuple(values[fit_id] for fit_id in self.reads[index]))
        if key not in self.memo:
            self.memo[key] = abs(self.cases[index].log_error(self.catalog, values))
        return self.memo[key]


def _descend(scorer: _Scorer, fits: Sequence[FitRecord], values: dict[str, float], *,
             whole_grid: bool = True) -> dict[str, float]:
    """Coordinate descent to a fixed point: each fit in turn takes the grid value with the smallest sum of |log
    error| over the cases it selects, until a pass moves none. The first pass searches each fit's whole grid (ties:
    nearest its current value) unless `whole_grid` is False; later passes walk from the current value while a step
    lowers the sum (one fit's sum is near-convex: each case's error is monotone in the fit)."""
    values = dict(values)
    for sweep in range(MAX_SWEEPS):
        before = dict(values)
        for fit in fits:
            rows = scorer.chosen[fit.id]
            if not rows:
                continue
            if whole_grid and sweep == 0:
                begin = values[fit.id]
                values[fit.id] = min((scorer.total(rows, {**values, fit.id: value}), abs(value - begin), value)
                                     for value in fit.grid())[2]
            else:
                values[fit.id] = _walk(scorer, fit, rows, values)
        if values == before:
            break
    return values


def _nearest(grid: Sequence[float], value: float) -> int:
    """The index of the grid value nearest `value` (a start need not lie on the grid)."""
    return min(range(len(grid)), key=lambda index: abs(grid[index] - value))


def _walk(scorer: _Scorer, fit: FitRecord, rows: Sequence[int], values: Mapping[str, float]) -> float:
    """From the fit's current value, step along its grid while a step lowers the sum over `rows`."""
    grid = fit.grid()
    at = _nearest(grid, values[fit.id])
    best = scorer.total(rows, {**values, fit.id: grid[at]})
    for direction in (-1, 1):
        moved = False
        while 0 <= at + direction < len(grid):
            score = scorer.total(rows, {**values, fit.id: grid[at + direction]})
            if score >= best:
                break
            at, best, moved = at + direction, score, True
        if moved:
            break
    return grid[at]


def _profile_move(scorer: _Scorer, fits: Sequence[FitRecord], values: dict[str, float]) -> dict[str, float] | None:
    """A point better than `values` over every case: one fit shifted a few grid steps, the others descended again
    with it held (coordinate descent alone stalls where two fits must move together, e.g. a faster kernel and a
    lower in-training fraction); None if no shift improves on `values`."""
    best, best_score = None, scorer.total(scorer.every, values)
    for fit in fits:
        if not scorer.chosen[fit.id]:
            continue
        grid = fit.grid()
        at = _nearest(grid, values[fit.id])
        others = [other for other in fits if other.id != fit.id]
        for shift in (sign * steps for steps in PROFILE_STEPS for sign in (-1, 1)):
            if not 0 <= at + shift < len(grid):
                continue
            moved = _descend(scorer, others, {**values, fit.id: grid[at + shift]}, whole_grid=False)
            score = scorer.total(scorer.every, moved)
            if score < best_score:
                best, best_score = moved, score
    return best


def fit_objective(cases: Sequence[FitCase], catalog: Catalog, values: Mapping[str, float]) -> float:
    """What `refit` lowers: the sum of |log error| over every case some fit selects, each case once."""
    scorer = _Scorer(cases, catalog, catalog.fits())
    return scorer.total(scorer.every, values)


def refit(cases: Sequence[FitCase], catalog: Catalog, start: Mapping[str, float] | None = None) -> FitResult:
    """The fits' grid values with the smallest mean |log error| over the runs each selects, all fits together: from
    `start` (else the recorded values), coordinate descent to a fixed point, then profile moves (`_profile_move`)
    while one lowers the sum over every case; a fit that selects no case keeps its starting value. Each fit touches
    only the runs it selects, so one objective (the sum over every selected case) is what every step lowers."""
    fits = catalog.fits()
    scorer = _Scorer(cases, catalog, fits)
    values = _descend(scorer, fits, {fit.id: (start or {}).get(fit.id, fit.value) for fit in fits})
    for _ in range(MAX_SWEEPS):
        moved = _profile_move(scorer, fits, values)
        if moved is None:
            break
        values = _descend(scorer, fits, moved, whole_grid=False)
    means = {fit.id: scorer.total(rows, values) / len(rows) if (rows := scorer.chosen[fit.id]) else None
             for fit in fits}
    return FitResult(values, {fit.id: tuple(cases[i].run.id for i in scorer.chosen[fit.id]) for fit in fits}, means)


#: Most re-search-and-refit passes `fit_runs` makes before it stops (a judgement; the shipped runs settle in 2-3).
MAX_PASSES = 5


def fit_runs(runs: Sequence[PublishedRun], catalog: Catalog, options: StepOptions | None = None,
             node_id: str | None = None) -> tuple[FitResult, list[RunPrediction], int]:
    """Refit from the recorded values, re-search every run with the new values, and repeat until no value
    changes (at most MAX_PASSES); returns the fit, the runs' predictions with its values, and the passes made."""
    values: dict[str, float] | None = None
    predictions = [predict_run(run, catalog, options, node_id) for run in runs]
    passes = 0
    while True:
        passes += 1
        result = refit(fit_cases(runs, predictions, catalog, options, node_id), catalog, values)
        predictions = [predict_run(run, catalog, options, node_id, result.values) for run in runs]
        if result.values == values or passes == MAX_PASSES:
            return result, predictions, passes
        values = result.values


@dataclass
class CrossValidation:
    """Leave-one-source-out predictions: each source scored with fits refitted on every other source."""

    predictions: dict[str, list[RunPrediction]] = field(default_factory=dict)  # by source
    values: dict[str, dict[str, float]] = field(default_factory=dict)  # fitted without that source

    def residuals(self) -> list[Residual]:
        """Each predicted run's out-of-sample residual log(predicted / measured), with its fold and regime."""
        return [Residual(p.id, source, p.regime, math.log1p(p.error))
                for source, rows in sorted(self.predictions.items())
                for p in rows if p.error is not None and p.regime is not None]

    def summary(self, runs: Sequence[PublishedRun], in_sample: Sequence[RunPrediction] = ()) -> dict[str, Any]:
        """`{"median_abs_error", "within_10pct", "runs", "dense", "moe", "by_source", "regimes", "residuals"}`;
        `regimes` holds, per interval regime (planner/intervals.py) and overall, the in-sample and
        leave-one-source-out median |error| and the nested leave-one-source-out coverage of the 80 % interval and its
        median half-width (`intervals.coverage`); `residuals` each left-out run's {id, family, regime, log_error}."""
        moe = {run.id for run in runs if run.model.moe is not None}
        pooled = [p for rows in self.predictions.values() for p in rows if p.error is not None]
        residuals = self.residuals()
        covered = coverage(residuals)
        regimes: dict[str, Any] = {}
        for regime in (*LEAVES, Regime.DENSE, Regime.ALL):
            leaves = members(regime)
            regimes[regime.value] = {
                "in_sample": _stats([p for p in in_sample if p.error is not None and p.regime in leaves]),
                "cross_validated": _stats([p for p in pooled if p.regime in leaves]),
                "interval": covered[regime.value].as_dict()}
        return {**_stats(pooled),
                "dense": _stats([p for p in pooled if p.id not in moe]),
                "moe": _stats([p for p in pooled if p.id in moe]),
                "by_source": {source: {**_stats([p for p in rows if p.error is not None]),
                                       "fitted": self.values[source]}
                              for source, rows in sorted(self.predictions.items())},
                "regimes": regimes,
                "residuals": [recorded_residual(r).model_dump() for r in residuals]}


def _stats(rows: Sequence[RunPrediction]) -> dict[str, Any]:
    errors = [abs(p.error) for p in rows if p.error is not None]
    if not errors:
        return {"runs": 0, "median_abs_error": None, "within_10pct": None}
    return {"runs": len(errors), "median_abs_error": statistics.median(errors),
            "within_10pct": sum(error <= CLOSE_ERROR for error in errors) / len(errors)}


def cross_validate(runs: Sequence[PublishedRun], predictions: Sequence[RunPrediction], catalog: Catalog,
                   options: StepOptions | None = None, node_id: str | None = None) -> CrossValidation:
    """Leave each source out in turn: refit on the others' cases, predict the source's runs from scratch."""
    cases = fit_cases(runs, predictions, catalog, options, node_id)
    result = CrossValidation()
    for source in sorted({run_fold(run, catalog) for run in runs}):
        values = refit([case for case in cases if case.fold != source], catalog).values
        result.values[source] = values
        result.predictions[source] = [predict_run(run, catalog, options, node_id, values)
                                      for run in runs if run_fold(run, catalog) == source]
    return result
