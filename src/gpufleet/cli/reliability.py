"""`gpufleet reliability`: interruptions, checkpoint write time, optimal interval and goodput for N GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.cli.common import CatalogOption, JsonOption, open_catalog
from gpufleet.cli.output import Output
from gpufleet.reliability.request import (
    CHECKPOINT_GB,
    WRITE_GBPS,
    ReliabilityReport,
    ReliabilityRequest,
    reliability_report,
)

Gpus = Annotated[int, typer.Option("--gpus", help="GPUs in the job.")]
CheckpointGb = Annotated[float | None, typer.Option(
    "--checkpoint-gb", help=f"Checkpoint size, GB ({CHECKPOINT_GB[0]:g} to {CHECKPOINT_GB[1]:g}); or give --params.")]
Params = Annotated[str | None, typer.Option(
    "--params", help="Model parameters (e.g. 70B); sizes the checkpoint (weights + optimizer state) "
    "instead of --checkpoint-gb.")]
WriteGbps = Annotated[float | None, typer.Option(
    "--write-gbps", help=f"Aggregate checkpoint write bandwidth, GB/s ({WRITE_GBPS[0]:g} to "
    f"{WRITE_GBPS[1]:g}) [default: from --gpus-per-node].")]
RestartMin = Annotated[float | None, typer.Option("--restart-min", help="Minutes to detect, reschedule, reload.")]
IntervalMin = Annotated[float | None, typer.Option(
    "--interval-min", help="Checkpoint every N minutes (default: Daly's optimum).")]
TrainTime = Annotated[str | None, typer.Option(
    "--train-time", help="Failure-free training time (e.g. 30d) for totals.")]
GpusPerNode = Annotated[int | None, typer.Option(
    "--gpus-per-node", help="GPUs per node: nodes write in parallel, which sets the write bandwidth "
    "when --write-gbps is not given [default: 8].")]
Failures = Annotated[str | None, typer.Option("--failures", help="failure_stats id (default: llama3-405b).")]


def reliability(
    gpus: Gpus, checkpoint_gb: CheckpointGb = None, params: Params = None, write_gbps: WriteGbps = None,
    restart_min: RestartMin = None, interval_min: IntervalMin = None, days: TrainTime = None,
    gpus_per_node: GpusPerNode = None, failures: Failures = None,
    catalog: list[Path] = CatalogOption, json: bool = JsonOption,
) -> None:
    """Failures of a job of N GPUs, its checkpoint interval (Young/Daly) and goodput.

    Example: `gpufleet reliability --gpus 16384 --params 405e9`
    """
    cat = open_catalog(catalog)
    request = ReliabilityRequest(
        gpus=gpus, checkpoint_gb=checkpoint_gb, params=params, write_gbps=write_gbps, restart_min=restart_min,
        interval_min=interval_min, train_time=days, gpus_per_node=gpus_per_node, failures=failures,
    )
    report = reliability_report(request, cat)
    Output(json).emit(report.data, lambda console: _render(console, request, report))


def _render(console: Console, request: ReliabilityRequest, report: ReliabilityReport) -> None:
    est, size, bandwidth = report.estimate, report.checkpoint_bytes, report.write_bytes_per_s
    table = Table(title=f"reliability of a {request.gpus}-GPU job (rates from {est.failure_source})",
                  title_justify="left", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row("interruptions", f"{est.interruptions_per_day:.3g}/day, one every {est.mtti_s / 3600:.3g} h")
    table.add_row("checkpoint", f"{size / 1e9:,.0f} GB at {bandwidth / 1e9:,.0f} GB/s = {est.checkpoint_write_s:.3g} s")
    table.add_row(
        "interval",
        f"{est.checkpoint_interval_s / 60:.3g} min "
        f"(optimal {report.data['optimal_interval_min']:.3g}, Young {est.young_interval_s / 60:.3g})",
    )
    table.add_row("restart", f"{est.restart_s / 60:.3g} min")
    table.add_row("goodput", f"{est.goodput:.2%}")
    if est.wall_time_s is not None:
        table.add_row(
            "wall time",
            f"{est.wall_time_s / 86400:.3g} days, {est.interruptions_expected:.3g} interruptions, "
            f"{est.lost_gpu_hours:,.0f} GPU-hours lost",
        )
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("reliability")(reliability)
