"""The report's SVG charts and the numbers behind a plan report, checked against their definitions and against a
second path to the same number (the planner's own estimate, the TCO model's break-even, Daly's optimum)."""

from __future__ import annotations

import itertools
import json
import math
import re
import xml.etree.ElementTree as ElementTree
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.catalog.registry import load_catalog
from gpufleet.economics.cloud import offers_for_gpu
from gpufleet.economics.defaults import facility_defaults
from gpufleet.economics.tco import onprem_tco
from gpufleet.planner.plan import PlanRequest, PlanResult, make_plan
from gpufleet.planner.published_runs import framework_options
from gpufleet.planner.request_file import request_from_dict, request_to_dict
from gpufleet.reliability.goodput import goodput
from gpufleet.report.html import write_report
from gpufleet.report.plan_figures import PlanFigures, plan_figures
from gpufleet.report.plan_html import plan_report
from gpufleet.report.svg import OKABE_ITO, Axis, Series, _linear_ticks, bar_chart, figure, line_chart

SVG = "{http://www.w3.org/2000/svg}"


def _tree(svg: str) -> ElementTree.Element:
    return ElementTree.fromstring(svg)


@given(st.floats(-1e9, 1e9), st.floats(1e-6, 1e9))
def test_linear_ticks_cover_the_data_with_round_evenly_spaced_steps(low: float, span: float) -> None:
    high = low + span
    if span < abs(low) * 1e-6:  # a range too thin for its offset (no chart draws one): float noise, not ticks
        return
    start, stop, ticks = _linear_ticks(low, high)
    assert start <= low and stop >= high
    assert 2 <= len(ticks) <= 12
    step = ticks[1] - ticks[0]
    assert all(math.isclose(b - a, step, rel_tol=1e-6) for a, b in itertools.pairwise(ticks))
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (1, 2, 2.5, 5, 10))


def _bars(svg: str) -> list[ElementTree.Element]:
    return [rect for rect in _tree(svg).iter(f"{SVG}rect") if rect.find(f"{SVG}title") is not None]


def _tick_pixels(svg: str, vertical: bool) -> dict[float, float]:
    """Tick label value -> pixel, read back from the drawn labels (the axis as a reader sees it)."""
    found: dict[float, float] = {}
    scale = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    for text in _tree(svg).iter(f"{SVG}text"):
        label = re.fullmatch(r"(-?[\d.]+)([kMGT]?)", text.text or "")
        if text.get("text-anchor") == ("end" if vertical else "middle") and label:
            value = float(label[1]) * scale[label[2]]
            found[value] = float(text.get("y" if vertical else "x") or 0) - (4 if vertical else 0)
    return found


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.01, 1000), min_size=1, max_size=6))
def test_stacked_bar_segments_are_as_long_as_their_values_on_the_drawn_axis(values: list[float]) -> None:
    chart = bar_chart(["only"], [Series(f"s{i}", (v,)) for i, v in enumerate(values)], value_axis=Axis("GiB"),
                      category_axis="stage", title="t", desc="d")
    bars = _bars(chart.svg)
    assert len(bars) == len(values)
    ticks = sorted(_tick_pixels(chart.svg, vertical=True).items())
    (v0, p0), (v1, p1) = ticks[0], ticks[-1]
    pixels_per_unit = (p0 - p1) / (v1 - v0)
    for bar, value in zip(bars, values, strict=True):
        assert float(bar.get("height") or 0) == pytest.approx(value * pixels_per_unit, abs=0.11)
    top = min(float(bar.get("y") or 0) for bar in bars)
    assert p0 - top == pytest.approx(sum(values) * pixels_per_unit, abs=0.11 * len(values))  # stacked to the sum
    assert {bar.get("fill") for bar in bars} <= set(OKABE_ITO)


def test_a_log2_axis_puts_doublings_at_equal_steps() -> None:
    chart = line_chart([Series("a", points=((16, 1.0), (32, 2.0), (64, 3.0), (128, 4.0)))],
                       x_axis=Axis("GPUs", 2), y_axis=Axis("y"), title="t", desc="d")
    legend_bottom_px = 20  # the legend's swatch sits above the plot
    xs = sorted(float(c.get("cx") or 0) for c in _tree(chart.svg).iter(f"{SVG}circle")
                if float(c.get("cy") or 0) > legend_bottom_px)
    gaps = [b - a for a, b in itertools.pairwise(xs)]
    assert len(xs) == 4 and max(gaps) - min(gaps) < 0.2  # 16, 32, 64, 128 evenly spaced


def test_a_figure_carries_its_text_alternative() -> None:
    chart = bar_chart(["a", "b"], [Series("x", (1.0, 2.0))], value_axis=Axis("kW"), category_axis="c",
                      title="Power <by> part", desc="a 1 kW, b 2 kW")
    html = figure(chart, "Read the longer bar.", "fig-x")
    svg = _tree(chart.svg.replace("@chart@", "fig-x"))
    assert svg.find(f"{SVG}title").text == "Power <by> part"  # type: ignore[union-attr]
    assert svg.get("aria-labelledby") == "svgtfig-x svgdfig-x"
    assert "<figcaption>Read the longer bar.</figcaption>" in html
    assert "<td>b</td><td>2</td>" in html  # the data, in a table a screen reader can walk


@pytest.fixture(scope="module")
def planned() -> tuple[PlanResult, PlanFigures]:
    catalog = load_catalog([])
    result = make_plan(PlanRequest(model="llama3-8b", gpus=64, top=3), catalog)
    return result, plan_figures(result, catalog)


def test_stage_memory_agrees_with_the_search(planned: tuple[PlanResult, PlanFigures]) -> None:
    result, figures = planned
    for plan, stages in zip(result.plans, figures.stages, strict=True):
        assert len(stages) == plan.layout.pp
        # the search keeps the fullest stage: the report's per-stage maximum must be it
        assert max(s.total_bytes for s in stages) == pytest.approx(plan.candidate.memory.total_bytes, rel=1e-12)


def test_scaling_at_the_planned_count_is_the_plan_itself(planned: tuple[PlanResult, PlanFigures]) -> None:
    result, figures = planned
    own = f"{result.request.topology} {result.request.oversubscription:g}:1"
    here = [p for p in figures.scaling if p.curve == own and p.gpus == result.cluster.gpus]
    assert len(here) == 1
    best = result.plans[0]
    assert here[0].tokens_per_s_per_gpu == pytest.approx(best.candidate.step.tokens_per_s_per_gpu, rel=1e-12)
    assert here[0].time_to_train_s == pytest.approx(best.wall_time_s, rel=1e-12)
    ours = sorted((p.gpus, p.time_to_train_s) for p in figures.scaling if p.curve == own)
    assert all(b[1] < a[1] for a, b in itertools.pairwise(ours))  # more GPUs, sooner done


def test_break_even_month_matches_the_tco_model(planned: tuple[PlanResult, PlanFigures]) -> None:
    result, figures = planned
    catalog = load_catalog([])
    assert figures.cost is not None and figures.cost.breakeven_months is not None
    node = result.cluster.node
    network = catalog.records("networks")[node.default_network]
    tco = onprem_tco(catalog, node, result.cluster.gpus, facility_defaults(catalog), network,  # type: ignore[arg-type]
                     mfu=result.plans[0].candidate.step.mfu)
    cheapest = offers_for_gpu(catalog, node.gpu)[0]
    expected = tco.breakeven_months(cheapest.usd_per_gpu_hour, figures.cost.utilization)
    assert figures.cost.breakeven_months == pytest.approx(expected, rel=1e-9)
    assert cheapest.id in figures.cost.reference


def test_goodput_peaks_at_the_chosen_interval(planned: tuple[PlanResult, PlanFigures]) -> None:
    result, figures = planned
    econ = result.plans[0].economics
    assert econ is not None and figures.goodput is not None
    curve = figures.goodput.points
    at_chosen = goodput(interval_s=econ.checkpoint_interval_s, write_s=econ.checkpoint_write_s,
                        restart_s=econ.restart_s, mtti_s=econ.mtti_s)
    assert at_chosen == pytest.approx(econ.goodput, rel=1e-12)
    assert max(g for _, g in curve) <= at_chosen + 1e-4  # Daly's interval is (to first order) the optimum
    assert curve[0][1] < at_chosen and curve[-1][1] < at_chosen


def test_the_report_is_well_formed_and_offline(planned: tuple[PlanResult, PlanFigures]) -> None:
    _, figures = planned
    page = plan_report(figures, "test")
    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    assert len(svgs) == page.count("<figure") == page.count("<figcaption>") == 10
    for svg in svgs:
        _tree(svg)  # each chart is well-formed XML
    ids = re.findall(r"id='([^']+)'", page)
    assert len(ids) == len(set(ids))  # unique ids, so aria-labelledby points at the right title
    assert not re.search(r"(src|href)=|<script|url\(", page)  # nothing to fetch


TORCHTITAN = load_catalog([]).stack("torchtitan")


@pytest.mark.parametrize("request_", [PlanRequest(), replace(
    PlanRequest(model="llama3-70b", gpus=128, oversubscription=2.0, stack="torchtitan"),
    options=framework_options(TORCHTITAN, overlap_tp=True, dtensor_tp=None, overlap_ep=None, ep_dispatch=None,
                              selective_policy=None, eager=True))])
def test_a_request_survives_json(request_: PlanRequest) -> None:
    # the file records the judged values that price it (StepOptions.stated), and prices the same
    back = request_from_dict(json.loads(json.dumps(request_to_dict(request_))))
    assert back == replace(request_, options=request_.options.stated())
    assert back.options.resolved_step_overhead_s == request_.options.resolved_step_overhead_s
    assert back.options.memory.resolved_overhead_fraction == request_.options.memory.resolved_overhead_fraction


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_text("the report from yesterday")
    with pytest.raises(UnicodeEncodeError):
        write_report(target, "half a report \ud800 and the rest")  # a lone surrogate cannot be encoded
    assert target.read_text() == "the report from yesterday"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_the_fit_check_sees_the_fullest_stage_of_an_uneven_pipeline() -> None:
    from gpufleet.parallel.layout import Layout
    from gpufleet.parallel.memory import peak_stage_memory, stage_memory

    catalog = load_catalog([])
    model = catalog.model("llama3-405b")
    memory = framework_options(TORCHTITAN, overlap_tp=None, dtensor_tp=None, overlap_ep=None, ep_dispatch=None,
                               selective_policy=None, eager=False).memory
    layout = Layout(tp=4, pp=32, vpp=4, cp=2, dp=2, micro_batch=1, sharding="zero1", sequence_parallel=True)
    shape = {"seq_len": 4096, "global_batch": 1024, "precision": "bf16", "assumptions": memory}
    every = [stage_memory(model, layout, stage=s, **shape).total_bytes for s in range(layout.pp)]  # type: ignore[arg-type]
    _, peak = peak_stage_memory(model, layout, **shape)  # type: ignore[arg-type]
    assert peak.total_bytes == pytest.approx(max(every), rel=1e-12)


def test_a_plan_without_a_bill_still_draws_what_it_can(planned: tuple[PlanResult, PlanFigures]) -> None:
    from gpufleet.planner.plan import Plan

    result, _ = planned
    bare = [Plan(p.rank, p.candidate, p.train_time_s, None) for p in result.plans]
    unpriced = PlanResult(result.request, result.job, result.cluster, result.search, bare,
                          "no purchase price for node 'x'")
    page = plan_report(plan_figures(unpriced, load_catalog([])), "test")
    assert "No cost, power or goodput: no purchase price for node &#x27;x&#x27;" in page
    assert page.count("<figure") == 7  # cost, power and goodput say why they are missing instead
    assert "cannot be priced" in page and "No power figures" in page and "No reliability figures" in page
