"""`gpufleet validate`: predict published, measured runs with their own layouts and print the error."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.cli._workload_flags import (
    DpOverlapWindowOption,
    Fp8AmaxSyncOption,
    Fsdp2CopiesOption,
    OverlapContentionOption,
    OverlapPpOption,
    StragglerScopeOption,
    StragglersOption,
)
from gpufleet.cli.common import CalibrationOption, CatalogOption, JsonOption, open_catalog, with_calibration
from gpufleet.cli.output import Output
from gpufleet.planner.model_terms import parse_model_terms

if TYPE_CHECKING:
    from gpufleet.planner.ranking import GroupRanking
    from gpufleet.planner.validate import RunPrediction
    from gpufleet.planner.validate_request import ValidateReport


SHIPPED = "shipped runs the fits are fitted on"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _predicted(p: RunPrediction) -> str:
    """`3,560 (3,200–3,900)`: the predicted tokens/s per GPU and its 80 % interval."""
    if p.predicted_tokens_per_s_per_gpu is None:
        return "-"
    text = f"{p.predicted_tokens_per_s_per_gpu:,.0f}"
    return f"{text} {p.interval.text(',.0f')}" if p.interval is not None else text


def _render_cross_validation(console: Console, median: float | None, cv: dict[str, Any]) -> None:
    """The leave-one-source-out table: per source left out, then pooled, next to the in-sample figure."""
    table = Table(title="leave-one-source-out (fits refitted without the source; |error| of tokens/s per GPU)",
                  title_justify="left")
    for column in ("source left out", "n", "median |error|", "within 10 %"):
        table.add_column(column)

    def row(name: str, stats: dict[str, Any]) -> None:
        median, close = stats["median_abs_error"], stats["within_10pct"]
        table.add_row(name, str(stats["runs"]), "-" if median is None else f"{median:.1%}",
                      "-" if close is None else f"{close:.0%}")

    for name, stats in cv["by_source"].items():
        row(name, stats)
    row("all (dense)", cv["dense"])
    row("all (MoE)", cv["moe"])
    row("all", cv)
    console.print(table)
    console.print(f"in-sample median |error| {'-' if median is None else f'{median:.1%}'}; "
                  f"leave-one-source-out {cv['median_abs_error']:.1%} (the error to expect on a new stack)")
    _render_regimes(console, cv["regimes"])


def _render_regimes(console: Console, regimes: dict[str, Any]) -> None:
    """In-sample and leave-one-source-out error next to the 80 % interval's coverage of the runs left out, by
    regime (each source family's runs get the band built from the other families' residuals only)."""
    table = Table(title="by regime: in-sample, leave-one-source-out, and the 80 % interval on the runs left out",
                  title_justify="left")
    for column in ("regime", "n", "in-sample median |error|", "left-out median |error|", "inside interval",
                   "median half-width"):
        table.add_column(column, justify="left" if column == "regime" else "right")

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    for name, row in regimes.items():
        interval = row["interval"]
        table.add_row(name, str(row["cross_validated"]["runs"]), share(row["in_sample"]["median_abs_error"]),
                      share(row["cross_validated"]["median_abs_error"]),
                      "-" if interval["coverage"] is None else f"{interval['coverage']:.0%} "
                      f"({interval['inside']}/{interval['runs']})", share(interval["median_half_width"]))
    console.print(table)


def _render_ranking(console: Console, ranking: GroupRanking) -> None:
    """validate --rank's table: per group, how the planner's order of layouts compares with the measured one."""
    table = Table(title="layout ranking per group (same model, GPU and count)", title_justify="left")
    for column in ("group", "runs", "Spearman", "ceiling", "regret", "top-3", "median |err|", "measured best",
                   "pick"):
        table.add_column(column)
    for row in ranking.groups:
        table.add_row(row.group, str(row.runs), f"{row.spearman:.2f}", f"{row.smooth_model_ceiling:.2f}",
                      f"{row.regret:.1%}", f"{row.top3_overlap:.0%}", f"{row.median_abs_error:.1%}",
                      row.measured_best_layout, row.pick_layout)
    console.print(table)
    console.print("ceiling: the Spearman of a reference model smooth in micro-batch size that is told each (tp, pp, "
                  "cp, ep, vpp) sub-group's work and per-micro-batch cost, fitted to the measurements themselves")
    if ranking.skipped_groups:
        console.print("groups with fewer than 4 runs (not scored): " + ", ".join(
            f"{g.group} ({g.runs})" for g in ranking.skipped_groups))


def register(app: typer.Typer) -> None:
    @app.command("validate")
    def validate(
        runs: list[Path] = typer.Option(None, "--runs", help="A run file (YAML list of runs; schema in "
                                        "docs/runs.md; repeatable); default: every shipped run file the "
                                        "calibration fits are fitted on (published_runs.yaml, *_fitted.yaml)."),
        cross_validate: bool = typer.Option(False, "--cross-validate", help="Also refit the recorded calibration "
                                            "fits (catalog fits:) leaving one source (stack family) out at a time, "
                                            "and score each source left out: the error to expect on a new stack "
                                            "(about a minute for the shipped and test runs)."),
        rank: bool = typer.Option(False, "--rank", help="Also score how well the planner ranks layouts within "
                                  "groups of runs of the same model, GPU and GPU count."),
        node: str = typer.Option(None, "--node", help="Run on this catalog node instead of the GPU's default "
                                 "(for runs whose GPU it holds), e.g. a user node describing the measured cluster."),
        dp_overlap: bool = typer.Option(True, "--overlap-dp/--no-overlap-dp", "--dp-overlap/--no-dp-overlap",
                                        help="Whether the framework overlaps gradient reduction with backward "
                                        "(DeepSpeed's pipeline engine does not); the same switch as plan's."),
        plot: Path = typer.Option(None, "--plot", help="Write predicted against measured tokens/s per GPU "
                                  "(log axes, ±25 % band; colour = quality, or = group with --rank) to FILE: "
                                  ".png/.svg/.pdf need matplotlib, .html writes a table."),
        html_report: Path = typer.Option(None, "--html", help="Write a self-contained HTML report to FILE: a "
                                         "parity plot (one colour per source), the error table and the summary "
                                         "figures (docs/report.md)."),
        stragglers: str | None = StragglersOption,
        straggler_scope: str | None = StragglerScopeOption,
        overlap_contention: str | None = OverlapContentionOption,
        fsdp2_copies: bool | None = Fsdp2CopiesOption,
        fp8_amax_sync: str | None = Fp8AmaxSyncOption,
        dp_overlap_window: str | None = DpOverlapWindowOption,
        overlap_pp: bool | None = OverlapPpOption,
        catalog: list[Path] = CatalogOption,
        calibration: Path | None = CalibrationOption,
        json: bool = JsonOption,
    ) -> None:
        """Predict each run's tokens/s per GPU, with its 80 % interval, and report predicted, target and error.

        Null layout fields other than tp/pp/dp are filled by plan's own search (listed); runs that
        cannot be predicted are listed as skipped with the reason, and published layouts the memory
        model rejects are counted. Each run uses its `stack:` (megatron-lm when it names none).
        Rows are grouped by source family (the cross-validation folds). The interval is the recorded
        leave-one-source-out band of the run's regime (catalog intervals:, planner/intervals.py).

        Examples: gpufleet validate --plot parity.png;
        gpufleet validate --cross-validate --runs a.yaml --runs b.yaml
        """
        from gpufleet.planner.validate_request import ValidateRequest, validate_runs

        out, terms = Output(json), parse_model_terms(stragglers, straggler_scope, overlap_contention, fsdp2_copies,
                                                     fp8_amax_sync, dp_overlap_window, overlap_pp=overlap_pp)
        request = ValidateRequest(runs=tuple(runs) if runs else None, cross_validate=cross_validate, rank=rank,
                                  node=node, dp_overlap=dp_overlap, terms=terms)
        _check_outputs(plot, html_report)
        report = validate_runs(request, open_catalog(with_calibration(catalog, calibration)))
        _write_figures(report, plot, html_report)
        failure = report.failure()
        if failure is not None:
            out.check_failed(failure, report.data, lambda console: _render(console, report))
        out.emit(report.data, lambda console: _render(console, report))


def _check_outputs(plot: Path | None, html_report: Path | None) -> None:
    """Refuse an unwritable --plot or --html before any run is priced."""
    from gpufleet.report.plots import check_output_path

    if plot is not None:
        check_output_path(plot, "--plot")
    if html_report is not None:
        check_output_path(html_report, "--html", (".html", ".htm"))


def _write_figures(report: ValidateReport, plot: Path | None, html_report: Path | None) -> None:
    """The parity plot and the HTML report, as asked (their paths go into the --json document)."""
    request, predictions = report.request, report.predictions
    if plot is not None:
        from gpufleet.planner.ranking import group_key
        from gpufleet.report.plots import write_parity_plot

        points = [(p.id, group_key(run) if request.rank else p.quality, p.predicted_tokens_per_s_per_gpu,
                   p.target_tokens_per_s_per_gpu)
                  for run, p in zip(report.loaded, predictions, strict=True) if p.predicted_tokens_per_s_per_gpu]
        write_parity_plot(plot, points, quantity="tokens/s per GPU",
                          title=f"gpufleet validate: {len(points)} runs, predicted vs measured")
        report.data["plot"] = str(plot)
    if html_report is not None and report.predicted_any:
        from gpufleet.report.validate_html import write_validate_report

        title = ", ".join(map(str, request.runs)) if request.runs else SHIPPED
        write_validate_report(html_report, report.loaded, predictions, report.summary, f"gpufleet validate: {title}")
        report.data["html"] = str(html_report)


def _render_runs(console: Console, report: ValidateReport) -> None:
    runs = report.request.runs
    source = f"runs in {', '.join(map(str, runs))}" if runs else SHIPPED
    table = Table(title=f"{source} ({len(report.predictions)}), by source family; tokens/s per GPU, predicted "
                  "with its 80 % interval", title_justify="left")
    for column in ("family", "run", "quality", "layout", "regime", "predicted (80 %)", "target", "error", "note"):
        table.add_column(column, justify="right" if column in ("predicted (80 %)", "target", "error") else "left")
    for p in sorted(report.predictions, key=lambda p: p.family or ""):  # stable: file order within a family
        table.add_row(p.family or "-", p.id, p.quality, p.layout.short() if p.layout else "-",
                      p.regime.value if p.regime else "-", _predicted(p),
                      f"{p.target_tokens_per_s_per_gpu:,.0f}", _pct(p.error), p.note)
    console.print(table)


def _render_summary(console: Console, report: ValidateReport) -> None:
    summary = report.summary
    stats = Table(title="median and worst |error| (tokens/s per GPU)", title_justify="left")
    for column in ("runs", "n", "median |error|", "worst |error|", "worst run"):
        stats.add_column(column)
    for key in ("high", "medium", "high+medium", "low", "all"):
        row = summary.groups[key]
        stats.add_row(key, str(row.runs), f"{row.median_abs_error:.1%}" if row.median_abs_error is not None else "-",
                      f"{row.worst_abs_error:.1%}" if row.worst_abs_error is not None else "-", row.worst_id or "-")
    console.print(stats)
    if summary.memory_rejected:
        console.print(f"memory model rejects {len(summary.memory_rejected)} published layout(s) (predicted anyway, "
                      f"in the figures above): {', '.join(summary.memory_rejected)}")
    if summary.skipped:
        console.print(f"skipped: {', '.join(summary.skipped)}")
    unversioned = [p.id for p in report.predictions if p.stack_version_assumed]
    if unversioned:
        console.print(f"{len(unversioned)} run(s) name a framework without a version, so got its conservative "
                      f"settings (the note says which; name the release, e.g. nemo@24.12): {', '.join(unversioned)}")


def held_out_line(held_out: dict[str, Any]) -> str:
    """One line: the held-out files' runs (in no fit), their median |error| and their interval coverage."""
    stats, interval = held_out["summary"]["all"], held_out["interval"]
    coverage = "-" if interval["coverage"] is None else f"{interval['coverage']:.0%}"
    median = "-" if stats["median_abs_error"] is None else f"{stats['median_abs_error']:.1%}"
    chosen = len(held_out["left_out_chosen_on"])
    also = f" ({chosen} more that a constant fit was chosen on are not scored here)" if chosen else ""
    return (f"held out of every calibration fit ({', '.join(held_out['files'])}): {stats['runs']} runs{also}, "
            f"median |error| {median}, inside their 80 % interval {coverage} ({interval['inside']}/{interval['runs']})")


def _render(console: Console, report: ValidateReport) -> None:
    """The runs, the summary, and the cross-validation and ranking when asked."""
    _render_runs(console, report)
    _render_summary(console, report)
    if not report.request.runs:
        from gpufleet.planner.validate_request import VTRAIN_COMMAND

        console.print(f"vTrain's runs (A100, their own cluster) are validated apart: {VTRAIN_COMMAND}")
    if "held_out" in report.data:
        console.print(held_out_line(report.data["held_out"]), highlight=False)
    if report.request.cross_validate:
        _render_cross_validation(console, report.summary.all.median_abs_error, report.data["cross_validated"])
    if report.ranking is not None:
        _render_ranking(console, report.ranking)
