"""Line and predicted-vs-measured plots: PNG via matplotlib (the `plot` extra) or a dependency-free HTML table."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from gpufleet.errors import InputError
from gpufleet.extras import require_extra
from gpufleet.output_paths import PLOT_SUFFIXES as PLOT_SUFFIXES
from gpufleet.output_paths import check_output_path as check_output_path

Series = dict[str, list[tuple[float, float]]]


def _write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise InputError(f"cannot write plot {path}: {error.strerror or error}") from error


def _pyplot(path: Path) -> Any:
    """matplotlib.pyplot on the file-only Agg backend, or one clear line saying how to get it."""
    alternative = "or write FILE.html, which needs nothing more"
    require_extra("matplotlib", f"--plot {path.name}", alternative).use("Agg")
    return require_extra("matplotlib.pyplot", f"--plot {path.name}", alternative)


def _save(plt: Any, figure: Any, path: Path) -> None:
    try:
        figure.savefig(path, bbox_inches="tight")
    except (OSError, ValueError) as error:
        raise InputError(f"cannot write plot {path}: {getattr(error, 'strerror', None) or error}") from error
    finally:
        plt.close(figure)


def write_series_plot(path: Path, series: Series, *, x_label: str, y_label: str, title: str,
                      log2_x: bool = True) -> None:
    """One line per series, y against x. `.html` writes a table; anything else needs matplotlib."""
    if path.suffix.lower() == ".html":
        rows = [f"<tr><td>{html.escape(label)}</td><td>{x:g}</td><td>{y:.4g}</td></tr>"
                for label, points in series.items() for x, y in sorted(points)]
        _write_text(path, "\n".join([
            f"<html><body><h1>{html.escape(title)}</h1><table border=1>",
            f"<tr><th>series</th><th>{html.escape(x_label)}</th><th>{html.escape(y_label)}</th></tr>",
            *rows, "</table></body></html>"]))
        return
    plt = _pyplot(path)
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for label, points in series.items():
        xs, ys = zip(*sorted(points), strict=True)
        axis.plot(xs, ys, marker="o", label=label)
    if log2_x:
        axis.set_xscale("log", base=2)
    top = max((y for points in series.values() for _, y in points), default=1.0)
    # from zero, so a small drop does not look like a collapse; room above, so markers stay whole
    axis.set_ylim(bottom=0, top=top * 1.08 if top > 0 else 1.0)
    axis.set_xlabel(x_label)
    axis.set_ylabel(y_label)
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    _save(plt, figure, path)


#: Most groups a parity plot names in its legend.
MAX_LEGEND_GROUPS = 12

#: One predicted-vs-measured point: run id, group (colour), predicted and measured value.
ParityPoint = tuple[str, str, float, float]


def write_parity_plot(path: Path, points: list[ParityPoint], *, quantity: str, title: str,
                      band: float = 0.25) -> None:
    """Predicted against measured on log axes, with y = x and a ±`band` corridor; a point outside the corridor
    is a run the model misses by more than `band`. `.html` writes a table; anything else needs matplotlib."""
    if not points:
        raise InputError(f"--plot {path.name}: no run was predicted, nothing to plot")
    if path.suffix.lower() == ".html":
        rows = [f"<tr><td>{html.escape(run)}</td><td>{html.escape(group)}</td><td>{predicted:.4g}</td>"
                f"<td>{measured:.4g}</td><td>{predicted / measured - 1:+.1%}</td></tr>"
                for run, group, predicted, measured in points]
        _write_text(path, "\n".join([
            f"<html><body><h1>{html.escape(title)}</h1><table border=1>",
            f"<tr><th>run</th><th>group</th><th>predicted {html.escape(quantity)}</th>"
            f"<th>measured {html.escape(quantity)}</th><th>error</th></tr>", *rows, "</table></body></html>"]))
        return
    plt = _pyplot(path)
    figure, axis = plt.subplots(figsize=(6, 6))
    low = min(min(p, m) for _, _, p, m in points) / (1 + band) / 1.1
    high = max(max(p, m) for _, _, p, m in points) * (1 + band) * 1.1
    axis.plot([low, high], [low, high], color="black", linewidth=1, label="predicted = measured")
    axis.fill_between([low, high], [low * (1 - band), high * (1 - band)], [low * (1 + band), high * (1 + band)],
                      color="grey", alpha=0.2, label=f"within ±{band:.0%}")
    groups = list(dict.fromkeys(group for _, group, _, _ in points))
    named = len(groups) <= MAX_LEGEND_GROUPS  # past that a legend covers the points and colours repeat
    for group in groups:
        mine = [(m, p) for _, g, p, m in points if g == group]
        axis.scatter([m for m, _ in mine], [p for _, p in mine], s=18,
                     label=f"{group} ({len(mine)})" if named else None)
    if not named:
        title += f" ({len(groups)} groups: --json names them)"
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlim(low, high)
    axis.set_ylim(low, high)
    axis.set_xlabel(f"measured {quantity}")
    axis.set_ylabel(f"predicted {quantity}")
    axis.set_title(title, fontsize="medium", wrap=True)
    axis.legend(fontsize="small")
    _save(plt, figure, path)
