"""`gpufleet plan`: every layout that fits, ranked by time-to-train (or cost), with --explain."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.progress import Progress

from gpufleet.catalog.registry import Catalog
from gpufleet.cli._layout_flags import (
    CpOption,
    EpOption,
    EtpOption,
    MicroBatchOption,
    PpOption,
    RecomputeOption,
    ShardingOption,
    TpOption,
    VppOption,
)
from gpufleet.cli._plan_output import plan_with_spinner, render_explain, render_result, sweep_renderer
from gpufleet.cli._workload_flags import (
    DpOverlapWindowOption,
    DtensorTpOption,
    EagerOption,
    EpDispatchOption,
    FabricModelOption,
    FabricOption,
    Fp8AmaxSyncOption,
    Fp8RecipeOption,
    Fsdp2CopiesOption,
    GlobalBatchOption,
    GpuOption,
    GpusOption,
    ModelOption,
    NodeOption,
    OverlapContentionOption,
    OverlapDpOption,
    OverlapEpOption,
    OverlapPpOption,
    OverlapTpOption,
    OversubscriptionOption,
    PrecisionOption,
    RankByOption,
    SelectivePolicyOption,
    SeqOption,
    StackOption,
    StragglerScopeOption,
    StragglersOption,
    TokensOption,
    TopologyOption,
)
from gpufleet.cli.common import CalibrationOption, CatalogOption, JsonOption, open_catalog, with_calibration
from gpufleet.cli.output import EXIT_USAGE, Output
from gpufleet.planner.model_terms import parse_model_terms
from gpufleet.planner.pins import parse_pins
from gpufleet.planner.plan import PlanRequest, PlanResult
from gpufleet.planner.plan_command import PlanCommand, shown_plans
from gpufleet.planner.plan_json import framework_to_dict, result_to_dict, sweep_row
from gpufleet.planner.plan_options import WorkloadOptions

if TYPE_CHECKING:
    from gpufleet.planner.sweep import Sweep

TopOption = typer.Option(None, "--top", help="How many plans to show [default: 5; a sweep shows the best plan per GPU "
                         "count].")
ExplainOption = typer.Option(None, "--explain", help="Break plan RANK down part by part (--json always carries every "
                             "shown plan's parts).")
DeadlineOption = typer.Option(None, "--deadline", help="e.g. 30d: find the smallest GPU count (of --gpus) that meets "
                              "it.")
BudgetOption = typer.Option(None, "--budget", help="USD: the fastest plan whose cheapest cloud cost fits.")
HtmlOption = typer.Option(None, "--html", help="Also write a self-contained HTML report to FILE (ranked plans, memory "
                          "per stage, step time, scaling, cost over time, power, goodput; docs/report.md); works for "
                          "one count and for a sweep.")
PlotOption = typer.Option(None, "--plot", help="With a GPU-count sweep: write the best plan's tokens/s per GPU "
                          "against GPUs to FILE (.png/.svg/.pdf need matplotlib; .html writes a table).")
SitesOption = typer.Option(None, "--sites", help="Sites the GPUs split over evenly (1-8), joined by --wan-gbps and "
                           "--wan-latency; data or pipeline parallelism crosses them (docs/two-sites.md).")
WanGbpsOption = typer.Option(None, "--wan-gbps", help="With --sites: the link between sites, Gb/s each way (what it "
                             "delivers).")
WanLatencyOption = typer.Option(None, "--wan-latency", help="With --sites: the link's one-way latency, e.g. 5ms.")


def plan(
    model: str = ModelOption, tokens: str = TokensOption, gpu: str = GpuOption, gpus: str = GpusOption,
    node: str = NodeOption, fabric: str = FabricOption, topology: str = TopologyOption,
    oversubscription: str = OversubscriptionOption, seq: int = SeqOption, global_batch: int = GlobalBatchOption,
    precision: str = PrecisionOption, top: int = TopOption, explain: int = ExplainOption, rank_by: str = RankByOption,
    deadline: str = DeadlineOption, budget: float = BudgetOption, html_report: Path = HtmlOption,
    plot: Path = PlotOption, fabric_model: str = FabricModelOption, overlap_tp: bool | None = OverlapTpOption,
    dtensor_tp: bool | None = DtensorTpOption, overlap_ep: bool | None = OverlapEpOption,
    overlap_dp: bool | None = OverlapDpOption, ep_dispatch: str | None = EpDispatchOption,
    selective_policy: str | None = SelectivePolicyOption, eager: bool = EagerOption, stack: str | None = StackOption,
    tp: str | None = TpOption, pp: str | None = PpOption, vpp: str | None = VppOption, cp: str | None = CpOption,
    ep: str | None = EpOption, etp: str | None = EtpOption, micro_batch: str | None = MicroBatchOption,
    sharding: str | None = ShardingOption, recompute: str | None = RecomputeOption,
    stragglers: str | None = StragglersOption, straggler_scope: str | None = StragglerScopeOption,
    overlap_contention: str | None = OverlapContentionOption, fsdp2_copies: bool | None = Fsdp2CopiesOption,
    fp8_amax_sync: str | None = Fp8AmaxSyncOption, dp_overlap_window: str | None = DpOverlapWindowOption,
    fp8_recipe: str | None = Fp8RecipeOption, overlap_pp: bool | None = OverlapPpOption, sites: int = SitesOption,
    wan_gbps: float = WanGbpsOption,
    wan_latency: str = WanLatencyOption,
    catalog: list[Path] = CatalogOption, calibration: Path | None = CalibrationOption, json: bool = JsonOption,
) -> None:
    """Rank every parallel layout that fits in memory by time-to-train.

    Examples:

    * `gpufleet plan` — Llama 3.1 8B, 1T tokens on 64 H100s.
    * `gpufleet plan -m llama3-70b -t 15T -g h100-sxm -n 1024 --explain 1`
    * `gpufleet plan -m llama3-70b -t 2T -n 256-4096 --deadline 30d` — smallest cluster that meets it.
    * `gpufleet plan -m llama3-70b -n 2048 --sites 2 --wan-gbps 200 --wan-latency 5ms --explain 1` — two sites.
    * `gpufleet plan -m llama3-70b -n 256 --stack megatron-bridge --tp 4 --pp 8 --vpp 1-4` — price your own layout
      (pin a field to a value, a list or a range; a pinned field overrides the stack's default).
    * `gpufleet plan -m llama3-70b -n 64 --stack deepspeed` — only what DeepSpeed can run.
    """
    out = Output(json)
    cat = open_catalog(with_calibration(catalog, calibration))
    workload = WorkloadOptions(
        model=model, tokens=tokens, gpu=gpu, node=node, fabric=fabric, topology=topology,
        oversubscription=oversubscription, seq=seq, global_batch=global_batch, precision=precision, rank_by=rank_by,
        fabric_model=fabric_model, overlap_tp=overlap_tp, dtensor_tp=dtensor_tp, overlap_ep=overlap_ep,
        ep_dispatch=ep_dispatch, selective_policy=selective_policy, eager=eager, stack=stack,
        terms=parse_model_terms(stragglers, straggler_scope, overlap_contention, fsdp2_copies, fp8_amax_sync,
                                dp_overlap_window, fp8_recipe, overlap_pp), overlap_dp=overlap_dp,
        pins=parse_pins(tp, pp, vpp, cp, ep, etp, micro_batch, sharding, recompute))
    command = PlanCommand(workload=workload, gpus=gpus, top=top, explain=explain, budget_usd=budget,
                          deadline=deadline, sites=sites, wan_gbps=wan_gbps, wan_latency=wan_latency, plot=plot,
                          html=html_report)
    base = command.base_request(cat)
    if command.is_sweep:
        _emit_sweep(out, cat, base, command)
    else:
        _emit_single(out, plan_with_spinner(out, base, cat), command, cat)


def _emit_single(out: Output, result: PlanResult, command: PlanCommand, cat: Catalog) -> None:
    shown = shown_plans(result, command)
    if shown.failure is not None:
        extra: dict[str, Any] = {"budget_usd": command.budget_usd, "plans": []} if shown.over_budget else {}
        out.check_failed(shown.failure, {**result_to_dict(result), **extra})
    if shown.warning is not None:
        out.warn(shown.warning)
    view = shown.view(result)
    data = result_to_dict(view)
    if command.html is not None:
        from gpufleet.report.plan_figures import plan_figures
        from gpufleet.report.plan_html import write_plan_report

        write_plan_report(command.html, plan_figures(view, cat), "Planned by gpufleet plan.")
        data["html"] = str(command.html)

    def render(console: Console) -> None:
        render_result(console, view)
        if shown.explained is not None:
            render_explain(console, shown.explained, result)

    out.emit(data, render)


def _emit_sweep(out: Output, cat: Catalog, base: PlanRequest, command: PlanCommand) -> None:
    from gpufleet.planner.sweep import judge_sweep, sweep_counts

    started = time.monotonic()
    with out.progress(*Progress.get_default_columns()) as progress:
        task = progress.add_task("planning", total=len(command.counts))

        def advance() -> None:
            progress.advance(task)
            progress.update(task, visible=time.monotonic() - started >= 1.0)

        found = sweep_counts(base, command.counts, cat, command.deadline_s, advance)
    verdict = judge_sweep(found)
    rows = [sweep_row(point) for point in found.points]
    if verdict.warning is not None:
        out.warn(verdict.warning)
    if not found.fitting and verdict.failure is not None:
        if verdict.failure_is_usage:
            out.fail(verdict.failure, EXIT_USAGE)  # counts to change, as for one count
        out.check_failed(verdict.failure, {"framework": framework_to_dict(base), "sweep": rows})
    data = _sweep_data(base, found, rows)
    _write_sweep_files(data, base, found, rows, command, cat)
    render = sweep_renderer(cat, base, rows, data)
    if verdict.failure is not None:
        out.check_failed(verdict.failure, data, render)
    out.emit(data, render)


def _sweep_data(base: PlanRequest, found: Sweep, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The sweep's --json document: the request, the framework, a row per count, and what the deadline picks."""
    from gpufleet.planner.request_file import saved_header

    data: dict[str, Any] = {**saved_header(base), "framework": framework_to_dict(base), "sweep": rows}
    if found.deadline_s is not None:
        smallest, cheapest = found.smallest_meeting_deadline, found.cheapest_meeting_deadline
        data["deadline_s"] = found.deadline_s
        data["smallest_meeting_deadline"] = smallest.gpus if smallest else None
        data["cheapest_meeting_deadline"] = (
            {"gpus": cheapest.gpus, "offer": cheapest.offer.name, "usd": cheapest.offer.usd} if cheapest else None)
    return data


def _write_sweep_files(data: dict[str, Any], base: PlanRequest, found: Sweep, rows: list[dict[str, Any]],
                       command: PlanCommand, cat: Catalog) -> None:
    """--html and --plot of a sweep, each named in `data`."""
    if command.html is not None:
        from gpufleet.report.plan_html import write_plan_report
        from gpufleet.report.saved import sweep_report_figures

        results = {point.gpus: point.result for point in found.points if point.result is not None}
        write_plan_report(command.html, sweep_report_figures(results, cat, found.deadline_s),
                          "Planned by gpufleet plan over a GPU-count sweep; the detail is the count named above.")
        data["html"] = str(command.html)
    if command.plot is not None:
        from gpufleet.report.plots import write_series_plot

        label = f"{base.model} on {base.gpu}"
        write_series_plot(command.plot, {label: [(r["gpus"], r["tokens_per_s_per_gpu"]) for r in rows if r["fits"]]},
                          x_label="GPUs", y_label="tokens/s per GPU (best plan)",
                          title="scaling sweep: per-GPU throughput of the best plan")
        data["plot"] = str(command.plot)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
