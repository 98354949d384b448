"""`gpufleet facility`: IT power, racks, cooling, facility power and the energy bill for N GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.cli.common import CatalogOption, JsonOption, open_catalog
from gpufleet.cli.output import Output

if TYPE_CHECKING:
    from gpufleet.economics.requests import FacilityReport

Gpus = Annotated[int, typer.Option("--gpus", help="Number of GPUs (at least 1).")]
Node = Annotated[str | None, typer.Option(
    "--node", help="Node id (see `gpufleet catalog list nodes`); --node or --gpu is required.")]
Gpu = Annotated[str | None, typer.Option(
    "--gpu", help="GPU id; uses the catalog's default node for it (with --node: must be the GPU that node holds).")]
RackKw = Annotated[float | None, typer.Option("--rack-kw", help="Power a rack may draw, kW (default 40).")]
Pue = Annotated[float | None, typer.Option("--pue", help="Power usage effectiveness, 1 to 3 (default 1.3).")]
UsdPerKwh = Annotated[float | None, typer.Option("--usd-per-kwh", help="Electricity price (default 0.08).")]
Mfu = Annotated[float | None, typer.Option("--mfu", help="Model FLOPs utilization while training (0-1).")]


def facility(
    gpus: Gpus, node: Node = None, gpu: Gpu = None, rack_kw: RackKw = None, pue: Pue = None,
    usd_per_kwh: UsdPerKwh = None, mfu: Mfu = None, catalog: list[Path] = CatalogOption, json: bool = JsonOption,
) -> None:
    """IT power at maximum and typical load, racks, cooling, facility power and annual energy.

    Give the hardware as --node NODE or --gpu GPU (its default node); one of them is required.

    Example: `gpufleet facility --gpus 512 --gpu h100-sxm --pue 1.2`
    """
    from gpufleet.economics.requests import FacilityRequest, facility_report

    request = FacilityRequest(gpus=gpus, node=node, gpu=gpu, rack_kw=rack_kw, pue=pue, usd_per_kwh=usd_per_kwh,
                              mfu=mfu)
    report = facility_report(request, open_catalog(catalog))
    Output(json).emit(report.data, lambda console: _render(console, report))


def _render(console: Console, report: FacilityReport) -> None:
    est = report.estimate
    table = Table(title=f"{est.gpus} GPUs in {est.nodes}x {report.node.id}", title_justify="left", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row(
        "IT power, max",
        f"{est.it_power_max_w / 1e3:,.1f} kW "
        f"(nodes {est.nodes_w_max / 1e3:,.1f}, fabric {est.fabric_w / 1e3:,.1f} "
        f"[{est.fabric.switches} switches], storage {est.storage_w / 1e3:,.1f})",
    )
    table.add_row("IT power, typical", f"{est.it_power_typical_w / 1e3:,.1f} kW")
    table.add_row("racks", f"{est.racks} x {est.nodes_per_rack} nodes ({est.rack_w / 1e3:.1f} kW per rack)")
    table.add_row("cooling", est.cooling)
    table.add_row("facility power", f"{est.facility_power_w / 1e3:,.1f} kW at PUE {est.pue:g}")
    table.add_row(
        "energy per year",
        f"{est.annual_energy_kwh / 1e3:,.0f} MWh = "
        f"${est.annual_energy_usd:,.0f} at ${report.defaults.usd_per_kwh:g}/kWh",
    )
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("facility")(facility)
