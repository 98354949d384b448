#!/usr/bin/env python3
"""FP8 amax-synchronisation study (docs/dp-scaling.md, perf/dp_scaling.py: amax_sync_fraction).

Scores the data-parallel weak-scaling series of NVIDIA's DGX Cloud recipes (catalog/runs/dp_scaling_holdout.yaml,
held out of every recorded fit) with the term off and on, chooses its spread sigma on the FP8 series' ratios
(tokens/s per GPU over the series' first run, so the level the recorded fits set cancels), scores the choice
leaving one series out (and on FP8 series in no choice: runs not in the fit's chosen_on), and scores the shipped
run files' FP8 rows (in no choice of sigma) with it on.

Also prints the strong-scaling series (Megatron-Core's GPT-3 177B, BF16: the term does not apply) under both
data-parallel overlap windows (--window).

--cross-validate adds `validate --cross-validate`'s figures on the shipped run files for four configurations (each
window with the term off and with its chosen sigma): about six minutes.

Usage: PYTHONPATH=src .venv/bin/python scripts/fp8_amax_sync_study.py [--sigma S] [--window chunks] [--cross-validate]
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from gpufleet.catalog.judgements import shipped_judgements
from gpufleet.catalog.registry import Catalog, load_catalog
from gpufleet.perf.step import StepOptions
from gpufleet.planner.fit import cross_validate
from gpufleet.planner.published_runs import PublishedRun, fitted_run_paths, load_runs
from gpufleet.planner.validate import RunPrediction, predict_run

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = ROOT / "src/gpufleet/catalog/runs/dp_scaling_holdout.yaml"
GRID = [i * 0.0025 for i in range(41)]  # 0 .. 10 %


def series(runs: Sequence[PublishedRun]) -> list[list[PublishedRun]]:
    """Runs that differ only in dp (and the batch that follows it), each sorted by dp."""
    groups: dict[tuple[object, ...], list[PublishedRun]] = defaultdict(list)
    for run in runs:
        lay = run.layout
        key = (run.model.name, run.hardware.gpu, run.precision, lay.tp, lay.pp, lay.cp, lay.vpp, run.stack)
        groups[key].append(run)
    return [sorted(group, key=lambda run: run.layout.dp or 0) for group in groups.values() if len(group) > 1]


WINDOW = "micro-batch"  # --window: StepOptions.dp_overlap_window


def predict(runs: Sequence[PublishedRun], catalog: Catalog, sigma: float) -> dict[str, RunPrediction]:
    options = replace(StepOptions(), fp8_amax_sync_sigma=sigma, dp_overlap_window=WINDOW)
    return {run.id: predict_run(run, catalog, options) for run in runs}


def comparable(group: Sequence[PublishedRun], preds: dict[str, RunPrediction]) -> list[PublishedRun]:
    """The series without runs whose filled recompute differs from its largest run's (the memory model's fill,
    not dp scaling, moves those)."""
    last = preds[group[-1].id].layout
    return [run for run in group if (lay := preds[run.id].layout) is not None and last is not None
            and lay.recompute == last.recompute and lay.recompute_layers == last.recompute_layers]


def ratio_errors(group: Sequence[PublishedRun], preds: dict[str, RunPrediction]) -> list[float]:
    runs = comparable(group, preds)
    base = runs[0]
    out = []
    for run in runs[1:]:
        measured = run.target.tokens_per_s_per_gpu / base.target.tokens_per_s_per_gpu
        predicted = ((preds[run.id].predicted_tokens_per_s_per_gpu or 0)
                     / (preds[base.id].predicted_tokens_per_s_per_gpu or 1))
        out.append(predicted / measured - 1)
    return out


def choose(groups: Sequence[Sequence[PublishedRun]], by_sigma: dict[float, dict[str, RunPrediction]]) -> float:
    def score(sigma: float) -> float:
        errs = [abs(e) for group in groups for e in ratio_errors(group, by_sigma[sigma])]
        return statistics.median(errs)
    return min(GRID, key=lambda sigma: (score(sigma), sigma))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sigma", type=float, default=None, help="score this sigma instead of choosing one")
    parser.add_argument("--window", choices=["micro-batch", "chunks"], default="micro-batch",
                        help="the data-parallel overlap window (StepOptions.dp_overlap_window)")
    parser.add_argument("--cross-validate", action="store_true", help="also cross-validate the shipped run files")
    args = parser.parse_args()
    global WINDOW
    WINDOW = args.window
    catalog = load_catalog()
    runs = load_runs(PUBLIC)
    groups = series(runs)
    chosen_on = set(catalog.records("constant_fits")["fp8-amax-sync-sigma"].chosen_on)  # type: ignore[attr-defined]
    fp8 = [group for group in groups if group[0].precision == "fp8" and all(run.id in chosen_on for run in
                                                                            comparable(group, predict(group, catalog,
                                                                                                      0.0)))]
    held = [group for group in groups if group[0].precision == "fp8" and group not in fp8]
    by_sigma = {sigma: predict(runs, catalog, sigma) for sigma in GRID}
    chosen = args.sigma if args.sigma is not None else choose(fp8, by_sigma)
    if chosen not in by_sigma:
        by_sigma[chosen] = predict(runs, catalog, chosen)
    off, on = by_sigma[0.0], by_sigma[chosen]
    print(f"overlap window {WINDOW}; sigma chosen on the FP8 series' ratios: {chosen:.4f}")
    print("\n## Series (tokens/s per GPU; ratio to the series' first comparable run)")
    for group in groups:
        runs_c = comparable(group, off)
        base = runs_c[0]
        print(f"\n{group[0].model.name}, {group[0].precision}, tp{group[0].layout.tp} pp{group[0].layout.pp} "
              f"cp{group[0].layout.cp} vpp{group[0].layout.vpp}")
        print(f"  {'run':28s} {'dp':>3s} {'measured':>9s} {'off':>7s} {'on':>7s} | {'ratio: meas':>11s} {'off':>6s} "
              f"{'on':>6s} | {'error: off':>10s} {'on':>7s}")
        for run in group:
            left = run not in runs_c
            m = run.target.tokens_per_s_per_gpu
            a, b = off[run.id].predicted_tokens_per_s_per_gpu or 0, on[run.id].predicted_tokens_per_s_per_gpu or 0
            if left:
                ratio = "   (memory fill differs: left out of the ratios)"
            else:
                ratio = (f"{m / base.target.tokens_per_s_per_gpu:11.3f} "
                         f"{a / (off[base.id].predicted_tokens_per_s_per_gpu or 1):6.3f} "
                         f"{b / (on[base.id].predicted_tokens_per_s_per_gpu or 1):6.3f}")
            print(f"  {run.id:28s} {run.layout.dp:3d} {m:9.1f} {a:7.1f} {b:7.1f} | {ratio} | "
                  f"{a / m - 1:+10.1%} {b / m - 1:+7.1%}")
    print("\n## Leave one FP8 series out: sigma chosen on the others, |ratio error| of the one left out (median)")
    for i, group in enumerate(fp8):
        rest = [g for j, g in enumerate(fp8) if j != i]
        sigma = choose(rest, by_sigma)
        off_e = statistics.median(abs(e) for e in ratio_errors(group, off))
        on_e = statistics.median(abs(e) for e in ratio_errors(group, by_sigma[sigma]))
        print(f"  {group[0].model.name:18s} sigma {sigma:.4f}: off {off_e:.1%} -> on {on_e:.1%}")
    for group in held:
        off_e = statistics.median(abs(e) for e in ratio_errors(group, off))
        on_e = statistics.median(abs(e) for e in ratio_errors(group, on))
        print(f"  {group[0].model.name:18s} in no choice of sigma, at {chosen:.4f}: off {off_e:.1%} -> on {on_e:.1%}")
    for name, chosen_preds in (("off", off), ("on", on)):
        errs = [abs(e) for group in fp8 for e in ratio_errors(group, chosen_preds)]
        lvl = [abs(p.error) for p in chosen_preds.values() if p.error is not None]
        print(f"  FP8 series, all, {name}: median |ratio error| {statistics.median(errs):.1%}; "
              f"every run's median |error| {statistics.median(lvl):.1%}")
    print("\n## Shipped run files' FP8 rows (in no choice of sigma), recorded fits, median |error|")
    shipped = [run for path in fitted_run_paths() for run in load_runs(path) if run.precision == "fp8"]
    for name, sigma in (("off", 0.0), ("on", chosen)):
        preds = predict(shipped, catalog, sigma)
        errs = [abs(p.error) for p in preds.values() if p.error is not None]
        print(f"  {name}: {statistics.median(errs):.1%} over {len(errs)} runs")
    if args.cross_validate:
        print_cross_validation(catalog)


#: the sigma the FP8 series choose under the micro-batch window (this script's own choice; the chunks window's is the
#: recorded constant fit, judgements' fp8_amax_sync_sigma)
MICRO_BATCH_SIGMA = 0.0225


def configurations() -> tuple[tuple[str, float], ...]:
    """(window, sigma) pairs --cross-validate scores: each window off, and with the sigma the FP8 series choose
    under it."""
    return (("micro-batch", 0.0), ("micro-batch", MICRO_BATCH_SIGMA), ("chunks", 0.0),
            ("chunks", shipped_judgements().fp8_amax_sync_sigma))


REGIMES = ("dense", "model-parallel", "fp8", "moe")
FAMILIES = ("mtnlg-megatron-deepspeed", "megatron-bridge", "nemo", "megatron-core", "llama3-meta")


def print_cross_validation(catalog: Catalog) -> None:
    """`validate --cross-validate` on the shipped run files under each configuration: median |error| in-sample and
    leave-one-source-out, by regime and for the families the study watches."""
    runs = [run for path in fitted_run_paths() for run in load_runs(path)]
    print("\n## Shipped run files, validate --cross-validate (median |error|)")
    for window, sigma in configurations():
        options = replace(StepOptions(), fp8_amax_sync_sigma=sigma, dp_overlap_window=window)  # type: ignore[arg-type]
        predictions = [predict_run(run, catalog, options) for run in runs]
        summary = cross_validate(runs, predictions, catalog, options).summary(runs, predictions)
        regimes = summary["regimes"]

        def pct(stats: dict[str, object]) -> str:
            value = stats.get("median_abs_error")
            return f"{value:.1%}" if isinstance(value, float) else "-"

        cells = [f"in-sample {pct(regimes['all']['in_sample'])}", f"LOSO {pct(regimes['all']['cross_validated'])}"]
        cells += [f"{name} {pct(regimes[name]['cross_validated'])}" for name in REGIMES]
        cells += [f"{family} {pct(summary['by_source'][family])}" for family in FAMILIES]
        print(f"  {window:11s} sigma {sigma:.4f}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
