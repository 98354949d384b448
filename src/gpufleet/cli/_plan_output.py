"""What `plan` (and `launch`, while it plans) prints for people: the spinner of a long search, one count's ranked
plans, one plan explained part by part, and a sweep's best plan per GPU count. The JSON documents are
planner/plan_json.py's."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import SpinnerColumn, TextColumn
from rich.table import Table

from gpufleet.catalog.registry import Catalog
from gpufleet.cli.output import Output
from gpufleet.perf.step import StepOptions, fp8_amax_words
from gpufleet.planner.plan import Plan, PlanRequest, PlanResult, default_batch_rule, make_plan, pipeline_warning
from gpufleet.units import format_long_duration as _days

GIB = 2**30
DAY_S = 86400.0


def plan_with_spinner(out: Output, request: PlanRequest, cat: Catalog) -> PlanResult:
    """One plan; a search that runs past a second (large MoE spaces) shows how many layouts it has tried."""
    started = time.monotonic()
    with out.progress(SpinnerColumn(), TextColumn("{task.description}")) as progress:
        task = progress.add_task("searching layouts", visible=False)

        def tried(count: int) -> None:
            if time.monotonic() - started > 1.0:
                progress.update(task, description=f"searching layouts: {count:,} tried", visible=True)

        return make_plan(request, cat, progress=tried)




def framework_note(request: PlanRequest) -> str | None:
    """The header line naming framework settings that differ from Megatron-LM's defaults (StepOptions'), or None."""
    options, default = request.options, StepOptions()
    said = [request.stack_line] if request.stack_line else []
    if not options.fused_elementwise:
        said.append("eager element-wise kernels (no torch.compile)")
    if not options.dp_overlap:
        said.append("data-parallel communication in line (not overlapped)")
    if options.straggler_sigma:
        said.append(f"stragglers sigma {options.straggler_sigma:.2%} over the "
                    f"{'replicas' if options.straggler_scope == 'replicas' else 'job'}")
    if options.overlap_slowdown != default.overlap_slowdown:
        said.append(f"compute {options.overlap_slowdown:.1%} slower under hidden collectives"
                    if options.overlap_slowdown else "hidden collectives cost compute nothing")
    if options.resolved_fp8_amax_sync_sigma != options.judged.fp8_amax_sync_sigma:
        said.append(fp8_amax_words(options))
    if options.dp_overlap_window != default.dp_overlap_window:
        said.append("data-parallel reduction hidden behind one micro-batch only")
    if options.pp_p2p_overlap != default.pp_p2p_overlap:
        said.append("pipeline sends in line (not overlapped)")
    return f"framework: {', '.join(said)} (--json: \"framework\")" if said else None




def _in_unit_of(seconds: float, shown_s: float) -> str:
    """`seconds` in the unit `_days(shown_s)` uses (h, d or y), three significant figures, without the unit."""
    unit = _days(shown_s).rsplit(" ", 1)[-1]
    per = {"h": 3600.0, "d": DAY_S, "y": 365.25 * DAY_S}[unit]
    return f"{seconds / per:.3g}"


def _money(usd: float) -> str:
    """$12,345 under a million, then $1.23M, $4.56B, then powers of ten."""
    if usd < 1e6:
        return f"${usd:,.0f}"
    for scale, unit in ((1e9, "B"), (1e6, "M")):
        if usd >= scale and usd < scale * 1e3:
            return f"${usd / scale:,.2f}{unit}"
    return f"${usd:.2g}"


def _range(plan: Plan, name: str, spelled: Callable[[float], str]) -> str:
    """` (low–high)`: the 80 % interval of one prediction in a table cell, or nothing when there is none."""
    interval = plan.intervals.get(name)
    return f" ({spelled(interval.low)}–{spelled(interval.high)})" if interval is not None else ""


def render_result(console: Console, result: PlanResult) -> None:
    job, cluster = result.job, result.cluster
    console.print(
        f"[bold]{job.model.name}[/bold], {job.tokens / 1e9:,.0f}B tokens, seq {job.seq_len}, "
        f"batch {job.global_batch} ({job.precision}) on {cluster.gpus} x {cluster.gpu.id} "
        f"({cluster.node.id}, {cluster.fabric.network.id} {cluster.fabric.kind} "
        f"{cluster.fabric.oversubscription:g}:1)"
    )
    console.print(f"MFU and HFU are against {cluster.gpu.id}'s dense {job.precision} peak, "
                  f"{cluster.gpu.peak_flops(job.precision) / 1e12:,.1f} TFLOP/s")
    if result.request.global_batch is None:
        console.print(f"batch: {default_batch_rule(job.seq_len, cluster.gpus)} (--global-batch N to choose)")
    note = framework_note(result.request)
    if note:
        console.print(note)
    sites, wan_gbps, wan_latency_s = result.request.sites, result.request.wan_gbps, result.request.wan_latency_s
    if sites > 1 and wan_gbps is not None and wan_latency_s is not None:
        console.print(f"over {sites} sites of {cluster.gpus // sites} GPUs, joined by {wan_gbps:g} Gb/s at "
                      f"{wan_latency_s * 1e3:g} ms one way (comm.wan in --explain; docs/two-sites.md)")
    reasons = ", ".join(f"{n} {r}" for r, n in result.search.infeasible.most_common())
    console.print(f"layouts tried {result.search.tried}: {result.search.fit} fit; "
                  f"rejected: {reasons or 'none'}")
    table = Table(show_lines=False)
    for column in ("#", "layout", "mem/HBM", "step", "tok/s/GPU", "MFU", "goodput", "train time",
                   "cheapest cloud"):
        table.add_column(column, justify="left" if column in ("layout", "cheapest cloud") else "right",
                         no_wrap=column == "layout" and console.width >= 120)
    for plan in result.plans:
        step = plan.candidate.step
        econ = plan.economics
        cheapest = econ.cheapest_offer if econ else None
        table.add_row(
            str(plan.rank), plan.layout.short(),
            f"{plan.candidate.memory.total_bytes / GIB:.1f}/{cluster.gpu.hbm_bytes / GIB:.0f} GiB",
            f"{step.step_s:.2f} s" + _range(plan, "step_s", lambda v: f"{v:.3g}"),
            f"{step.tokens_per_s_per_gpu:,.0f}" + _range(plan, "tokens_per_s_per_gpu", lambda v: f"{v:,.0f}"),
            f"{step.mfu:.1%}",
            f"{econ.goodput:.1%}" if econ else "-",
            _days(plan.wall_time_s) + _range(plan, "time_to_train_s", functools.partial(_in_unit_of,
                                                                                         shown_s=plan.wall_time_s)),
            f"{_money(cheapest.usd)} {cheapest.name}" if cheapest else "-",
        )
    console.print(table)
    shown = result.plans[0].step_interval if result.plans else None
    if shown is not None:
        console.print(f"(low–high): the 80% interval from the model's own leave-one-source-out error on measured "
                      f"runs of the plan's regime ({shown.regime}: {shown.runs} runs"
                      f"{', widened' if shown.widened else ''}; docs/validation.md)")
    skipped = next((p.economics.skipped_offers for p in result.plans if p.economics is not None), ())
    if skipped:
        from gpufleet.economics.cloud import describe_skipped

        console.print(describe_skipped(list(skipped), cluster.gpus))
    spot_note = _spot_note(result.plans[0]) if result.plans else None
    if spot_note:
        console.print(spot_note)
    for plan in result.plans:
        warning = pipeline_warning(plan)
        if warning:
            console.print(f"warning: {warning}")


def _spot_note(plan: Plan) -> str | None:
    """Where an interruptible offer undercuts the cheapest held one: its price, and that it assumes no preemption."""
    econ = plan.economics
    spot = econ.cheapest_interruptible if econ else None
    held = econ.cheapest_offer if econ else None
    if spot is None or held is None or spot is held or spot.usd >= held.usd:
        return None
    return (f"spot: {_money(spot.usd)} {spot.name} for plan #{plan.rank}, if no node is reclaimed: the goodput prices "
            f"hardware failures, not preemption, so the cheapest cloud is the cheapest offer that holds its nodes "
            f"(--json: cost.offers)")


def render_explain(console: Console, plan: Plan, result: PlanResult) -> None:
    step = plan.candidate.step
    console.print(f"[bold]plan #{plan.rank}[/bold]: {plan.layout.short()} — step {step.step_s:.3f} s, "
                  f"{step.micro_batches} micro-batches, MFU {step.mfu:.1%}, HFU {step.hfu:.1%}")
    table = Table(title="step time by part (per GPU on the critical path)", title_justify="left")
    for column in ("part", "exposed", "hidden", "share", "link / bound"):
        table.add_column(column, justify="left" if column in ("part", "link / bound") else "right")
    for name, part in step.parts.items():
        if part.total_s <= 0:
            continue
        table.add_row(name, f"{part.exposed_s * 1e3:,.1f} ms", f"{part.hidden_s * 1e3:,.1f} ms",
                      f"{part.exposed_s / step.step_s:.1%}", part.link)
    console.print(table)
    memory = plan.candidate.memory
    console.print("memory (worst stage " + str(plan.candidate.peak_stage) + "): " + ", ".join(
        f"{kind} {value / GIB:.1f} GiB" for kind, value in memory.as_dict().items())
        + (f"; pinned host memory {memory.host_bytes / GIB:.1f} GiB per GPU" if memory.host_bytes else ""))
    econ = plan.economics
    if econ:
        console.print(f"reliability: {econ.interruptions_per_day:.2f} interruptions/day, checkpoint every "
                      f"{econ.checkpoint_interval_s / 60:.0f} min, goodput {econ.goodput:.1%}; power "
                      f"{econ.it_power_max_w / 1e3:,.0f} kW IT max, {econ.racks} racks")




def sweep_renderer(cat: Catalog, base: PlanRequest, rows: list[dict[str, Any]],
                   data: dict[str, Any]) -> Callable[[Console], None]:
    """Draw a sweep (its rows, and its `--json` document `data`): the header, the best plan per count, and what the
    deadline picks."""
    def render(console: Console) -> None:
        gpu_spec = cat.gpu(base.gpu)
        console.print(f"[bold]{cat.model(base.model).name}[/bold], {base.tokens / 1e9:,.0f}B tokens, seq "
                      f"{base.seq_len} ({base.precision}) on {base.gpu}" + (f" ({base.node})" if base.node else "")
                      + f"; MFU against the dense {base.precision} peak, "
                      f"{gpu_spec.peak_flops(base.precision) / 1e12:,.1f} TFLOP/s")
        note = framework_note(base)
        if note:
            console.print(note)
        console.print(_sweep_table(rows))
        if base.global_batch is None and len({row.get("global_batch") for row in rows if row["fits"]}) > 1:
            console.print("batch: ~4M tokens per step, at least one sequence per GPU (set --global-batch to "
                          "compare GPU counts at one batch)")
        _render_deadline(console, rows, data)
    return render


def _sweep_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="scaling sweep (best plan per GPU count)", title_justify="left")
    for column in ("GPUs", "batch", "layout", "step", "tok/s/GPU", "MFU", "time-to-train"):
        table.add_column(column, justify="left" if column == "layout" else "right")
    for row in rows:
        if not row["fits"]:
            table.add_row(str(row["gpus"]), "", f"[red]{row['verdict']}[/red]", "", "", "", "")
            continue
        table.add_row(str(row["gpus"]), f"{row['global_batch']:,}", row["layout"]["label"], f"{row['step_s']:.2f} s",
                      f"{row['tokens_per_s_per_gpu']:,.0f}", f"{row['mfu']:.1%}", _days(row["time_to_train_s"]))
    return table


def _render_deadline(console: Console, rows: list[dict[str, Any]], data: dict[str, Any]) -> None:
    """The smallest and the cheapest count that meet --deadline (nothing without one)."""
    deadline_s = data.get("deadline_s")
    if deadline_s is None:
        return
    chosen = next((row for row in rows if row["gpus"] == data["smallest_meeting_deadline"]), None)
    if chosen:
        console.print(f"smallest cluster meeting {_days(deadline_s)}: [bold]{chosen['gpus']} GPUs[/bold]"
                      f" ({_days(chosen['time_to_train_s'])})")
    cheap = data.get("cheapest_meeting_deadline")
    if cheap:
        console.print(f"cheapest plan meeting it: [bold]{cheap['gpus']} GPUs[/bold] on {cheap['offer']}, "
                      f"${cheap['usd']:,.0f}")
