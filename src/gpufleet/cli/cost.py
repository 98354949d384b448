"""`gpufleet cost`: a job's bill on every cloud offer, and on-prem TCO with break-even against one offer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.catalog.economics_records import Pricing
from gpufleet.cli.common import CatalogOption, JsonOption, gpu_for, open_catalog
from gpufleet.cli.facility import FACILITY_FLAGS, node_network, resolve_node
from gpufleet.cli.output import Output
from gpufleet.errors import InputError

DEFAULT_ONPREM_GPUS = 512


@dataclass(frozen=True)
class PlannedRun:
    """What `cost --plan` takes from a `gpufleet plan --json` file: its best plan's GPU-hours and its cluster."""

    gpu_hours: float
    gpu: str
    gpus: int
    node: str | None


SINGLE_PLAN_HINT = "run `gpufleet plan` with a single --gpus N (no --deadline) and --json to get one"


def read_plan(path: Path) -> PlannedRun:
    """The best plan of a single-count `gpufleet plan --json` file (a sweep over GPU counts is refused)."""
    from gpufleet.input_files import load_json
    from gpufleet.planfile import read_plan_file

    data = load_json(path, "plan file", f"--plan takes a `gpufleet plan --json` output: {SINGLE_PLAN_HINT}")
    saved = read_plan_file(data, str(path))
    if saved.sweep is not None:
        counts = ", ".join(str(row.gpus) for row in saved.sweep)
        raise InputError(f"{path} is a scaling sweep (`gpufleet plan` over several GPU counts or with --deadline: "
                         f"{counts}); --plan prices one plan: {SINGLE_PLAN_HINT}")
    if saved.cluster is None or not saved.plans:
        raise InputError(f"{path} holds no plan to price (the search found none): {SINGLE_PLAN_HINT}")
    cluster, seconds = saved.cluster, saved.plans[0].time_to_train_s
    return PlannedRun(cluster.gpus * seconds / 3600.0, cluster.gpu, cluster.gpus, cluster.node)


def register(app: typer.Typer) -> None:
    @app.command("cost")
    def cost(
        gpu_hours: str = typer.Option(None, "--gpu-hours", help="GPU-hours to price (e.g. 2.5M)."),
        plan_file: Path = typer.Option(
            None, "--plan", help="The `gpufleet plan --json` output of a single GPU count (not a sweep over "
            "several --gpus or a --deadline search): prices its best plan's GPU-hours (GPUs x time-to-train) on its "
            "GPU, node and cluster size."
        ),
        gpu: str | None = typer.Option(
            None, "--gpu", help="GPU id (see `gpufleet catalog list gpus`) [default: --node's GPU, else h100-sxm; "
            "with --plan: the plan's]."
        ),
        node: str | None = typer.Option(
            None, "--node", help="Node id for on-prem [default: the GPU's node; with --plan: the plan's]."
        ),
        gpus: int | None = typer.Option(
            None, "--gpus", help="Size of the owned cluster for on-prem TCO [default: 512; with --plan: the plan's]."
        ),
        offer_name: str = typer.Option(
            None,
            "--offer",
            help="Cloud offer for break-even (default: the cheapest on-demand offer for the GPU).",
        ),
        utilization: float = typer.Option(
            None, "--utilization", help="Fraction of hours the owned cluster does useful work (default 0.7)."
        ),
        years: float = typer.Option(None, "--years", help="Amortization horizon (default 4)."),
        pue: float = typer.Option(None, "--pue", help="Power usage effectiveness, 1 to 3 (default 1.3)."),
        usd_per_kwh: float = typer.Option(None, "--usd-per-kwh", help="Electricity price (default 0.08)."),
        pricing: list[str] = typer.Option(
            None,
            "--pricing",
            help=f"Only these pricing models ({', '.join(get_args(Pricing))}); repeatable.",
        ),
        catalog: list[Path] = CatalogOption,
        json: bool = JsonOption,
    ) -> None:
        """Cost per cloud offer and on-prem: $/GPU-hour, break-even utilization and months.

        Examples: `gpufleet cost --gpu-hours 1e6 --gpu h100-sxm`; `gpufleet cost --plan plan.json` with the
        output of `gpufleet plan --json` for one GPU count.
        """
        from gpufleet.economics.cloud import describe_skipped
        from gpufleet.economics.compare import CostRequest, compare_costs
        from gpufleet.economics.defaults import facility_defaults
        from gpufleet.units import parse_count

        cat = open_catalog(catalog)
        if (gpu_hours is None) == (plan_file is None):
            raise InputError("give exactly one of --gpu-hours H or --plan PLAN.json")
        if plan_file is not None:
            planned = read_plan(plan_file)
            if gpu is not None and gpu != planned.gpu:
                raise InputError(f"--gpu {gpu} contradicts --plan {plan_file}, which plans {planned.gpu} GPUs; "
                                 "leave out --gpu (its GPU-hours are the plan's)")
            if gpus is not None and gpus != planned.gpus:
                raise InputError(f"--gpus {gpus} contradicts --plan {plan_file}, which plans {planned.gpus} GPUs; "
                                 f"leave out --gpus, or plan again with --gpus {gpus}")
            if node is not None and cat.node(node).gpu != planned.gpu:
                raise InputError(f"--node {node} holds {cat.node(node).gpu} GPUs, but --plan {plan_file} plans "
                                 f"{planned.gpu} GPUs; leave out --node (the plan's is {planned.node})")
            hours, gpu, gpus = planned.gpu_hours, planned.gpu, planned.gpus
            node = node or planned.node
            size_known = True
        else:
            hours = parse_count(gpu_hours, "--gpu-hours")  # refuses non-finite counts (units._positive_finite)
            gpu = gpu_for(cat, node, gpu)
            size_known = gpus is not None  # offers are checked against a cluster size the user gave
            gpus = DEFAULT_ONPREM_GPUS if gpus is None else gpus
        if utilization is not None and not 0 < utilization <= 1:
            raise InputError(f"--utilization must be in (0, 1], got {utilization:g}")
        if gpus < 1:
            raise InputError(f"--gpus must be at least 1, got {gpus}")
        for model in pricing or []:
            if model not in get_args(Pricing):
                raise InputError(f"--pricing {model!r} is not one of {', '.join(get_args(Pricing))}")
        spec = resolve_node(cat, node, gpu)
        defaults = facility_defaults(
            cat, flags=FACILITY_FLAGS, pue=pue, usd_per_kwh=usd_per_kwh, amortization_years=years,
            fleet_utilization=utilization,
        )
        compared = compare_costs(cat, CostRequest(gpu, hours, spec, gpus, defaults, node_network(cat, spec),
                                                  tuple(pricing or ()), offer_name, size_known))
        costs, skipped = compared.costs, list(compared.skipped)
        u, rate = compared.utilization, compared.onprem_usd_per_gpu_hour
        onprem = compared.onprem_dict()
        data: dict[str, Any] = {
            "gpu": gpu,
            "gpu_hours": hours,
            "offers": [
                {
                    "name": c.name,
                    "provider": c.provider,
                    "sku": c.sku,
                    "pricing": c.pricing,
                    "usd_per_gpu_hour": c.usd_per_gpu_hour,
                    "usd": c.usd,
                    "as_of": c.as_of,
                }
                for c in costs
            ],
            "skipped_offers": [{"name": o.name, "max_gpus": o.max_gpus, "beyond": o.beyond, "reason": o.reason}
                               for o in skipped],
            "onprem": onprem,
            "onprem_missing": compared.onprem_missing,
        }

        def render(console: Console) -> None:
            table = Table(title=f"{hours:,.0f} {gpu} GPU-hours", title_justify="left")
            for column in ("offer", "pricing", "$/GPU-h", "total $", "as of"):
                table.add_column(column, justify="right" if "$" in column else "left")
            for c in costs:
                table.add_row(c.name, c.pricing, f"{c.usd_per_gpu_hour:.2f}", f"{c.usd:,.0f}", c.as_of)
            if rate is not None:
                table.add_row("on-prem", f"{u:.0%} utilized", f"{rate:.2f}", f"{rate * hours:,.0f}", "estimate")
            console.print(table)
            if skipped:
                console.print(describe_skipped(skipped, gpus))
            console.print(compared.onprem_line())

        Output(json).emit(data, render)
