#!/usr/bin/env python3
"""Refit the recorded calibration fits (src/gpufleet/catalog/data/fits.yaml) from the run files.

Usage: PYTHONPATH=src .venv/bin/python scripts/fit_calibration.py [--write] [--cross-validate] [RUN_FILE ...]

Default run files: the shipped files the fits are fitted on (published_runs.yaml and every *_fitted.yaml; vTrain's
runs need their own cluster file and are validated apart). Prints each fit's recorded and refitted value and the
runs it is fitted on; --write stores the refitted values and `chosen_on` lists in fits.yaml; --cross-validate also
prints the leave-one-source-out error (what `gpufleet validate --cross-validate` prints for the same files).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from gpufleet.catalog.registry import load_catalog
from gpufleet.planner.fit import cross_validate, fit_runs
from gpufleet.planner.published_runs import PublishedRun, fitted_run_paths, load_runs
from gpufleet.planner.validate import predict_run, summarize

ROOT = Path(__file__).resolve().parent.parent
FITS_FILE = ROOT / "src/gpufleet/catalog/data/fits.yaml"


def default_run_files() -> list[Path]:
    return fitted_run_paths()


def write_fits(values: dict[str, float], chosen_on: dict[str, tuple[str, ...]]) -> None:
    """Replace each record's `value:` and `chosen_on:` lines in fits.yaml, keeping its comments and order."""
    text = FITS_FILE.read_text(encoding="utf-8")
    blocks = re.split(r"(?m)^(?=  - id: )", text)
    out = []
    for block in blocks:
        match = re.match(r"  - id: (\S+)", block)
        if match and match.group(1) in values:
            fit_id = match.group(1)
            block = re.sub(r"(?m)^    value: .*$", f"    value: {values[fit_id]!r}", block)
            block = re.sub(r"(?m)^    chosen_on: .*\n", "", block)
            # the record ends at its first line not indented under it; what follows (the next section) stays after
            body = block.index("\n") + 1
            end = re.search(r"(?m)^(?!    )", block[body:])
            cut = body + end.start() if end else len(block)
            record, rest = block[:cut], block[cut:]
            block = record.rstrip("\n") + f"\n    chosen_on: {json.dumps(list(chosen_on[fit_id]))}\n" + \
                ("\n" + rest.lstrip("\n") if rest.strip() else rest)
        out.append(block)
    FITS_FILE.write_text("".join(out), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--write", action="store_true", help="store the refitted values in fits.yaml")
    parser.add_argument("--cross-validate", action="store_true", help="print the leave-one-source-out error")
    args = parser.parse_args()
    catalog = load_catalog()
    runs: list[PublishedRun] = [run for path in (args.files or default_run_files()) for run in load_runs(path)]
    recorded = [predict_run(run, catalog) for run in runs]
    result, fitted, passes = fit_runs(runs, catalog)
    for fit in catalog.fits():
        loss = result.mean_abs_log_error[fit.id]
        print(f"{fit.id}: recorded {fit.value:g}, refitted {result.values[fit.id]:g} over "
              f"{len(result.chosen_on[fit.id])} runs (mean |log error| {'-' if loss is None else f'{loss:.3f}'})")
    print(f"{passes} re-search passes")
    print(f"in-sample, recorded values: {summarize(recorded).all}")
    print(f"in-sample, refitted values: {summarize(fitted).all}")
    if args.write:
        write_fits(result.values, result.chosen_on)
        print(f"wrote {FITS_FILE.relative_to(ROOT)}")
    if args.cross_validate:
        summary = cross_validate(runs, recorded, catalog).summary(runs)
        print(json.dumps({"cross_validated": summary}, indent=2))


if __name__ == "__main__":
    main()
