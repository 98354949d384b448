"""The HTML reports in a real headless Chromium (Debian's `chromium`, which .ci/run installs).

The browser is driven over the DevTools protocol through a small websocket client written here (stdlib only):
load the page from disk, collect console errors and failed loads, measure every chart's rendered box, count
the resources the page fetched (an offline report fetches none) and write a full-page screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clirun import run_gpufleet

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")]

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


class WebSocket:
    """Just enough of RFC 6455 for the DevTools protocol: one client, text frames, no extensions."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        host_port, path = url.removeprefix("ws://").split("/", 1)
        host, port = host_port.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {host_port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                           ).encode())
        response = b""
        while b"\r\n\r\n" not in response:
            response += self.sock.recv(4096)
        head, self.buffer = response.split(b"\r\n\r\n", 1)
        assert head.split(b" ")[1] == b"101", head

    def _exact(self, count: int) -> bytes:
        while len(self.buffer) < count:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("DevTools closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def send(self, text: str) -> None:
        payload, mask = text.encode(), os.urandom(4)
        size = len(payload)
        header = bytes([0x81]) + (bytes([0x80 | size]) if size < 126 else
                                  bytes([0x80 | 126]) + struct.pack(">H", size) if size < 1 << 16 else
                                  bytes([0x80 | 127]) + struct.pack(">Q", size))
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def receive(self) -> str:
        message = b""
        while True:
            first, second = self._exact(2)
            size = second & 0x7F
            if size == 126:
                size = struct.unpack(">H", self._exact(2))[0]
            elif size == 127:
                size = struct.unpack(">Q", self._exact(8))[0]
            payload = self._exact(size)
            if first & 0x0F in (0x1, 0x0):
                message += payload
                if first & 0x80:
                    return message.decode()

    def close(self) -> None:
        self.sock.close()


class Page:
    """One Chromium tab: send a command and wait for its answer, keeping every event that arrives meanwhile."""

    def __init__(self, socket_url: str) -> None:
        self.ws = WebSocket(socket_url)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.receive())
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return dict(message.get("result", {}))
            self.events.append(message)

    def wait_for(self, event: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(e.get("method") == event for e in self.events):
            assert time.monotonic() < deadline, f"no {event} within {timeout_s} s"
            self.events.append(json.loads(self.ws.receive()))

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"]["value"]


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A headless Chromium with a throwaway profile; yields the DevTools HTTP address."""
    assert CHROMIUM is not None
    profile = tmp_path_factory.mktemp("chromium-profile")
    process = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
         "--window-size=1100,900", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert process.poll() is None, "chromium exited at start"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.1)
        yield f"127.0.0.1:{port_file.read_text().split()[0]}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def load(browser: str, page_path: Path, screenshot: Path, window_px: int = 1100) -> dict[str, Any]:
    """Open `page_path` in a fresh tab `window_px` wide and return what the page did: console errors, charts' boxes,
    fetches, labels on data, widths."""
    request = urllib.request.Request(f"http://{browser}/json/new?about:blank", method="PUT")
    with urllib.request.urlopen(request, timeout=30) as answer:
        target = json.load(answer)
    page = Page(target["webSocketDebuggerUrl"])
    try:
        for domain in ("Page", "Runtime", "Log", "Network"):
            page.call(f"{domain}.enable")
        page.call("Emulation.setDeviceMetricsOverride", width=window_px, height=900, deviceScaleFactor=1,
                  mobile=False)
        page.events.clear()
        page.call("Page.navigate", url=page_path.resolve().as_uri())
        page.wait_for("Page.loadEventFired")
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
        page.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        shot = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        if REVIEW_DIR:
            shutil.copy(screenshot, Path(REVIEW_DIR) / screenshot.name)
        errors = [e for e in page.events if e.get("method") == "Runtime.exceptionThrown"
                  or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
                  or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
                  or e.get("method") == "Network.loadingFailed"]
        requests = [e["params"]["request"]["url"] for e in page.events
                    if e.get("method") == "Network.requestWillBeSent"]
        return {"charts": charts, "errors": errors, "fetched": fetched, "requests": requests,
                "size": (width, height), "window": window_px, "labels": labels, "widths": widths}
    finally:
        page.ws.close()


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


def test_plan_report_in_chromium(browser: str, tmp_path: Path) -> None:
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


def test_ranked_table_scrolls_under_its_layout_column_in_a_narrow_window(browser: str, tmp_path: Path) -> None:
    report = tmp_path / "plan.html"
    done = run_gpufleet("plan", "-m", "llama3-70b", "-t", "2T", "-n", "256", "--html", str(report))
    assert done.returncode == 0, done.stderr
    seen = load(browser, report, tmp_path / "plan-narrow.png", NARROW_WINDOW_PX)
    assert seen["size"][0] <= NARROW_WINDOW_PX and seen["widths"]["beyond"] == []
    [ranked] = seen["widths"]["fit"]
    assert ranked["full"] > ranked["visible"] and ranked["held"] == ["sticky", "sticky"], ranked


def test_sweep_report_in_chromium(browser: str, tmp_path: Path) -> None:
    report = tmp_path / "sweep.html"
    done = run_gpufleet("plan", "-n", "16-64", "--deadline", "60d", "--html", str(report))
    assert done.returncode == 0, done.stderr
    screenshot = tmp_path / "sweep-report.png"
    seen = load(browser, report, screenshot, WIDE_WINDOW_PX)
    check_page(seen, report, screenshot)
    check_ranked_table(seen)
    assert [chart["id"] for chart in seen["charts"]] == list(PLAN_FIGURES)
    assert "best searched plan per GPU count" in seen["charts"][5]["caption"]


def test_validate_report_in_chromium(browser: str, tmp_path: Path) -> None:
    report = tmp_path / "validate.html"
    done = run_gpufleet("validate", "--html", str(report))
    assert done.returncode == 0, done.stderr
    screenshot = tmp_path / "validate-report.png"
    seen = load(browser, report, screenshot)
    check_page(seen, report, screenshot)
    assert [chart["id"] for chart in seen["charts"]] == ["fig-parity", "fig-summary"]
    parity = next(chart for chart in seen["labels"] if chart["id"] == "fig-parity")
    assert parity["labels"] == ["predicted = measured"] and parity["marks"] > 10, parity


def test_labels_clear_crowded_data_in_chromium(browser: str, tmp_path: Path) -> None:
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
