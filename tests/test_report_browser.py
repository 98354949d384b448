"""The HTML reports in a real headless Chromium (Debian's `chromium`, which .ci/run installs).

The browser is driven through Playwright's sync API, launched on Debian's chromium (`executable_path`): Playwright's
own browser download (`playwright install`) is never used, so the tests run offline. Each page is loaded from disk in
a fresh browser context; the test collects console errors, uncaught exceptions and failed loads, measures every
chart's rendered box, counts the resources the page fetched (an offline report fetches none) and writes a full-page
screenshot.
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from clirun import run_gpufleet

if TYPE_CHECKING:
    from playwright.sync_api import Browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")]
#: Headless and quiet: no network of its own (updates, sync, first-run pages), no GPU, no scroll bars (they would
#: take width from the boxes measured here).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                  "--hide-scrollbars"]

#: The figures a plan report must draw (ids in src/gpufleet/report/plan_html.py).
PLAN_FIGURES = ("fig-rejected", "fig-memory-stages", "fig-memory-plans", "fig-step-plans", "fig-step-parts",
                "fig-scaling-throughput", "fig-scaling-time", "fig-cost", "fig-power", "fig-goodput")
#: The window the plan report's ranked table must fit (the issue's laptop-sized browser), and the narrow one where it
#: may scroll with its rank and layout columns held in place.
WIDE_WINDOW_PX, NARROW_WINDOW_PX = 1400, 700
#: Per chart: every reference or guide label (class 'label') whose rendered box overlaps a data marker or bar
#: (class 'mark'), and the labels drawn.
LABELS_ON_DATA = (
    "[...document.querySelectorAll('figure svg')].map(s => { const box = e => e.getBoundingClientRect();"
    " const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;"
    " const marks = [...s.querySelectorAll('.mark')].map(box); const labels = [...s.querySelectorAll('.label')];"
    " return {id: s.closest('figure').id, labels: labels.map(l => l.textContent), marks: marks.length,"
    " covering: labels.filter(l => marks.some(m => hit(box(l), m))).map(l => l.textContent)}; })")
#: Every element outside a scrolling box that reaches past the window's right edge, and for each table that is
#: meant to fit (class 'fit'): its box's visible and full widths, its right edge, and how its columns sit.
WIDTHS = (
    "({beyond: [...document.body.querySelectorAll('*')].filter(e => !e.closest('.scroll')"
    " && e.getBoundingClientRect().right > innerWidth + 0.5).map(e => e.tagName + '#' + e.id),"
    " fit: [...document.querySelectorAll('table.fit')].map(t => { const box = t.parentElement;"
    " const cells = [...t.querySelectorAll('td')];"
    " return {visible: box.clientWidth, full: box.scrollWidth, right: box.getBoundingClientRect().right,"
    " cellsRight: Math.max(...cells.map(c => c.getBoundingClientRect().right)),"
    " held: [1, 2].map(n => getComputedStyle(t.querySelector(`td:nth-child(${n})`)).position)}; })})")
#: Where screenshots are copied for a person to review (the tests' own copies live under tmp_path).
REVIEW_DIR = os.environ.get("GPUFLEET_SCREENSHOT_DIR")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """A headless Chromium (Debian's, never a downloaded one) driven by Playwright; a throwaway profile."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (the dev extra) is not installed")
    assert CHROMIUM is not None
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


def load(browser: Browser, page_path: Path, screenshot: Path, window_px: int = 1100) -> dict[str, Any]:
    """Open `page_path` in a fresh context `window_px` wide and return what the page did: console errors, charts'
    boxes, fetches, labels on data, widths."""
    context = browser.new_context(viewport={"width": window_px, "height": 900}, device_scale_factor=1)
    try:
        page = context.new_page()
        errors: list[str] = []
        requests: list[str] = []
        # console.error/assert, and what Chromium logs as an error (a failed load, a refused resource)
        page.on("console", lambda message: errors.append(f"console {message.type}: {message.text}")
                if message.type in ("error", "assert") else None)
        page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
        page.on("requestfailed", lambda request: errors.append(f"load failed: {request.url} ({request.failure})"))
        page.on("request", lambda request: requests.append(request.url))
        page.goto(page_path.resolve().as_uri(), wait_until="load")
        labels, widths = page.evaluate(LABELS_ON_DATA), page.evaluate(WIDTHS)
        charts = page.evaluate(
            "[...document.querySelectorAll('figure')].map(f => { const s = f.querySelector('svg');"
            " const r = s ? s.getBoundingClientRect() : {width: 0, height: 0};"
            " return {id: f.id, width: r.width, height: r.height, drawn: s ? s.querySelectorAll("
            "'rect,path,circle').length : 0, caption: (f.querySelector('figcaption') || {}).textContent || '',"
            " title: !!(s && s.querySelector('title')), desc: !!(s && s.querySelector('desc')),"
            " table: !!f.querySelector('details table')}; })")
        fetched = page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
        width, height = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
        page.screenshot(path=screenshot, full_page=True, type="png")
        if REVIEW_DIR:
            shutil.copy(screenshot, Path(REVIEW_DIR) / screenshot.name)
        return {"charts": charts, "errors": errors, "fetched": fetched, "requests": requests,
                "size": (width, height), "window": window_px, "labels": labels, "widths": widths}
    finally:
        context.close()


def check_page(seen: dict[str, Any], page_path: Path, screenshot: Path) -> None:
    """What every report must do in a browser."""
    assert seen["errors"] == []
    assert seen["fetched"] == []  # no image, font, script or style from anywhere: the file is the report
    assert seen["requests"] == [page_path.resolve().as_uri()]
    for chart in seen["charts"]:
        assert chart["width"] > 100 and chart["height"] > 100, chart  # rendered, at a readable size
        assert chart["drawn"] > 0, chart  # bars, lines or markers, not an empty frame
        assert chart["caption"].strip() and chart["title"] and chart["desc"] and chart["table"], chart
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", screenshot.read_bytes()[16:24])  # the PNG's IHDR
    assert (width, height) == tuple(seen["size"])  # the whole page, nothing cut off
    assert width <= seen["window"]  # the page fits the window: wide tables scroll in their box instead of widening it
    assert seen["widths"]["beyond"] == []
    for chart in seen["labels"]:
        assert chart["covering"] == [], chart  # a label never sits on a data marker or a bar


def check_ranked_table(seen: dict[str, Any]) -> None:
    """At WIDE_WINDOW_PX the ranked table is whole on the page: no column hidden behind a scroll bar."""
    [ranked] = seen["widths"]["fit"]
    assert ranked["full"] <= ranked["visible"], ranked  # time-to-train and cost are not cut off
    assert ranked["cellsRight"] <= ranked["right"] + 0.5 <= seen["window"], ranked
    assert ranked["held"] == ["sticky", "sticky"]  # were the window narrower: rank and layout stay in view


def test_plan_report_in_chromium(browser: Browser, tmp_path: Path) -> None:
    report = tmp_path / "plan.html"
    done = run_gpufleet("plan", "-m", "llama3-70b", "-t", "2T", "-n", "256", "--html", str(report))
    assert done.returncode == 0, done.stderr
    screenshot = tmp_path / "plan-report.png"
    seen = load(browser, report, screenshot, WIDE_WINDOW_PX)
    check_page(seen, report, screenshot)
    check_ranked_table(seen)
    assert [chart["id"] for chart in seen["charts"]] == list(PLAN_FIGURES)
    labels = {chart["id"]: chart["labels"] for chart in seen["labels"]}
    assert any(label.startswith("break-even") for label in labels["fig-cost"]), labels
    assert any(label.startswith("HBM") for label in labels["fig-memory-plans"]), labels


def test_ranked_table_scrolls_under_its_layout_column_in_a_narrow_window(browser: Browser, tmp_path: Path) -> None:
    report = tmp_path / "plan.html"
    done = run_gpufleet("plan", "-m", "llama3-70b", "-t", "2T", "-n", "256", "--html", str(report))
    assert done.returncode == 0, done.stderr
    seen = load(browser, report, tmp_path / "plan-narrow.png", NARROW_WINDOW_PX)
    assert seen["size"][0] <= NARROW_WINDOW_PX and seen["widths"]["beyond"] == []
    [ranked] = seen["widths"]["fit"]
    assert ranked["full"] > ranked["visible"] and ranked["held"] == ["sticky", "sticky"], ranked


def test_sweep_report_in_chromium(browser: Browser, tmp_path: Path) -> None:
    report = tmp_path / "sweep.html"
    done = run_gpufleet("plan", "-n", "16-64", "--deadline", "60d", "--html", str(report))
    assert done.returncode == 0, done.stderr
    screenshot = tmp_path / "sweep-report.png"
    seen = load(browser, report, screenshot, WIDE_WINDOW_PX)
    check_page(seen, report, screenshot)
    check_ranked_table(seen)
    assert [chart["id"] for chart in seen["charts"]] == list(PLAN_FIGURES)
    assert "best searched plan per GPU count" in seen["charts"][5]["caption"]


def test_validate_report_in_chromium(browser: Browser, tmp_path: Path) -> None:
    report = tmp_path / "validate.html"
    done = run_gpufleet("validate", "--html", str(report))
    assert done.returncode == 0, done.stderr
    screenshot = tmp_path / "validate-report.png"
    seen = load(browser, report, screenshot)
    check_page(seen, report, screenshot)
    assert [chart["id"] for chart in seen["charts"]] == ["fig-parity", "fig-summary"]
    parity = next(chart for chart in seen["labels"] if chart["id"] == "fig-parity")
    assert parity["labels"] == ["predicted = measured"] and parity["marks"] > 10, parity


def test_labels_clear_crowded_data_in_chromium(browser: Browser, tmp_path: Path) -> None:
    """Where the first place a label would go is full of data (markers along the top of the plot where a
    break-even label starts, points on the parity line's end), the labels move; checked on the rendered boxes."""
    from gpufleet.report.html import page
    from gpufleet.report.svg import Axis, Marker, Series, figure, line_chart

    rising = Series("owned", points=tuple((month / 4, 95 + 1.5 * (month % 3)) for month in range(49)))
    cost = line_chart([rising, Series("rented", points=tuple((m / 4, 10 + m) for m in range(49)))],
                      x_axis=Axis("months"), y_axis=Axis("USD"), x_markers=[Marker(6.0, "break-even 6.0 mo")],
                      y_markers=[Marker(90.0, "budget")], title="crowded cost", desc="markers under every label")
    on_line = tuple((float(v), float(v) * factor) for v in range(100, 1000, 25) for factor in (0.97, 1.0, 1.03))
    parity = line_chart([Series("runs", points=on_line, line=False)], x_axis=Axis("measured", 10),
                        y_axis=Axis("predicted", 10), y_from_zero=False, title="crowded parity", desc="points",
                        guides=[Series("predicted = measured", points=((100.0, 100.0), (1000.0, 1000.0)))])
    report = tmp_path / "crowded.html"
    report.write_text(page("crowded", [figure(cost, "cost", "fig-a"), figure(parity, "parity", "fig-b")]))
    seen = load(browser, report, tmp_path / "crowded.png")
    assert [chart["labels"] for chart in seen["labels"]] == [["break-even 6.0 mo", "budget"],
                                                             ["predicted = measured"]]
    assert [chart["covering"] for chart in seen["labels"]] == [[], []], seen["labels"]
