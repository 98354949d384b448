"""`gpufleet reliability`: interruptions, checkpoint write time, optimal interval and goodput for N GPUs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.cli.common import CatalogOption, JsonOption, open_catalog
from gpufleet.cli.output import Output
from gpufleet.errors import InputError


def register(app: typer.Typer) -> None:
    @app.command("reliability")
    def reliability(
        gpus: int = typer.Option(..., "--gpus", help="GPUs in the job."),
        checkpoint_gb: float = typer.Option(None, "--checkpoint-gb", help="Checkpoint size, GB."),
        params: str = typer.Option(
            None, "--params", help="Model parameters (e.g. 70B); sizes the checkpoint."
        ),
        write_gbps: float = typer.Option(
            None, "--write-gbps", help="Aggregate checkpoint write bandwidth, GB/s."
        ),
        restart_min: float = typer.Option(
            None, "--restart-min", help="Minutes to detect, reschedule, reload."
        ),
        interval_min: float = typer.Option(
            None, "--interval-min", help="Checkpoint every N minutes (default: Daly's optimum)."
        ),
        days: str = typer.Option(
            None, "--train-time", help="Failure-free training time (e.g. 30d) for totals."
        ),
        gpus_per_node: int = typer.Option(
            8, "--gpus-per-node", help="GPUs per node (sets default write bandwidth)."
        ),
        failures: str = typer.Option(None, "--failures", help="failure_stats id (default: llama3-405b)."),
        catalog: list[Path] = CatalogOption,
        json: bool = JsonOption,
    ) -> None:
        """Failures of a job of N GPUs, its checkpoint interval (Young/Daly) and goodput."""
        from gpufleet.catalog.economics_records import FailureStats
        from gpufleet.economics.defaults import reliability_defaults
        from gpufleet.reliability.checkpoint import checkpoint_bytes, write_bandwidth_bytes_per_s
        from gpufleet.reliability.estimate import estimate_reliability
        from gpufleet.reliability.failures import FailureModel
        from gpufleet.units import parse_count, parse_duration_s

        cat = open_catalog(catalog)
        defaults = reliability_defaults(cat, restart_min=restart_min, failure_stats=failures)
        if gpus < 1 or gpus_per_node < 1:
            raise InputError(f"--gpus and --gpus-per-node must be at least 1, got {gpus} and {gpus_per_node}")
        model = FailureModel.from_stats(cat.get("failure_stats", defaults.failure_stats, FailureStats))
        if checkpoint_gb is not None:
            if not checkpoint_gb > 0:
                raise InputError(f"--checkpoint-gb must be positive, got {checkpoint_gb:g}")
            size = checkpoint_gb * 1e9
        elif params is not None:
            size = checkpoint_bytes(
                parse_count(params, "--params"),
                weight_bytes_per_param=defaults.weight_bytes_per_param,
                optimizer_bytes_per_param=defaults.optimizer_bytes_per_param,
            )
        else:
            raise InputError("give --checkpoint-gb SIZE or --params COUNT (e.g. --params 70B)")
        if write_gbps is not None:
            if not write_gbps > 0:
                raise InputError(f"--write-gbps must be positive, got {write_gbps:g}")
            bandwidth = write_gbps * 1e9
        else:
            bandwidth = write_bandwidth_bytes_per_s(
                math.ceil(gpus / gpus_per_node),
                per_node_bytes_per_s=defaults.write_bytes_per_s_per_node,
                max_bytes_per_s=defaults.write_bytes_per_s_max,
            )
        if interval_min is not None and not interval_min > 0:
            raise InputError(f"--interval-min must be positive, got {interval_min:g}")
        est = estimate_reliability(
            model,
            gpus=gpus,
            checkpoint_bytes=size,
            write_bytes_per_s=bandwidth,
            restart_s=defaults.restart_s,
            train_time_s=parse_duration_s(days, "--train-time") if days else None,
            interval_s=interval_min * 60 if interval_min is not None else None,
        )
        data: dict[str, Any] = {
            "gpus": gpus,
            "failure_source": est.failure_source,
            "interruptions_per_day": est.interruptions_per_day,
            "mtti_hours": est.mtti_s / 3600,
            "checkpoint_gb": size / 1e9,
            "write_gbps": bandwidth / 1e9,
            "checkpoint_write_s": est.checkpoint_write_s,
            "restart_min": est.restart_s / 60,
            "young_interval_min": est.young_interval_s / 60,
            "optimal_interval_min": est.checkpoint_interval_s / 60 if interval_min is None else None,
            "interval_min": est.checkpoint_interval_s / 60,
            "goodput": est.goodput,
            "wall_time_days": est.wall_time_s / 86400 if est.wall_time_s is not None else None,
            "interruptions_expected": est.interruptions_expected,
            "lost_gpu_hours": est.lost_gpu_hours,
        }
        if interval_min is not None:
            from gpufleet.reliability.checkpoint import daly_interval_s

            data["optimal_interval_min"] = daly_interval_s(est.checkpoint_write_s, est.mtti_s) / 60

        def render(console: Console) -> None:
            table = Table(
                title=f"reliability of a {gpus}-GPU job (rates from {est.failure_source})",
                title_justify="left",
                show_header=False,
            )
            table.add_column("", style="bold")
            table.add_column("")
            table.add_row(
                "interruptions", f"{est.interruptions_per_day:.3g}/day, one every {est.mtti_s / 3600:.3g} h"
            )
            table.add_row(
                "checkpoint",
                f"{size / 1e9:,.0f} GB at {bandwidth / 1e9:,.0f} GB/s = {est.checkpoint_write_s:.3g} s",
            )
            table.add_row(
                "interval",
                f"{est.checkpoint_interval_s / 60:.3g} min "
                f"(optimal {data['optimal_interval_min']:.3g}, Young {est.young_interval_s / 60:.3g})",
            )
            table.add_row("restart", f"{est.restart_s / 60:.3g} min")
            table.add_row("goodput", f"{est.goodput:.2%}")
            if est.wall_time_s is not None:
                table.add_row(
                    "wall time",
                    f"{est.wall_time_s / 86400:.3g} days, "
                    f"{est.interruptions_expected:.3g} interruptions, "
                    f"{est.lost_gpu_hours:,.0f} GPU-hours lost",
                )
            console.print(table)

        Output(json).emit(data, render)
