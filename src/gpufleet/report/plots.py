"""Line plots of series, written as PNG (matplotlib, the `plot` extra) or as a dependency-free HTML table."""

from __future__ import annotations

import html
from pathlib import Path

from gpufleet.errors import InputError

Series = dict[str, list[tuple[float, float]]]


def write_series_plot(path: Path, series: Series, *, x_label: str, y_label: str, title: str,
                      log2_x: bool = True) -> None:
    """One line per series, y against x. `.html` writes a table; anything else needs matplotlib."""
    if path.suffix.lower() == ".html":
        rows = [f"<tr><td>{html.escape(label)}</td><td>{x:g}</td><td>{y:.4g}</td></tr>"
                for label, points in series.items() for x, y in sorted(points)]
        path.write_text("\n".join([
            f"<html><body><h1>{html.escape(title)}</h1><table border=1>",
            f"<tr><th>series</th><th>{html.escape(x_label)}</th><th>{html.escape(y_label)}</th></tr>",
            *rows, "</table></body></html>"]), encoding="utf-8")
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise InputError(f"--plot {path.name} needs matplotlib: pip install 'gpufleet[plot]' (or use FILE.html)"
                         ) from error
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for label, points in series.items():
        xs, ys = zip(*sorted(points), strict=True)
        axis.plot(xs, ys, marker="o", label=label)
    if log2_x:
        axis.set_xscale("log", base=2)
    axis.set_ylim(bottom=0)  # start at zero so a small drop does not look like a collapse
    axis.set_xlabel(x_label)
    axis.set_ylabel(y_label)
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    try:
        figure.savefig(path)
    except (OSError, ValueError) as error:
        raise InputError(f"cannot write plot {path}: {error}") from error
    finally:
        plt.close(figure)
