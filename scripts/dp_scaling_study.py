#!/usr/bin/env python3
"""The data-parallel scaling study (docs/dp-scaling.md): each series of runs with the same model, GPU, tp, pp, cp,
ep, sequence and stack but a different dp, predicted before and after the straggler term (perf/dp_scaling.py), and
the whole-run-file medians before and after: in-sample (recorded fits, and fits refitted with the term) and
leave-one-source-out (`gpufleet validate --cross-validate`), dense and MoE.

Usage: PYTHONPATH=src .venv/bin/python scripts/dp_scaling_study.py [--sigma S] [--quick] [RUN_FILE ...]

Default run files: the shipped files the fits are fitted on (published_runs.yaml and every *_fitted.yaml, as
scripts/fit_calibration.py). --quick skips the refit and the cross-validation (series and recorded-fit medians).
Takes about six minutes in full (three configurations, each refitted and cross-validated).
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gpufleet.catalog.registry import Catalog, load_catalog
from gpufleet.perf.dp_scaling import GPU_SPEED_SIGMA
from gpufleet.perf.step import StepOptions
from gpufleet.planner.fit import CLOSE_ERROR, cross_validate, fit_runs
from gpufleet.planner.published_runs import PublishedRun, fitted_run_paths, load_runs, shipped_runs_path
from gpufleet.planner.validate import RunPrediction, predict_run

ROOT = Path(__file__).resolve().parent.parent


def default_run_files() -> list[Path]:
    return fitted_run_paths()


def series_key(run: PublishedRun) -> tuple[object, ...]:
    """What must stay fixed along a data-parallel series: everything but dp (and the batch that follows it)."""
    layout = run.layout
    return (run.model.name, run.hardware.gpu, layout.tp, layout.pp, layout.cp, layout.ep, run.seq_len, run.stack,
            run.precision, run.elementwise)


def dp_series(runs: Sequence[PublishedRun]) -> list[list[PublishedRun]]:
    """Groups of two or more runs that differ in dp, each sorted by dp (then id)."""
    groups: dict[tuple[object, ...], list[PublishedRun]] = defaultdict(list)
    for run in runs:
        if run.layout.dp is not None:
            groups[series_key(run)].append(run)
    return [sorted(group, key=lambda run: (run.layout.dp or 0, run.id)) for group in groups.values()
            if len({run.layout.dp for run in group}) > 1]


def sequences_per_gpu(run: PublishedRun) -> float | None:
    """Global batch (sequences) per GPU: constant along a weak-scaling series."""
    return None if run.global_batch is None else run.global_batch / run.hardware.num_gpus


@dataclass(frozen=True)
class Figures:
    """Median |error| and share within 10 % of tokens/s per GPU, all runs, dense and MoE."""

    all: tuple[int, float | None, float | None]
    dense: tuple[int, float | None, float | None]
    moe: tuple[int, float | None, float | None]


def _stats(errors: list[float]) -> tuple[int, float | None, float | None]:
    if not errors:
        return 0, None, None
    return len(errors), statistics.median(errors), sum(e <= CLOSE_ERROR for e in errors) / len(errors)


def figures(runs: Sequence[PublishedRun], predictions: Sequence[RunPrediction]) -> Figures:
    moe = {run.id for run in runs if run.model.moe is not None}
    errors = [(p.id, abs(p.error)) for p in predictions if p.error is not None]
    return Figures(_stats([e for _, e in errors]), _stats([e for i, e in errors if i not in moe]),
                   _stats([e for i, e in errors if i in moe]))


def _fmt(stats: tuple[int, float | None, float | None]) -> str:
    n, median, close = stats
    return "-" if median is None or close is None else f"{median:6.1%} ({close:4.0%} within 10 %, n={n})"


def print_series(runs: Sequence[PublishedRun], predictions: dict[str, dict[str, RunPrediction]]) -> None:
    """Each dp series: measured and predicted tokens/s per GPU per configuration, as ratios to the first run."""
    names = list(predictions)
    print("## Data-parallel series (tokens/s per GPU, recorded fits; ratio = to the series' first run)")
    for series in dp_series(runs):
        first = series[0]
        weak = len({sequences_per_gpu(run) for run in series}) == 1
        eager = ", eager" if first.elementwise == "eager" else ""
        print(f"\n{first.model.name} on {first.hardware.gpu}, tp{first.layout.tp} pp{first.layout.pp}, "
              f"{first.precision or 'bf16'}{eager}, stack {first.stack}: {'weak' if weak else 'NOT weak'} scaling "
              f"(sequences per GPU {', '.join(f'{sequences_per_gpu(run):g}' for run in series)})")
        print(f"  {'run':44s} {'dp':>4s} {'measured':>9s} " + " ".join(f"{name:>9s}" for name in names)
              + "  | ratio: measured " + " ".join(f"{name:>8s}" for name in names)
              + "  | error: " + " ".join(f"{name:>8s}" for name in names))
        base: dict[str, float] = {}
        for run in series:
            rows = {name: predictions[name][run.id] for name in names}
            values = {name: row.predicted_tokens_per_s_per_gpu for name, row in rows.items()}
            measured = run.target.tokens_per_s_per_gpu
            if any(value is None for value in values.values()):
                print(f"  {run.id:44s} {run.layout.dp:>4d} {measured:9,.0f} skipped: {rows[names[0]].reason}")
                continue
            base = base or {"measured": measured, **{name: value or 1.0 for name, value in values.items()}}
            print(f"  {run.id:44s} {run.layout.dp:>4d} {measured:9,.0f} "
                  + " ".join(f"{values[name]:9,.0f}" for name in names)
                  + f"  |        {measured / base['measured']:6.3f}  "
                  + " ".join(f"{(values[name] or 0) / base[name]:8.3f}" for name in names)
                  + "  |        " + " ".join(f"{rows[name].error or 0:+8.1%}" for name in names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--sigma", type=float, default=GPU_SPEED_SIGMA, help="per-GPU speed spread when on")
    parser.add_argument("--quick", action="store_true", help="series and recorded-fit medians only")
    args = parser.parse_args()
    catalog: Catalog = load_catalog()
    runs = [run for path in (args.files or default_run_files()) for run in load_runs(path)]
    options = {"off": StepOptions(),
               "job": StepOptions(straggler_sigma=args.sigma, straggler_scope="job"),
               "replicas": StepOptions(straggler_sigma=args.sigma, straggler_scope="replicas")}
    recorded = {name: [predict_run(run, catalog, opts) for run in runs] for name, opts in options.items()}
    print(f"Straggler term (perf/dp_scaling.py), sigma {args.sigma:g}: off (today's default); job = the slowest of "
          "all GPUs over a median GPU; replicas = only what dp adds over one replica of tp*pp*cp GPUs\n")
    print_series(runs, {name: {p.id: p for p in rows} for name, rows in recorded.items()})
    print(f"\n## Whole run files ({len(runs)} runs): median |error| of tokens/s per GPU")
    fitted: dict[str, dict[str, float] | None] = dict.fromkeys(options)
    for name, opts in options.items():
        rows = [("in-sample, recorded fits", figures(runs, recorded[name]))]
        if not args.quick:
            result, refitted, _ = fit_runs(runs, catalog, opts)
            fitted[name] = result.values
            values = ", ".join(f"{key} {value:g}" for key, value in result.values.items())
            rows.append((f"in-sample, refitted ({values})", figures(runs, refitted)))
            loso = cross_validate(runs, recorded[name], catalog, opts)
            rows.append(("leave-one-source-out", figures(runs, [p for by_source in loso.predictions.values()
                                                                 for p in by_source])))
        for what, row in rows:
            print(f"{name:8s} {what}\n         all {_fmt(row.all)}; dense {_fmt(row.dense)}; MoE {_fmt(row.moe)}")
    vtrain_catalog = load_catalog([ROOT / "tests/data/vtrain_cluster.yaml"])
    vtrain = load_runs(shipped_runs_path("vtrain_runs.yaml"))
    print(f"\n## vTrain's {len(vtrain)} A100 runs (in no fit's set; their own node; no overlap), with the fits "
          f"{'recorded' if args.quick else 'refitted for each configuration (above)'}")
    for name, opts in options.items():
        opts = replace(opts, dp_overlap=False)
        row = figures(vtrain, [predict_run(run, vtrain_catalog, opts, "vtrain-a100-node", fitted[name])
                               for run in vtrain])
        print(f"{name:8s} all {_fmt(row.all)}")


if __name__ == "__main__":
    main()
