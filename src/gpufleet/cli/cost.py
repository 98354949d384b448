"""`gpufleet cost`: a job's bill on every cloud offer, and on-prem TCO with break-even against one offer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, get_args

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.catalog.economics_records import Pricing
from gpufleet.cli.common import CatalogOption, JsonOption, open_catalog
from gpufleet.cli.output import Output

if TYPE_CHECKING:
    from gpufleet.economics.requests import CostReport

GpuHours = Annotated[str | None, typer.Option("--gpu-hours", help="GPU-hours to price (e.g. 2.5M).")]
PlanFile = Annotated[Path | None, typer.Option(
    "--plan", help="The `gpufleet plan --json` output of a single GPU count (not a sweep over "
    "several --gpus or a --deadline search): prices its best plan's GPU-hours (GPUs x time-to-train) on its "
    "GPU, node and cluster size.")]
Gpu = Annotated[str | None, typer.Option(
    "--gpu", help="GPU id (see `gpufleet catalog list gpus`) [default: --node's GPU, else h100-sxm; "
    "with --plan: the plan's].")]
Node = Annotated[str | None, typer.Option(
    "--node", help="Node id for on-prem [default: the GPU's node; with --plan: the plan's].")]
Gpus = Annotated[int | None, typer.Option(
    "--gpus", help="Size of the owned cluster for on-prem TCO [default: 512; with --plan: the plan's].")]
Offer = Annotated[str | None, typer.Option(
    "--offer", help="Cloud offer for break-even (default: the cheapest on-demand offer for the GPU).")]
Utilization = Annotated[float | None, typer.Option(
    "--utilization", help="Fraction of hours the owned cluster does useful work (default 0.7).")]
Years = Annotated[float | None, typer.Option("--years", help="Amortization horizon (default 4).")]
Pue = Annotated[float | None, typer.Option("--pue", help="Power usage effectiveness, 1 to 3 (default 1.3).")]
UsdPerKwh = Annotated[float | None, typer.Option("--usd-per-kwh", help="Electricity price (default 0.08).")]
PricingFlag = Annotated[list[str] | None, typer.Option(
    "--pricing", help=f"Only these pricing models ({', '.join(get_args(Pricing))}); repeatable.")]


def cost(
    gpu_hours: GpuHours = None, plan_file: PlanFile = None, gpu: Gpu = None, node: Node = None, gpus: Gpus = None,
    offer_name: Offer = None, utilization: Utilization = None, years: Years = None, pue: Pue = None,
    usd_per_kwh: UsdPerKwh = None, pricing: PricingFlag = None,
    catalog: list[Path] = CatalogOption, json: bool = JsonOption,
) -> None:
    """Cost per cloud offer and on-prem: $/GPU-hour, break-even utilization and months.

    Examples: `gpufleet cost --gpu-hours 1e6 --gpu h100-sxm`; `gpufleet cost --plan plan.json` with the
    output of `gpufleet plan --json` for one GPU count.
    """
    from gpufleet.economics.requests import CostRequest, cost_report

    cat = open_catalog(catalog)
    request = CostRequest(
        gpu_hours=gpu_hours, plan=plan_file, gpu=gpu, node=node, gpus=gpus, offer=offer_name,
        utilization=utilization, years=years, pue=pue, usd_per_kwh=usd_per_kwh, pricing=tuple(pricing or ()),
    )
    report = cost_report(request, cat)
    Output(json).emit(report.data, lambda console: _render(console, report))


def _render(console: Console, report: CostReport) -> None:
    from gpufleet.economics.cloud import describe_skipped

    compared, hours = report.comparison, report.gpu_hours
    u, rate = compared.utilization, compared.onprem_usd_per_gpu_hour
    table = Table(title=f"{hours:,.0f} {report.gpu} GPU-hours", title_justify="left")
    for column in ("offer", "pricing", "$/GPU-h", "total $", "as of"):
        table.add_column(column, justify="right" if "$" in column else "left")
    for c in compared.costs:
        table.add_row(c.name, c.pricing, f"{c.usd_per_gpu_hour:.2f}", f"{c.usd:,.0f}", c.as_of)
    if rate is not None:
        table.add_row("on-prem", f"{u:.0%} utilized", f"{rate:.2f}", f"{rate * hours:,.0f}", "estimate")
    console.print(table)
    if compared.skipped:
        console.print(describe_skipped(list(compared.skipped), report.gpus))
    console.print(compared.onprem_line())


def register(app: typer.Typer) -> None:
    app.command("cost")(cost)
