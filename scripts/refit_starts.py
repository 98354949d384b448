#!/usr/bin/env python3
"""Does the leave-one-source-out refit depend on where it starts? (docs/residuals.md)

For every source family left out, refit the calibration fits on the other families' runs (`planner.fit.refit`)
from four starts (the recorded values, every fit at the low end of its grid, at its high end, at its middle), and
print the values each start reaches with the objective they reach (`planner.fit.fit_objective`: the sum of |log
error| over every run some fit selects). The shipped refit is the one from the recorded values; a fold where
another start reaches a lower objective is marked. Last, the leave-one-source-out median |error| with each fold's
values from the recorded start and from its best start: equal when the search does not depend on its start.

Usage: PYTHONPATH=src .venv/bin/python scripts/refit_starts.py   (about five minutes on two shared cores)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from gpufleet.catalog.fits import FitRecord
from gpufleet.catalog.registry import Catalog, load_catalog
from gpufleet.planner.fit import fit_cases, fit_objective, refit
from gpufleet.planner.published_runs import PublishedRun, fitted_run_paths, load_runs
from gpufleet.planner.validate import predict_run


def starts(fits: Sequence[FitRecord]) -> dict[str, dict[str, float]]:
    return {"recorded": {fit.id: fit.value for fit in fits},
            "low": {fit.id: fit.low for fit in fits},
            "high": {fit.id: fit.high for fit in fits},
            "middle": {fit.id: fit.grid()[len(fit.grid()) // 2] for fit in fits}}


def left_out_errors(runs: Sequence[PublishedRun], catalog: Catalog, values: Mapping[str, float]) -> list[float]:
    """|error| of each left-out run predicted with the fold's fitted values."""
    errors = [predict_run(run, catalog, fitted=values).error for run in runs]
    return [abs(error) for error in errors if error is not None]


def main() -> None:
    catalog = load_catalog()
    runs = [run for path in fitted_run_paths() for run in load_runs(path)]
    predictions = [predict_run(run, catalog) for run in runs]
    cases = fit_cases(runs, predictions, catalog)
    fits = catalog.fits()
    recorded_start: list[float] = []
    best_start: list[float] = []
    for source in sorted({case.fold for case in cases}):
        rest = [case for case in cases if case.fold != source]
        reached = {name: refit(rest, catalog, start).values for name, start in starts(fits).items()}
        scores = {name: fit_objective(rest, catalog, values) for name, values in reached.items()}
        best = min(scores, key=scores.__getitem__)
        mark = "" if math.isclose(scores["recorded"], scores[best], abs_tol=1e-9) else "  <- another start fits better"
        print(f"{source} left out{mark}")
        for name, values in reached.items():
            shown = ", ".join(f"{key} {value:g}" for key, value in values.items())
            print(f"  from {name:<8} objective {scores[name]:.4f}: {shown}")
        left_out = [run for run, prediction in zip(runs, predictions, strict=True) if prediction.family == source]
        recorded_start += left_out_errors(left_out, catalog, reached["recorded"])
        best_start += left_out_errors(left_out, catalog, reached[best])
    print(f"LOSO median |error|, each fold refitted from the recorded values: "
          f"{statistics.median(recorded_start):.2%} over {len(recorded_start)} runs; from the start that fits the "
          f"other families best: {statistics.median(best_start):.2%}")


if __name__ == "__main__":
    main()
