"""Small inline-SVG charts for the HTML reports: bars (grouped or stacked, vertical or horizontal) and lines.

Every chart comes with its own text alternative: an SVG `<title>`/`<desc>` and the data as a table, which
`figure()` wraps in a `<figure>` with a one-line `<figcaption>` and a `<details>` block. No JavaScript, no
fonts to fetch: the page renders offline in any browser.

Colours are the Okabe-Ito palette, chosen to stay distinguishable under the common forms of colour-blindness
(source: Okabe & Ito, "Color Universal Design (CUD): how to make figures and presentations that are friendly
to colorblind people", 2008, https://jfly.uni-koeln.de/color/); lines also differ by marker shape, so a
reader who cannot tell two colours apart can still tell the series apart.
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

#: Okabe-Ito, in the order series take them (blue, orange, bluish green, vermillion, sky blue, reddish
#: purple, yellow, black); yellow late because it is faint on white.
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#F0E442", "#000000")
#: Marker shapes for line series, in step with the colours (judgement: shapes a reader names easily).
MARKERS = ("circle", "square", "triangle", "diamond")

WIDTH_PX = 720
PLOT_HEIGHT_PX = 260
_LEFT_PX, _RIGHT_PX, _BOTTOM_PX, _TOP_PX = 78, 24, 48, 12
_LEGEND_ROW_PX = 18
_FONT = "font-family='system-ui,sans-serif'"

#: Stands for the figure's id in a chart's SVG until `figure()` names it (ids must be unique on a page).
_UID = "@chart@"


def colour(index: int) -> str:
    return OKABE_ITO[index % len(OKABE_ITO)]


@dataclass(frozen=True)
class Axis:
    """One axis: its label (with the unit), and whether it is logarithmic (base 2 or 10)."""

    label: str
    log_base: int | None = None


@dataclass(frozen=True)
class Series:
    """One named series: values per category (bars) or (x, y) points (lines)."""

    name: str
    values: tuple[float, ...] = ()
    points: tuple[tuple[float, float], ...] = ()
    dashed: bool = False
    markers: bool = True
    line: bool = True


@dataclass(frozen=True)
class Marker:
    """A labelled reference line at `value` on the value axis (HBM, a deadline) or the x axis (an optimum)."""

    value: float
    label: str


@dataclass(frozen=True)
class Chart:
    """A rendered chart: the SVG and its data as a table (header row, then rows)."""

    svg: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    title: str = ""


def number(value: float) -> str:
    """A compact tick or table label: 1.5k, 2.3M, 0.25, 1e-05."""
    magnitude = abs(value)
    if magnitude == 0:
        return "0"
    for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)


def _linear_ticks(low: float, high: float) -> tuple[float, float, list[float]]:
    """Nice round (low, high, ticks) covering [low, high]; a zero-width range is widened."""
    if high <= low:
        high = low + (abs(low) or 1.0)
    step = _nice_step(high - low)
    first, last = math.floor(low / step), math.ceil(high / step)
    first -= first * step > low  # low / step can underflow or round across an integer
    last += last * step < high
    return first * step, last * step, [k * step for k in range(first, last + 1)]  # k x step: no summed error


def _log_ticks(low: float, high: float, base: int) -> tuple[float, float, list[float]]:
    low_exp = math.floor(math.log(low, base) + 1e-9)
    high_exp = math.ceil(math.log(high, base) - 1e-9)
    if high_exp <= low_exp:
        high_exp = low_exp + 1
    stride = max(1, math.ceil((high_exp - low_exp) / 8))
    return float(base) ** low_exp, float(base) ** high_exp, [
        float(base) ** e for e in range(low_exp, high_exp + 1, stride)]


class _Scale:
    """Maps data values onto pixels along one axis."""

    def __init__(self, low: float, high: float, start_px: float, end_px: float, log_base: int | None,
                 from_zero: bool = False) -> None:
        if log_base:
            low, high = max(low, 1e-300), max(high, low * 1.0001)
            self.low, self.high, self.ticks = _log_ticks(low, high, log_base)
        else:
            self.low, self.high, self.ticks = _linear_ticks(min(low, 0.0) if from_zero else low, high)
        self.log_base, self.start_px, self.end_px = log_base, start_px, end_px

    def __call__(self, value: float) -> float:
        if self.log_base:
            fraction = math.log(max(value, self.low) / self.low) / math.log(self.high / self.low)
        else:
            fraction = (value - self.low) / (self.high - self.low)
        return self.start_px + fraction * (self.end_px - self.start_px)


#: A box on the chart in pixels: (left, top, right, bottom).
Box = tuple[float, float, float, float]
#: Judgement: the average advance of system-ui at 12 px is about 6.5 px a character; 0.6 em per character and 2 px
#: of margin keep a label's estimated box around the text a browser draws.
_CHAR_EM = 0.6
_LABEL_MARGIN_PX = 2.0
#: What a label candidate pays for each thing it would cover: a data marker or bar (never, while any place is
#: clear), another label, leaving the plot, a line of the chart.
_COVER_MARK, _COVER_LABEL, _COVER_OUTSIDE, _COVER_LINE = 1000.0, 100.0, 100.0, 1.0


def _text_box(x: float, y: float, content: str, anchor: str, size_px: int = 12) -> Box:
    """The estimated box of `_text(x, y, content, anchor)`, with a small margin."""
    width = _CHAR_EM * size_px * len(content)
    left = x - width if anchor == "end" else x - width / 2 if anchor == "middle" else x
    m = _LABEL_MARGIN_PX
    return (left - m, y - 0.8 * size_px - m, left + width + m, y + 0.25 * size_px + m)


def _overlap(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@dataclass
class _Obstacles:
    """What a label must stay clear of, in pixels: data marks (markers, bars), placed labels, lines."""

    plot: Box
    marks: list[Box]
    lines: list[Box]
    labels: list[Box]

    def cost(self, box: Box) -> float:
        inside = self.plot[0] <= box[0] and box[2] <= self.plot[2] and self.plot[1] <= box[1] and box[3] <= self.plot[3]
        return (_COVER_MARK * sum(_overlap(box, m) for m in self.marks) + _COVER_OUTSIDE * (not inside)
                + _COVER_LABEL * sum(_overlap(box, b) for b in self.labels)
                + _COVER_LINE * sum(_overlap(box, b) for b in self.lines))

    def place(self, content: str, candidates: Sequence[tuple[float, float, str]], extra: str = "") -> str:
        """The label at the first candidate (x, y, anchor) that covers nothing, else at the one that covers least
        (a marker last of all); the label is then an obstacle for the next one."""
        best = min(candidates, key=lambda c: self.cost(_text_box(c[0], c[1], content, c[2])))
        self.labels.append(_text_box(best[0], best[1], content, best[2]))
        return _text(best[0], best[1], content, best[2], f"class='label' {extra}".strip())


def _line_boxes(pixels: Sequence[tuple[float, float]], step_px: float = 6.0) -> list[Box]:
    """Small boxes along a polyline, every `step_px`: a label placed clear of them does not cross the line."""
    boxes = []
    for (x0, y0), (x1, y1) in itertools.pairwise(pixels):
        count = max(1, math.ceil(math.hypot(x1 - x0, y1 - y0) / step_px))
        boxes += [(x - 1.5, y - 1.5, x + 1.5, y + 1.5) for k in range(count + 1)
                  for x, y in [(x0 + (x1 - x0) * k / count, y0 + (y1 - y0) * k / count)]]
    return boxes


def _marker_box(x: float, y: float) -> Box:
    return (x - 5.0, y - 5.0, x + 5.0, y + 5.0)


def _along_vertical(pos: float, plot: Box) -> list[tuple[float, float, str]]:
    """Places for the label of a vertical reference line at x = `pos`: beside it, right then left, top down."""
    return [(pos + side * 4, y, "start" if side > 0 else "end")
            for y in _steps(plot[1] + 14, plot[3] - 4, 14) for side in (1, -1)]


def _along_horizontal(pos: float, plot: Box) -> list[tuple[float, float, str]]:
    """Places for the label of a horizontal reference line at y = `pos`: above then below it, right to left."""
    right = plot[2] - 4
    return [(x, y, "end") for x in _steps(right, plot[0] + 40, -40) for y in (pos - 5, pos + 15)]


def _along_line(pixels: Sequence[tuple[float, float]]) -> list[tuple[float, float, str]]:
    """Places for a guide's label: beside the line (below-right, then above-left), from its end back."""
    (x0, y0), (x1, y1) = pixels[0], pixels[-1]
    points = [(x0 + (x1 - x0) * t / 20, y0 + (y1 - y0) * t / 20) for t in range(20, 0, -1)]
    return [c for x, y in points for c in ((x + 6, y + 15, "start"), (x - 6, y - 6, "end"))]


def _steps(start: float, stop: float, step: float) -> list[float]:
    count = max(1, int((stop - start) / step) + 1)
    return [start + k * step for k in range(count)]


def _text(x: float, y: float, content: str, anchor: str = "middle", extra: str = "", size_px: int = 12) -> str:
    return (f"<text x='{x:.1f}' y='{y:.1f}' text-anchor='{anchor}' {_FONT} font-size='{size_px}' {extra}>"
            f"{html.escape(content)}</text>")


def _legend(names: Sequence[str], top_px: float, shapes: bool) -> tuple[str, float]:
    """Swatches in rows across the top; returns the SVG and the height used."""
    parts, x, y = [], float(_LEFT_PX), top_px + 12
    for index, name in enumerate(names):
        width = 28 + 7 * len(name)
        if x + width > WIDTH_PX - _RIGHT_PX and x > _LEFT_PX:
            x, y = float(_LEFT_PX), y + _LEGEND_ROW_PX
        swatch = (_marker(index, x + 6, y - 4) if shapes else
                  f"<rect x='{x:.1f}' y='{y - 10:.1f}' width='12' height='12' fill='{colour(index)}'/>")
        parts.append(swatch + _text(x + 18, y, name, "start"))
        x += width
    return "".join(parts), (y - top_px + 8 if names else 0.0)


def _marker(index: int, x: float, y: float, data: bool = False) -> str:
    """Series `index`'s marker: colour and shape both cycle, so 32 series stay distinct pairs; `data` marks a data
    point (class 'mark'), not a legend swatch."""
    kind = "class='mark' " if data else ""
    paint = f"{kind}fill='{colour(index)}' stroke='#333' stroke-width='0.6'"  # an outline keeps yellow visible
    shape = MARKERS[(index + index // len(OKABE_ITO)) % len(MARKERS)]
    if shape == "circle":
        return f"<circle cx='{x:.1f}' cy='{y:.1f}' r='4' {paint}/>"
    if shape == "square":
        return f"<rect x='{x - 3.5:.1f}' y='{y - 3.5:.1f}' width='7' height='7' {paint}/>"
    corners = ([(0, -5), (4.5, 3.5), (-4.5, 3.5)] if shape == "triangle"
               else [(0, -5), (5, 0), (0, 5), (-5, 0)])
    path = "L".join(f"{x + dx:.1f},{y + dy:.1f}" for dx, dy in corners)
    return f"<path d='M{path}Z' {paint}/>"


def _open_svg(height: float, title: str, desc: str) -> str:
    uid = _UID
    return (f"<svg xmlns='http://www.w3.org/2000/svg' role='img' width='{WIDTH_PX}' height='{height:.0f}' "
            f"viewBox='0 0 {WIDTH_PX} {height:.0f}' aria-labelledby='svgt{uid} svgd{uid}'>"
            f"<title id='svgt{uid}'>{html.escape(title)}</title><desc id='svgd{uid}'>{html.escape(desc)}</desc>")


def _grid(scale: _Scale, vertical_values: bool, plot: tuple[float, float, float, float]) -> str:
    """Tick labels and faint grid lines along the value axis (`vertical_values`: y) or x."""
    left, top, right, bottom = plot
    parts = []
    for tick in scale.ticks:
        pos = scale(tick)
        if vertical_values:
            parts.append(f"<line x1='{left}' x2='{right}' y1='{pos:.1f}' y2='{pos:.1f}' stroke='#ddd'/>"
                         + _text(left - 6, pos + 4, number(tick), "end"))
        else:
            parts.append(f"<line x1='{pos:.1f}' x2='{pos:.1f}' y1='{top}' y2='{bottom}' stroke='#ddd'/>"
                         + _text(pos, bottom + 16, number(tick)))
    return "".join(parts)


def _axis_labels(x_label: str, y_label: str, plot: tuple[float, float, float, float]) -> str:
    left, top, right, bottom = plot
    middle_y = (top + bottom) / 2
    return (f"<line x1='{left}' x2='{right}' y1='{bottom}' y2='{bottom}' stroke='#333'/>"
            f"<line x1='{left}' x2='{left}' y1='{top}' y2='{bottom}' stroke='#333'/>"
            + _text((left + right) / 2, bottom + 38, x_label, extra="font-weight='600'")
            + _text(16, middle_y, y_label, extra=f"font-weight='600' transform='rotate(-90 16 {middle_y:.1f})'"))


def bar_chart(categories: Sequence[str], series: Sequence[Series], *, value_axis: Axis, category_axis: str,
              title: str, desc: str, stacked: bool = True, horizontal: bool = False,
              reference: Marker | None = None) -> Chart:
    """One bar (stacked) or one group of bars per category, one colour per series; `reference` draws a labelled
    line across the value axis (e.g. HBM). Horizontal bars suit long category names."""
    legend, legend_h = _legend([s.name for s in series] if len(series) > 1 else [], 0, shapes=False)
    rows_per_category = 1 if stacked else len(series)
    plot_h = (max(60.0, (16.0 * rows_per_category + 12.0) * len(categories)) if horizontal
              else float(PLOT_HEIGHT_PX))
    left = _LEFT_PX + (max((len(c) for c in categories), default=0) * 6.5 if horizontal else 0)
    plot = (left, _TOP_PX + legend_h, WIDTH_PX - _RIGHT_PX, _TOP_PX + legend_h + plot_h)
    totals = [sum(s.values[i] for s in series) if stacked else max(s.values[i] for s in series)
              for i in range(len(categories))]
    top_value = max(totals + ([reference.value] if reference else []) + [0.0])
    along = (plot[0], plot[2]) if horizontal else (plot[3], plot[1])
    scale = _Scale(0.0, top_value * 1.05 or 1.0, along[0], along[1], value_axis.log_base, from_zero=True)
    span = (plot[3] - plot[1]) if horizontal else (plot[2] - plot[0])
    slot = span / max(len(categories), 1)
    bars: list[str] = []
    boxes: list[Box] = []
    for i, category in enumerate(categories):
        base = 0.0
        for j, s in enumerate(series):
            value = s.values[i]
            start = base if stacked else 0.0
            a, b = scale(start), scale(start + value)
            offset = slot * 0.15 + (0 if stacked else j * slot * 0.7 / len(series))
            thick = slot * 0.7 / (1 if stacked else len(series))
            edge = (plot[1] if horizontal else plot[0]) + i * slot + offset
            x, y, w, h = (a, edge, b - a, thick) if horizontal else (edge, b, thick, a - b)
            tip = f"{category}, {s.name}: {number(value)}" if len(series) > 1 else f"{category}: {number(value)}"
            bars.append(f"<rect class='mark' x='{x:.1f}' y='{y:.1f}' width='{max(w, 0):.1f}' "
                        f"height='{max(h, 0):.1f}' fill='{colour(j)}'><title>{html.escape(tip)}</title></rect>")
            boxes.append((x, y, x + max(w, 0), y + max(h, 0)))
            if horizontal and (len(series) == 1 or not stacked) and value > 0:  # the value at the end: tiny bars read
                bars.append(_text(b + 4, y + thick / 2 + 4, number(value), "start", size_px=11))
            base += value
        label_at = (plot[1] if horizontal else plot[0]) + (i + 0.5) * slot
        bars.append(_text(plot[0] - 6, label_at + 4, category, "end") if horizontal
                    else _text(label_at, plot[3] + 16, category))
    if reference is not None:
        bars.append(_bar_reference(reference, scale(reference.value), horizontal, _Obstacles(plot, boxes, [], [])))
    height = plot[3] + _BOTTOM_PX
    x_label, y_label = (value_axis.label, category_axis) if horizontal else (category_axis, value_axis.label)
    svg = (_open_svg(height, title, desc) + legend + _grid(scale, not horizontal, plot) + "".join(bars)
           + _axis_labels(x_label, "" if horizontal else y_label, plot) + "</svg>")
    header = (category_axis, *(f"{s.name} ({value_axis.label})" if len(series) > 1 else value_axis.label
                               for s in series))
    rows = tuple((c, *(number(s.values[i]) for s in series)) for i, c in enumerate(categories))
    return Chart(svg, header, rows, title)


def _bar_reference(reference: Marker, pos: float, horizontal: bool, obstacles: _Obstacles) -> str:
    """The dashed reference line across the bars (HBM) and its label, clear of the bars."""
    plot = obstacles.plot
    line = (f"<line x1='{pos:.1f}' x2='{pos:.1f}' y1='{plot[1]}' y2='{plot[3]}'" if horizontal
            else f"<line x1='{plot[0]}' x2='{plot[2]}' y1='{pos:.1f}' y2='{pos:.1f}'")
    candidates = _along_vertical(pos, plot) if horizontal else _along_horizontal(pos, plot)
    return line + " stroke='#000' stroke-dasharray='6 3' stroke-width='1.5'/>" + obstacles.place(reference.label,
                                                                                                 candidates)


def line_chart(series: Sequence[Series], *, x_axis: Axis, y_axis: Axis, title: str, desc: str,
               x_markers: Sequence[Marker] = (), y_markers: Sequence[Marker] = (), y_from_zero: bool = True,
               guides: Sequence[Series] = (), plot_height_px: float = PLOT_HEIGHT_PX,
               y_max: float | None = None) -> Chart:
    """One line (and/or marker set) per series over shared x and y axes, with labelled reference lines;
    `guides` are grey lines (y = x, a ±25 % band) labelled beside themselves, outside the legend. Every label is
    placed clear of the data markers (and, where it can be, of the lines and the other labels)."""
    legend, legend_h = _legend([s.name for s in series], 0, shapes=True)
    plot = (float(_LEFT_PX), float(_TOP_PX + legend_h), float(WIDTH_PX - _RIGHT_PX),
            float(_TOP_PX + legend_h + plot_height_px))
    xs = [x for s in (*series, *guides) for x, _ in s.points] + [m.value for m in x_markers]
    ys = [y for s in (*series, *guides) for _, y in s.points] + [m.value for m in y_markers]
    x_scale = _Scale(min(xs, default=0.0), max(xs, default=1.0), plot[0], plot[2], x_axis.log_base)
    y_low = min(ys, default=0.0)
    y_high = max(ys, default=1.0) * (1.02 if y_axis.log_base is None else 1.0)
    y_scale = _Scale(y_low, min(y_high, y_max) if y_max is not None else y_high, plot[3], plot[1],
                     y_axis.log_base, from_zero=y_from_zero)
    guide_px = [[(x_scale(x), y_scale(y)) for x, y in sorted(g.points)] for g in guides]
    series_px = [[(x_scale(x), y_scale(y)) for x, y in sorted(s.points)] for s in series]
    x_lines = [[(x_scale(m.value), plot[1]), (x_scale(m.value), plot[3])] for m in x_markers]
    y_lines = [[(plot[0], y_scale(m.value)), (plot[2], y_scale(m.value))] for m in y_markers]
    lines = [*guide_px, *(px for s, px in zip(series, series_px, strict=True) if s.line), *x_lines, *y_lines]
    obstacles = _Obstacles(plot, [_marker_box(x, y) for s, px in zip(series, series_px, strict=True) if s.markers
                                  for x, y in px], [box for px in lines for box in _line_boxes(px)], [])
    drawn = [_guide_line(guide, px) for guide, px in zip(guides, guide_px, strict=True)]
    drawn += [_series_line(index, s, px) for index, (s, px) in enumerate(zip(series, series_px, strict=True))]
    for marker, line in zip(x_markers, x_lines, strict=True):
        drawn.append(_reference_line(line) + obstacles.place(marker.label, _along_vertical(line[0][0], plot)))
    for marker, line in zip(y_markers, y_lines, strict=True):
        drawn.append(_reference_line(line) + obstacles.place(marker.label, _along_horizontal(line[0][1], plot)))
    drawn += [obstacles.place(guide.name, _along_line(px), "fill='#555'")
              for guide, px in zip(guides, guide_px, strict=True) if guide.name and len(px) > 1]
    height = plot[3] + _BOTTOM_PX
    svg = (_open_svg(height, title, desc) + legend + _grid(y_scale, True, plot) + _grid(x_scale, False, plot)
           + "".join(drawn) + _axis_labels(x_axis.label, y_axis.label, plot) + "</svg>")
    rows = tuple((s.name, number(x), number(y)) for s in series for x, y in sorted(s.points))
    return Chart(svg, ("series", x_axis.label, y_axis.label), rows, title)


def _path(pixels: Sequence[tuple[float, float]]) -> str:
    return "M" + "L".join(f"{x:.1f},{y:.1f}" for x, y in pixels)


def _guide_line(guide: Series, pixels: Sequence[tuple[float, float]]) -> str:
    dash = " stroke-dasharray='5 4'" if guide.dashed else ""
    return f"<path d='{_path(pixels)}' fill='none' stroke='#888' stroke-width='1.2'{dash}/>"


def _series_line(index: int, series: Series, pixels: Sequence[tuple[float, float]]) -> str:
    """A series' line (when it has one and two points) and its data markers."""
    drawn = ""
    if series.line and len(pixels) > 1:
        dash = " stroke-dasharray='5 4'" if series.dashed else ""
        drawn = f"<path d='{_path(pixels)}' fill='none' stroke='{colour(index)}' stroke-width='2'{dash}/>"
    return drawn + ("".join(_marker(index, x, y, data=True) for x, y in pixels) if series.markers else "")


def _reference_line(line: Sequence[tuple[float, float]]) -> str:
    (x1, y1), (x2, y2) = line
    return (f"<line x1='{x1:.1f}' x2='{x2:.1f}' y1='{y1:.1f}' y2='{y2:.1f}' stroke='#555' "
            "stroke-dasharray='3 3'/>")


def figure(chart: Chart, caption: str, figure_id: str) -> str:
    """The chart in a <figure> with a one-line caption and its data in a <details> table."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in chart.header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell, quote=False)}</td>" for cell in row) + "</tr>"
                   for row in chart.rows)
    svg = chart.svg.replace(_UID, html.escape(figure_id))
    return (f"<figure id='{html.escape(figure_id)}'>{svg}<figcaption>{html.escape(caption)}</figcaption>"
            f"<details><summary>Data behind this chart ({len(chart.rows)} rows)</summary>"
            f"<div class='scroll'><table><tr>{head}</tr>{body}</table></div></details></figure>")
