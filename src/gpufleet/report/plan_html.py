"""The plan report: one self-contained HTML page drawn from `PlanFigures` (see docs/report.md)."""

from __future__ import annotations

import html
from pathlib import Path

from gpufleet.planner.plan import Plan
from gpufleet.report.html import page, table, write_report
from gpufleet.report.plan_figures import PlanFigures
from gpufleet.report.svg import Axis, Marker, Series, bar_chart, figure, line_chart, number

GIB = 2**30
DAY_S = 86400.0
MEMORY_KINDS = ("weights", "gradients", "optimizer", "activations", "buffers", "overhead")
#: How the step's parts are grouped when plans are compared side by side (each part in the per-part chart).
STEP_GROUPS = (("compute", ("compute",)), ("communication", ("comm",)),
               ("pipeline idle", ("bubble", "stage-imbalance")), ("optimizer and overhead", ("optimizer", "overhead")),
               ("offload and other", ()))  # the last group takes every part the others do not name


def _days(seconds: float) -> str:
    return f"{seconds / DAY_S:,.1f} d" if seconds >= DAY_S else f"{seconds / 3600:,.1f} h"


def _usd(value: float) -> str:
    return f"${number(value)}"


def plan_report(figures: PlanFigures, provenance: str) -> str:
    """The whole page. `provenance` says how the numbers were made (planned now, or re-run from a file)."""
    result = figures.result
    job, cluster = result.job, result.cluster
    title = (f"{job.model.name}: {job.tokens / 1e9:,.0f}B tokens on {cluster.gpus} x {cluster.gpu.id}")
    body = [f"<h1>{html.escape(title)}</h1>", _summary(figures), f"<p class='note'>{html.escape(provenance)}</p>",
            "<h2>Ranked plans</h2>", _plans_table(figures), _rejected(figures),
            "<h2>Memory per GPU</h2>", _stage_memory(figures), _peak_memory(figures),
            "<h2>Where the step time goes</h2>", _step_by_plan(figures), _step_parts(figures),
            "<h2>Scaling</h2>", *_scaling(figures),
            "<h2>Cost over time: cloud against on-prem</h2>", _cost(figures),
            "<h2>Power and racks</h2>", _power(figures),
            "<h2>Failures: goodput against checkpoint interval</h2>", _goodput(figures)]
    return page(f"gpufleet plan: {title}", body)


def _summary(figures: PlanFigures) -> str:
    result = figures.result
    job, cluster, best = result.job, result.cluster, result.plans[0]
    step = best.candidate.step
    econ = best.economics
    cost = ""
    if econ is not None and econ.cheapest_offer is not None:
        cost = f", cheapest cloud {_usd(econ.cheapest_offer.usd)} ({econ.cheapest_offer.name})"
    fabric = cluster.fabric
    return (f"<p class='summary'>Best plan: <b>{html.escape(best.layout.short())}</b> — "
            f"{step.step_s:.2f} s per step, {step.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {step.mfu:.1%}; "
            f"time-to-train {_days(best.wall_time_s)}{html.escape(cost)}.</p>"
            f"<p>Job: seq {job.seq_len}, global batch {job.global_batch} sequences, {html.escape(job.precision)}. "
            f"Cluster: {cluster.gpus} x {html.escape(cluster.gpu.id)} in {html.escape(cluster.node.id)} nodes, "
            f"{html.escape(fabric.network.id)} {html.escape(fabric.kind)} {fabric.oversubscription:g}:1."
            f"{html.escape(_framework(figures), quote=False)}</p>"
            + (f"<p class='warn'>No cost, power or goodput: {html.escape(result.economics_error)}</p>"
               if result.economics_error else ""))


def _framework(figures: PlanFigures) -> str:
    """What the plan assumed of the framework, where it differs from Megatron-LM's defaults."""
    request = figures.result.request
    said = f" Framework: {request.stack_line}." if request.stack_line else ""
    if not request.options.fused_elementwise:
        said += " Element-wise ops priced as eager PyTorch kernels (no torch.compile)."
    return said


def _plans_table(figures: PlanFigures) -> str:
    hbm = figures.result.cluster.gpu.hbm_bytes
    rows = []
    for plan in figures.result.plans:
        step, econ = plan.candidate.step, plan.economics
        cheapest = econ.cheapest_offer if econ else None
        rows.append([str(plan.rank), plan.layout.short(),
                     f"{plan.candidate.memory.total_bytes / GIB:.1f} / {hbm / GIB:.0f} GiB", f"{step.step_s:.3f} s",
                     f"{step.tokens_per_s_per_gpu:,.0f}", f"{step.mfu:.1%}",
                     f"{econ.goodput:.1%}" if econ else "–", _days(plan.wall_time_s),
                     f"{_usd(cheapest.usd)} {cheapest.name}" if cheapest else "–"])
    return table(["#", "layout", "memory / HBM", "step", "tokens/s/GPU", "MFU", "goodput", "time-to-train",
                  "cheapest cloud"], rows, "rlrrrrrrl", fit=True)


def _rejected(figures: PlanFigures) -> str:
    search = figures.result.search
    reasons = search.infeasible.most_common()
    categories = ["fit (ranked)", *(f"rejected: {reason}" for reason, _ in reasons)]
    values = (float(search.fit), *(float(count) for _, count in reasons))
    chart = bar_chart(categories, [Series("layouts", values)], value_axis=Axis("layouts (count)"),
                      category_axis="outcome", horizontal=True, title="Layouts tried, by outcome",
                      desc=f"{search.tried} layouts tried: {search.fit} fit; "
                      + ", ".join(f"{count} rejected for {reason}" for reason, count in reasons))
    return figure(chart, f"Of {search.tried:,} legal layouts, {search.fit:,} fit; the bars below "
                  "the first say why the others were dropped.", "fig-rejected")


def _memory_series(breakdowns: list[dict[str, float]]) -> list[Series]:
    return [Series(kind, tuple(b[kind] / GIB for b in breakdowns)) for kind in MEMORY_KINDS]


def _stage_memory(figures: PlanFigures) -> str:
    result = figures.result
    best, stages = result.plans[0], figures.stages[0]
    hbm = result.cluster.gpu.hbm_bytes
    chart = bar_chart([f"stage {i}" for i in range(len(stages))], _memory_series([s.as_dict() for s in stages]),
                      value_axis=Axis("memory per GPU (GiB)"), category_axis="pipeline stage",
                      reference=Marker(hbm / GIB, f"HBM {hbm / GIB:.0f} GiB"),
                      title=f"Memory per GPU by pipeline stage, plan #1 ({best.layout.short()})",
                      desc="; ".join(f"stage {i}: {s.total_bytes / GIB:.1f} GiB" for i, s in enumerate(stages))
                      + f"; HBM {hbm / GIB:.0f} GiB")
    worst = max(range(len(stages)), key=lambda i: stages[i].total_bytes)
    need = stages[worst].total_bytes
    if need > hbm:  # the planner's fit check looked at other stages: say so rather than draw it quietly
        caption = (f"Plan #1: stage {worst} needs {need / GIB:.1f} GiB, more than the {hbm / GIB:.0f} GiB of HBM, "
                   f"although the plan's fit check found {best.candidate.memory.total_bytes / GIB:.1f} GiB on "
                   f"stage {best.candidate.peak_stage} — treat this plan as not fitting.")
    else:
        caption = (f"Plan #1: stage {worst} is the fullest, {need / GIB:.1f} of {hbm / GIB:.0f} GiB; the gap to "
                   "the dashed line is headroom.")
    return figure(chart, caption, "fig-memory-stages")


def _peak_memory(figures: PlanFigures) -> str:
    result = figures.result
    hbm = result.cluster.gpu.hbm_bytes
    peaks = [max(stages, key=lambda s: s.total_bytes) for stages in figures.stages]
    chart = bar_chart([f"#{p.rank}" for p in result.plans], _memory_series([m.as_dict() for m in peaks]),
                      value_axis=Axis("memory per GPU, fullest stage (GiB)"), category_axis="ranked plan",
                      reference=Marker(hbm / GIB, f"HBM {hbm / GIB:.0f} GiB"),
                      title="Memory of each ranked plan's fullest stage",
                      desc="; ".join(f"#{p.rank} {p.layout.short()}: {m.total_bytes / GIB:.1f} GiB"
                                     for p, m in zip(result.plans, peaks, strict=True)))
    return figure(chart, "What each ranked plan keeps on its fullest GPU: sharding moves optimizer state and "
                  "gradients down, recompute moves activations down.", "fig-memory-plans")


def _group_exposed(plan: Plan, scale: float) -> list[float]:
    """Exposed time of each STEP_GROUPS group, times `scale` (1 for seconds, 1e3 for ms)."""
    totals = [0.0] * len(STEP_GROUPS)
    for name, part in plan.candidate.step.parts.items():
        prefix = name.split(".")[0]
        index = next((i for i, (_, prefixes) in enumerate(STEP_GROUPS) if prefix in prefixes), len(STEP_GROUPS) - 1)
        totals[index] += part.exposed_s * scale
    return totals


def _time_unit(seconds: float) -> tuple[float, str]:
    """Seconds for steps of a second or more, else milliseconds: (multiplier, unit)."""
    return (1.0, "s") if seconds >= 1.0 else (1e3, "ms")


def _step_by_plan(figures: PlanFigures) -> str:
    plans = figures.result.plans
    scale, unit = _time_unit(max(p.candidate.step.step_s for p in plans))
    grouped = [_group_exposed(plan, scale) for plan in plans]
    series = [Series(name, tuple(g[i] for g in grouped)) for i, (name, _) in enumerate(STEP_GROUPS)
              if any(g[i] > 0 for g in grouped)]
    chart = bar_chart([f"#{p.rank} {p.layout.short()}" for p in plans], series, horizontal=True,
                      value_axis=Axis(f"time per step on the critical path ({unit})"), category_axis="ranked plan",
                      title="Exposed step time of each ranked plan, by kind",
                      desc="; ".join(f"#{p.rank}: {p.candidate.step.step_s * scale:,.3g} {unit}" for p in plans))
    return figure(chart, "Each bar is one step; the longer the non-compute segments, the more the layout "
                  "waits on communication or pipeline bubbles.", "fig-step-plans")


def _step_parts(figures: PlanFigures) -> str:
    best = figures.result.plans[0]
    parts = [(name, part) for name, part in best.candidate.step.parts.items() if part.total_s > 0]
    labels = [f"{name} ({part.link})" if part.link else name for name, part in parts]
    scale, unit = _time_unit(best.candidate.step.step_s)
    chart = bar_chart(labels, [Series("exposed (on the critical path)", tuple(p.exposed_s * scale for _, p in parts)),
                               Series("hidden (overlapped with compute)", tuple(p.hidden_s * scale for _, p in parts))],
                      horizontal=True, stacked=False, value_axis=Axis(f"time per step ({unit})"),
                      category_axis="part of the step (link)",
                      title=f"Plan #1 step parts: exposed and hidden time ({best.layout.short()})",
                      desc="; ".join(f"{name}: {p.exposed_s * 1e3:,.1f} ms exposed, {p.hidden_s * 1e3:,.1f} ms hidden"
                                     for name, p in parts))
    return figure(chart, "Plan #1 part by part: hidden time runs under compute and costs nothing until it "
                  "outgrows it; exposed time adds to the step.", "fig-step-parts")


def _scaling(figures: PlanFigures) -> list[str]:
    curves: Curves = {}
    for point in figures.scaling:
        curves.setdefault(point.curve, []).append((point.gpus, point.tokens_per_s_per_gpu, point.time_to_train_s))
    curves = _merge_identical(curves)
    if not curves:
        return ["<p>No nearby GPU count has a legal layout of this shape, so there is no scaling curve.</p>"]
    how = ("best searched plan per GPU count" if figures.scaling_searched
           else "plan #1's layout with its data-parallel degree scaled, not re-searched")
    throughput = line_chart([Series(name, points=tuple((g, t) for g, t, _ in pts)) for name, pts in curves.items()],
                            x_axis=Axis("GPUs (count, log scale)", 2), y_axis=Axis("tokens/s per GPU"),
                            title="Throughput per GPU against GPU count", desc=f"{how}; " + _curve_desc(curves, 1))
    deadline = [Marker(figures.deadline_s / DAY_S, f"deadline {figures.deadline_s / DAY_S:g} d")] \
        if figures.deadline_s else []
    ttt = line_chart([Series(name, points=tuple((g, w / DAY_S) for g, _, w in pts)) for name, pts in curves.items()],
                     x_axis=Axis("GPUs (count, log scale)", 2), y_axis=Axis("time-to-train with failures (days)", 10),
                     y_markers=deadline, y_from_zero=False,
                     title="Time-to-train against GPU count", desc=f"{how}; " + _curve_desc(curves, 2))
    return [figure(throughput, f"Flat lines scale well; a falling line is communication outgrowing compute "
                   f"({how}).", "fig-scaling-throughput"),
            figure(ttt, "Doubling the GPUs should halve the time; where the curve flattens, more GPUs buy little.",
                   "fig-scaling-time")]


Curves = dict[str, list[tuple[float, float, float]]]  # name -> (GPUs, tokens/s per GPU, time-to-train s)


def _merge_identical(curves: Curves) -> Curves:
    """Curves with the same points drawn once, named together ("fat-tree 1:1 = 2:1"): a line hidden under
    another would read as missing."""
    merged: dict[tuple[tuple[float, float, float], ...], list[str]] = {}
    for name, points in curves.items():
        merged.setdefault(tuple(points), []).append(name)
    return {" = ".join(names): list(points) for points, names in merged.items()}


def _curve_desc(curves: Curves, index: int) -> str:
    """Each curve's points in words: tokens/s per GPU (index 1) or days (index 2) at each GPU count."""
    scale = DAY_S if index == 2 else 1.0
    return "; ".join(f"{name}: " + ", ".join(f"{point[0]:g} GPUs {number(point[index] / scale)}" for point in points)
                     for name, points in curves.items())


def _cost(figures: PlanFigures) -> str:
    cost = figures.cost
    if cost is None:
        return "<p>The cluster cannot be priced (see the note at the top), so there is no cost chart.</p>"
    steps = 12  # straight lines: a point every twelfth of the horizon carries the markers that tell them apart
    series = [Series(line.name, points=tuple((cost.horizon_months * i / steps,
                                              line.upfront_usd + line.usd_per_month * cost.horizon_months * i / steps)
                                             for i in range(steps + 1)), dashed=line.upfront_usd > 0)
              for line in cost.lines]
    markers = [Marker(cost.run_months, f"this run ends ({cost.run_months:.1f} mo)")]
    if cost.breakeven_months is not None:
        markers.append(Marker(cost.breakeven_months, f"break-even {cost.breakeven_months:.1f} mo"))
    chart = line_chart(series, x_axis=Axis("calendar months from the start"), y_axis=Axis("cumulative cost (USD)"),
                       x_markers=markers, title="Cumulative cost of the cluster, rented against owned",
                       desc=f"Kept busy {cost.utilization:.0%} of the hours; "
                       + "; ".join(f"{line.name}: {_usd(line.upfront_usd)} up front + {_usd(line.usd_per_month)} "
                                   f"per month" for line in cost.lines)
                       + (f"; owning breaks even with {cost.reference} after {cost.breakeven_months:.1f} months"
                          if cost.breakeven_months is not None else "; owning never breaks even"))
    if cost.breakeven_months is None:
        verdict = "owning never catches up with the cheapest offer"
    elif cost.breakeven_months > cost.hardware_life_months:
        verdict = (f"owning catches up with the cheapest offer only after {cost.breakeven_months:.0f} months, "
                   f"past the hardware's {cost.hardware_life_months:.0f}-month life")
    else:
        verdict = f"owning pays off after {cost.breakeven_months:.1f} months against the cheapest offer"
    return figure(chart, f"With the cluster busy {cost.utilization:.0%} of the hours, {verdict}; this run alone "
                  f"lasts {cost.run_months:.1f} months.", "fig-cost")


def _power(figures: PlanFigures) -> str:
    best = figures.result.plans[0]
    econ = best.economics
    if econ is None:
        return "<p>No power figures: the cluster cannot be built from the catalog (see the note at the top).</p>"
    values = (econ.it_power_typical_w / 1e3, econ.it_power_max_w / 1e3, econ.facility_power_w / 1e3)
    chart = bar_chart(["IT, typical (at this MFU)", "IT, maximum", "facility (IT max x PUE)"],
                      [Series("power", values)], value_axis=Axis("power (kW)"), category_axis="what is counted",
                      horizontal=True, title="Power of the cluster",
                      desc=f"IT typical {values[0]:,.0f} kW, IT maximum {values[1]:,.0f} kW, facility "
                      f"{values[2]:,.0f} kW; {econ.racks} racks, {econ.cooling} cooling; "
                      f"{econ.energy_kwh / 1e3:,.0f} MWh for the run")
    facts = table(["GPUs", "nodes", "racks", "cooling", "IT max per rack", "energy for the run"],
                  [[f"{econ.gpus:,}", f"{econ.nodes:,}", f"{econ.racks:,}", econ.cooling,
                    f"{values[1] / max(econ.racks, 1):,.1f} kW", f"{econ.energy_kwh / 1e3:,.0f} MWh"]], "rrrlrr")
    return figure(chart, f"Provision the facility line: {values[2]:,.0f} kW in {econ.racks} racks "
                  f"({econ.cooling} cooling), {econ.energy_kwh / 1e3:,.0f} MWh over the run.", "fig-power") + facts


def _goodput(figures: PlanFigures) -> str:
    curve = figures.goodput
    if curve is None or not curve.points:
        return "<p>No reliability figures (see the note at the top).</p>"
    best = max(curve.points, key=lambda p: p[1])
    chart = line_chart([Series("goodput", points=tuple((i / 60, g * 100) for i, g in curve.points), markers=False)],
                       x_axis=Axis("checkpoint interval (minutes, log scale)", 10),
                       y_axis=Axis("goodput (% of wall time doing useful work)"), y_from_zero=False, y_max=100.0,
                       x_markers=[Marker(curve.chosen_interval_s / 60,
                                         f"chosen {curve.chosen_interval_s / 60:.0f} min")],
                       title="Goodput against checkpoint interval",
                       desc=f"checkpoint write {curve.write_s:.0f} s, restart {curve.restart_s:.0f} s, mean time "
                       f"to interruption {curve.mtti_s / 3600:.1f} h; best {best[1]:.1%} at {best[0] / 60:.0f} min")
    return figure(chart, f"Checkpoint too often and writes eat the time, too rarely and failures redo work; the "
                  f"peak ({best[1]:.1%}) is at about {best[0] / 60:.0f} min (y axis does not start at zero).",
                  "fig-goodput")



def write_plan_report(path: Path, figures: PlanFigures, provenance: str, flag: str = "--html") -> None:
    """Render and write the report whole (temporary file, then rename); an unwritable path is an InputError."""
    write_report(path, plan_report(figures, provenance), flag)
