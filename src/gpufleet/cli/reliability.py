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
from gpufleet.errors import InputError, UnknownNameError

#: Accepted ranges: 1 kB to 1 EB for a checkpoint, 1 kB/s to 1 PB/s for its write (100x the fastest file
#: systems): wide enough for any job, narrow enough that a write never takes zero or infinite time.
CHECKPOINT_GB = (1e-6, 1e9)
WRITE_GBPS = (1e-6, 1e6)
DEFAULT_GPUS_PER_NODE = 8
#: The flags that override a ReliabilityDefaults field, so that a bad value names the flag.
RELIABILITY_FLAGS = {"restart_min": "--restart-min", "failure_stats": "--failures"}


def _check_range(flag: str, value: float, bounds: tuple[float, float], unit: str) -> None:
    if not bounds[0] <= value <= bounds[1]:
        raise InputError(f"{flag} must be between {bounds[0]:g} and {bounds[1]:g} {unit}, got {value:g}")


def _check_interval(interval_min: float, write_s: float, restart_s: float, mtti_s: float) -> None:
    """Refuse an --interval-min at which the job would make no progress (when some interval would)."""
    from gpufleet.reliability.checkpoint_interval import daly_interval_s
    from gpufleet.reliability.goodput import progress_interval_range_s

    span = progress_interval_range_s(write_s=write_s, restart_s=restart_s, mtti_s=mtti_s)
    if span is None:  # no interval helps: estimate_reliability says why (failures outpace checkpoints)
        return
    shortest, longest = _inward(span[0] / 60, up=True), _inward(span[1] / 60, up=False)
    if not shortest <= interval_min <= longest:
        raise InputError(
            f"--interval-min {interval_min:g} leaves the job no progress: with an interruption every "
            f"{mtti_s / 60:.3g} min and a {write_s:.3g} s checkpoint, it must be between {shortest:.3g} and "
            f"{longest:.3g} min (optimum {daly_interval_s(write_s, mtti_s) / 60:.3g} min)"
        )


def _inward(value: float, *, up: bool) -> float:
    """`value` to three significant figures, rounded up (a lower bound) or down (an upper bound), so that the
    range printed holds only values that are inside it."""
    unit = 10.0 ** (math.floor(math.log10(value)) - 2)
    return (math.ceil(value / unit) if up else math.floor(value / unit)) * unit


def register(app: typer.Typer) -> None:
    @app.command("reliability")
    def reliability(
        gpus: int = typer.Option(..., "--gpus", help="GPUs in the job."),
        checkpoint_gb: float = typer.Option(
            None, "--checkpoint-gb", help=f"Checkpoint size, GB ({CHECKPOINT_GB[0]:g} to {CHECKPOINT_GB[1]:g}); "
            "or give --params."
        ),
        params: str = typer.Option(
            None, "--params", help="Model parameters (e.g. 70B); sizes the checkpoint (weights + optimizer state) "
            "instead of --checkpoint-gb."
        ),
        write_gbps: float = typer.Option(
            None, "--write-gbps", help=f"Aggregate checkpoint write bandwidth, GB/s ({WRITE_GBPS[0]:g} to "
            f"{WRITE_GBPS[1]:g}) [default: from --gpus-per-node]."
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
        gpus_per_node: int | None = typer.Option(
            None, "--gpus-per-node", help="GPUs per node: nodes write in parallel, which sets the write bandwidth "
            "when --write-gbps is not given [default: 8]."
        ),
        failures: str = typer.Option(None, "--failures", help="failure_stats id (default: llama3-405b)."),
        catalog: list[Path] = CatalogOption,
        json: bool = JsonOption,
    ) -> None:
        """Failures of a job of N GPUs, its checkpoint interval (Young/Daly) and goodput.

        Example: `gpufleet reliability --gpus 16384 --params 405e9`
        """
        from gpufleet.catalog.economics_records import FailureStats
        from gpufleet.economics.defaults import reliability_defaults
        from gpufleet.reliability.checkpoint_interval import checkpoint_bytes, write_bandwidth_bytes_per_s
        from gpufleet.reliability.estimate import estimate_reliability
        from gpufleet.reliability.failures import FailureModel
        from gpufleet.units import parse_count, parse_duration_s

        cat = open_catalog(catalog)
        defaults = reliability_defaults(cat, flags=RELIABILITY_FLAGS, restart_min=restart_min,
                                        failure_stats=failures)
        if gpus < 1:
            raise InputError(f"--gpus must be at least 1, got {gpus}")
        if gpus_per_node is not None and gpus_per_node < 1:
            raise InputError(f"--gpus-per-node must be at least 1, got {gpus_per_node}")
        try:
            stats = cat.get("failure_stats", defaults.failure_stats, FailureStats)
        except UnknownNameError as error:
            if failures is None:  # the catalog's own default is missing: say so as the catalog says it
                raise
            raise InputError(f"--failures: {error}") from error
        model = FailureModel.from_stats(stats)
        if checkpoint_gb is not None and params is not None:
            raise InputError("give --checkpoint-gb or --params, not both: each sets the checkpoint size")
        if checkpoint_gb is not None:
            _check_range("--checkpoint-gb", checkpoint_gb, CHECKPOINT_GB, "GB")
            size = checkpoint_gb * 1e9
        elif params is not None:
            count = parse_count(params, "--params")
            if count < 1:
                raise InputError(f"--params must be at least 1 parameter, got {params}")
            size = checkpoint_bytes(
                count,
                weight_bytes_per_param=defaults.weight_bytes_per_param,
                optimizer_bytes_per_param=defaults.optimizer_bytes_per_param,
            )
            if not size <= CHECKPOINT_GB[1] * 1e9:
                most = CHECKPOINT_GB[1] * 1e9 / (defaults.weight_bytes_per_param + defaults.optimizer_bytes_per_param)
                raise InputError(f"--params {params} needs a checkpoint over {CHECKPOINT_GB[1]:g} GB; give at most "
                                 f"{most:.3g} parameters")
        else:
            raise InputError("give --checkpoint-gb SIZE or --params COUNT (e.g. --params 70B)")
        if write_gbps is not None:
            if gpus_per_node is not None:
                raise InputError("give --write-gbps or --gpus-per-node, not both: --gpus-per-node only sets the "
                                 "write bandwidth when --write-gbps is not given")
            _check_range("--write-gbps", write_gbps, WRITE_GBPS, "GB/s")
            bandwidth = write_gbps * 1e9
        else:
            bandwidth = write_bandwidth_bytes_per_s(
                math.ceil(gpus / (gpus_per_node or DEFAULT_GPUS_PER_NODE)),
                per_node_bytes_per_s=defaults.write_bytes_per_s_per_node,
                max_bytes_per_s=defaults.write_bytes_per_s_max,
            )
        if interval_min is not None:
            if not interval_min > 0:
                raise InputError(f"--interval-min must be positive, got {interval_min:g}")
            _check_interval(interval_min, size / bandwidth, defaults.restart_s, model.mtti_s(gpus))
        train_s = parse_duration_s(days, "--train-time") if days else None  # finite and positive (units)
        est = estimate_reliability(
            model,
            gpus=gpus,
            checkpoint_bytes=size,
            write_bytes_per_s=bandwidth,
            restart_s=defaults.restart_s,
            train_time_s=train_s,
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
            from gpufleet.reliability.checkpoint_interval import daly_interval_s

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
