"""The HTML report of `gpufleet validate`: predicted against measured, one colour per source, with the error
table and the summary figures."""

from __future__ import annotations

import html
import re
from pathlib import Path

from gpufleet.planner.published_runs import PublishedRun
from gpufleet.planner.validate import RunPrediction, Summary
from gpufleet.report.html import page, table, write_report
from gpufleet.report.svg import Axis, Series, bar_chart, figure, line_chart

#: Half-width of the parity plot's band, the same ±25 % `validate --plot` draws (judgement: the error a
#: planner can live with when choosing between layouts).
BAND = 0.25
QUALITIES = ("high", "medium", "low", "all")


def source_label(source: str) -> str:
    """A short name for where a run was published: the repository (owner/name) for a repo path, else the text
    before the first parenthesis, comma or semicolon ("Narayanan et al. SC21")."""
    first = source.split(" ", 1)[0]
    if "/" in first and not first.startswith("http"):
        return first
    return re.split(r" \(|[,;]", source, maxsplit=1)[0].strip()[:48]


def validate_report(runs: list[PublishedRun], predictions: list[RunPrediction], summary: Summary,
                    title: str) -> str:
    pairs = [(source_label(run.source), p) for run, p in zip(runs, predictions, strict=True)]
    predicted = [(source, p) for source, p in pairs if p.predicted_tokens_per_s_per_gpu]
    body = [f"<h1>{html.escape(title)}</h1>",
            f"<p class='summary'>{_headline(predicted, summary)}</p>",
            "<h2>Predicted against measured</h2>", _parity(predicted),
            "<h2>Error by quality of the measurement</h2>", _summary_chart(summary), _summary_table(summary),
            "<h2>Every run</h2>", _error_table(pairs)]
    return page(title, body)


def _headline(predicted: list[tuple[str, RunPrediction]], summary: Summary) -> str:
    inside = sum(1 for _, p in predicted if p.error is not None and abs(p.error) <= BAND)
    median = summary.all.median_abs_error
    said = f"{len(predicted)} runs predicted from {len({s for s, _ in predicted})} sources"
    if median is not None:
        said += f"; median |error| {median:.1%}"
    return html.escape(f"{said}; {inside} of {len(predicted)} within ±{BAND:.0%}; {len(summary.skipped)} skipped.")


def _parity(predicted: list[tuple[str, RunPrediction]]) -> str:
    by_source: dict[str, list[tuple[float, float]]] = {}
    for source, p in predicted:
        by_source.setdefault(source, []).append((p.target_tokens_per_s_per_gpu, p.predicted_tokens_per_s_per_gpu or 0))
    values = [v for points in by_source.values() for point in points for v in point]
    low, high = min(values) / (1 + BAND), max(values) * (1 + BAND)
    guides = [Series("predicted = measured", points=((low, low), (high, high))),
              Series("", points=((low, low * (1 + BAND)), (high / (1 + BAND), high)), dashed=True),
              Series("", points=((low / (1 - BAND), low), (high, high * (1 - BAND))), dashed=True)]
    chart = line_chart([Series(source, points=tuple(points), line=False) for source, points in by_source.items()],
                       x_axis=Axis("measured tokens/s per GPU (log scale)", 10),
                       y_axis=Axis("predicted tokens/s per GPU (log scale)", 10), guides=guides, y_from_zero=False,
                       plot_height_px=420, title="Predicted against measured tokens/s per GPU, by source",
                       desc=f"{len(predicted)} runs; points on the solid diagonal are predicted exactly, points "
                       f"between the dashed lines within ±{BAND:.0%}")
    return figure(chart, f"Each point is one published run; above the diagonal the model is optimistic, below it "
                  f"pessimistic; outside the dashed lines it misses by more than {BAND:.0%}.", "fig-parity")


def _summary_chart(summary: Summary) -> str:
    rows = [(q, summary.groups[q]) for q in QUALITIES if summary.groups[q].runs]
    chart = bar_chart([f"{q} ({row.runs} runs)" for q, row in rows],
                      [Series("median |error|", tuple((row.median_abs_error or 0) * 100 for _, row in rows)),
                       Series("worst |error|", tuple((row.worst_abs_error or 0) * 100 for _, row in rows))],
                      stacked=False, value_axis=Axis("|predicted / measured − 1| (%)"),
                      category_axis="quality of the measurement", title="Median and worst error by quality",
                      desc="; ".join(f"{q}: median {row.median_abs_error or 0:.1%}, worst "
                                     f"{row.worst_abs_error or 0:.1%} ({row.worst_id})" for q, row in rows))
    return figure(chart, "The median is what to expect; the worst bar names the run to distrust most (table below).",
                  "fig-summary")


def _summary_table(summary: Summary) -> str:
    rows = [[q, str(stats.runs),
             f"{stats.median_abs_error:.1%}" if stats.median_abs_error is not None else "–",
             f"{stats.worst_abs_error:.1%}" if stats.worst_abs_error is not None else "–",
             stats.worst_id or "–"] for q in (*QUALITIES[:3], "high+medium", "all") for stats in (summary.groups[q],)]
    return table(["runs", "n", "median |error|", "worst |error|", "worst run"], rows, "lrrrl")


def _error_table(pairs: list[tuple[str, RunPrediction]]) -> str:
    rows = [[p.id, f"{p.error:+.1%}" if p.error is not None else "–",
             f"{p.predicted_tokens_per_s_per_gpu:,.0f}" if p.predicted_tokens_per_s_per_gpu else "–",
             f"{p.target_tokens_per_s_per_gpu:,.0f}", source, p.quality, p.layout.short() if p.layout else "–", p.note]
            for source, p in sorted(pairs, key=lambda item: -abs(item[1].error or 0))]
    return table(["run", "error", "predicted tok/s/GPU", "measured tok/s/GPU", "source", "quality", "layout",
                  "note"], rows, "lrrrllll")


def write_validate_report(path: Path, runs: list[PublishedRun], predictions: list[RunPrediction],
                          summary: Summary, title: str = "gpufleet validate") -> None:
    write_report(path, validate_report(runs, predictions, summary, title))

