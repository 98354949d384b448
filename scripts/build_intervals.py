#!/usr/bin/env python3
"""Rebuild the recorded prediction-interval table (src/gpufleet/catalog/data/intervals.yaml).

Usage: PYTHONPATH=src .venv/bin/python scripts/build_intervals.py [--write] [--date YYYY-MM-DD]

Predicts every run of the shipped files the calibration fits are fitted on, cross-validates them leaving one source
family out at a time (what `gpufleet validate --cross-validate` does, about a minute), and turns each run's
out-of-sample residual into the per-regime bands of planner/intervals.py. Prints the bands; --write stores them.
Recorded rather than computed per command because the cross-validation takes about a minute
(tests/test_intervals.py's regression guard reruns it and compares).
"""

from __future__ import annotations

import argparse
import datetime
import math
from pathlib import Path

import yaml

from gpufleet.catalog.registry import load_catalog
from gpufleet.planner.fit import cross_validate
from gpufleet.planner.intervals import interval_record_data
from gpufleet.planner.published_runs import fitted_run_paths, load_runs
from gpufleet.planner.validate import predict_run

ROOT = Path(__file__).resolve().parent.parent
TABLE_FILE = ROOT / "src/gpufleet/catalog/data/intervals.yaml"
HEADER = """\
# Prediction intervals (planner/intervals.py): each regime's 80 % band of |log(predicted / measured tokens/s per GPU)|,
# the split-conformal quantile of the leave-one-source-out residuals below (every run of the files the calibration fits
# are fitted on, predicted with the fits refitted without its source family). A regime with fewer than `min_runs`
# residuals borrows its parent's band (widened: true). Generated: do not edit by hand; rebuild with `command`.
# tests/test_intervals.py checks the bands follow from the residuals, and (slow) that rebuilding gives them.
"""


def build(built: str) -> dict[str, object]:
    catalog = load_catalog()
    paths = fitted_run_paths()
    runs = [run for path in paths for run in load_runs(path)]
    predictions = [predict_run(run, catalog) for run in runs]
    residuals = cross_validate(runs, predictions, catalog).residuals()
    files = [str(path.relative_to(ROOT / "src")) for path in paths]
    return {"intervals": [interval_record_data(residuals, files, built)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"store the table in {TABLE_FILE.relative_to(ROOT)}")
    parser.add_argument("--date", default=datetime.date.today().isoformat(), help="the `built` date to record")
    args = parser.parse_args()
    document = build(args.date)
    record = document["intervals"][0]  # type: ignore[index]
    for regime, band in record["regimes"].items():
        print(f"{regime}: ±{math.sinh(band['quantile_log']):.1%} over {band['runs']} runs; {band['note']}")
    if args.write:
        TABLE_FILE.write_text(HEADER + yaml.safe_dump(document, sort_keys=False, width=120), encoding="utf-8")
        print(f"wrote {TABLE_FILE}")


if __name__ == "__main__":
    main()
