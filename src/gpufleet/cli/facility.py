"""`gpufleet facility`: IT power, racks, cooling, facility power and the energy bill for N GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.catalog.records import NetworkSpec, NodeSpec
from gpufleet.catalog.registry import Catalog
from gpufleet.cli.common import CatalogOption, JsonOption, open_catalog
from gpufleet.cli.output import Output
from gpufleet.errors import InputError
from gpufleet.fabric.topology import check_node_holds

#: The facility flags that override a FacilityDefaults field, so that a bad value names the flag.
FACILITY_FLAGS = {"rack_kw": "--rack-kw", "pue": "--pue", "usd_per_kwh": "--usd-per-kwh",
                  "amortization_years": "--years", "fleet_utilization": "--utilization"}


def resolve_node(cat: Catalog, node: str | None, gpu: str | None) -> NodeSpec:
    """--node, which must hold --gpu when both are given; else the catalog's default node for --gpu; one of
    them is required."""
    if node:
        spec = cat.node(node)
        if gpu:
            check_node_holds(spec, cat.gpu(gpu).id)
        return spec
    if gpu:
        return cat.node_for_gpu(gpu)
    raise InputError("give --node NODE or --gpu GPU (see `gpufleet catalog list nodes`)")


def node_network(cat: Catalog, node: NodeSpec) -> NetworkSpec | None:
    record = cat.records("networks").get(node.default_network)
    return record if isinstance(record, NetworkSpec) else None


#: The largest --rack-kw taken (judgement: 10x the ~1 MW racks announced for 2027; far above it the rack count
#: is meaningless and the power arithmetic overflows).
MAX_RACK_KW = 10_000


def register(app: typer.Typer) -> None:
    @app.command("facility")
    def facility(
        gpus: int = typer.Option(..., "--gpus", help="Number of GPUs (at least 1)."),
        node: str = typer.Option(None, "--node", help="Node id (see `gpufleet catalog list nodes`); "
                                 "--node or --gpu is required."),
        gpu: str = typer.Option(None, "--gpu", help="GPU id; uses the catalog's default node for it "
                                "(with --node: must be the GPU that node holds)."),
        rack_kw: float = typer.Option(None, "--rack-kw", help="Power a rack may draw, kW (default 40)."),
        pue: float = typer.Option(None, "--pue", help="Power usage effectiveness, 1 to 3 (default 1.3)."),
        usd_per_kwh: float = typer.Option(None, "--usd-per-kwh", help="Electricity price (default 0.08)."),
        mfu: float = typer.Option(None, "--mfu", help="Model FLOPs utilization while training (0-1)."),
        catalog: list[Path] = CatalogOption,
        json: bool = JsonOption,
    ) -> None:
        """IT power at maximum and typical load, racks, cooling, facility power and annual energy.

        Give the hardware as --node NODE or --gpu GPU (its default node); one of them is required.

        Example: `gpufleet facility --gpus 512 --gpu h100-sxm --pue 1.2`
        """
        from gpufleet.economics.defaults import facility_defaults
        from gpufleet.economics.facility import estimate_facility

        if gpus < 1:
            raise InputError(f"--gpus must be at least 1, got {gpus}")
        if rack_kw is not None and rack_kw > MAX_RACK_KW:
            raise InputError(f"--rack-kw {rack_kw:g} is more than {MAX_RACK_KW:,} kW, the most a rack is taken to "
                             "draw (the densest racks announced draw about 1 MW)")
        if mfu is not None and not 0 < mfu <= 1:
            raise InputError(f"--mfu must be in (0, 1], got {mfu:g}")
        cat = open_catalog(catalog)
        spec = resolve_node(cat, node, gpu)
        defaults = facility_defaults(cat, flags=FACILITY_FLAGS, rack_kw=rack_kw, pue=pue, usd_per_kwh=usd_per_kwh)
        est = estimate_facility(spec, gpus, defaults, node_network(cat, spec), mfu=mfu)
        data: dict[str, Any] = {
            "gpus": est.gpus,
            "node": spec.id,
            "nodes": est.nodes,
            "it_power_max_w": est.it_power_max_w,
            "it_power_typical_w": est.it_power_typical_w,
            "nodes_power_max_w": est.nodes_w_max,
            "fabric_power_w": est.fabric_w,
            "storage_power_w": est.storage_w,
            "switches": est.fabric.switches,
            "racks": est.racks,
            "nodes_per_rack": est.nodes_per_rack,
            "rack_power_w": est.rack_w,
            "cooling": est.cooling,
            "pue": est.pue,
            "facility_power_w": est.facility_power_w,
            "annual_energy_kwh": est.annual_energy_kwh,
            "annual_energy_usd": est.annual_energy_usd,
            "usd_per_kwh": defaults.usd_per_kwh,
        }

        def render(console: Console) -> None:
            table = Table(
                title=f"{gpus} GPUs in {est.nodes}x {spec.id}", title_justify="left", show_header=False
            )
            table.add_column("", style="bold")
            table.add_column("")
            table.add_row(
                "IT power, max",
                f"{est.it_power_max_w / 1e3:,.1f} kW "
                f"(nodes {est.nodes_w_max / 1e3:,.1f}, fabric {est.fabric_w / 1e3:,.1f} "
                f"[{est.fabric.switches} switches], storage {est.storage_w / 1e3:,.1f})",
            )
            table.add_row("IT power, typical", f"{est.it_power_typical_w / 1e3:,.1f} kW")
            table.add_row(
                "racks", f"{est.racks} x {est.nodes_per_rack} nodes ({est.rack_w / 1e3:.1f} kW per rack)"
            )
            table.add_row("cooling", est.cooling)
            table.add_row("facility power", f"{est.facility_power_w / 1e3:,.1f} kW at PUE {est.pue:g}")
            table.add_row(
                "energy per year",
                f"{est.annual_energy_kwh / 1e3:,.0f} MWh = "
                f"${est.annual_energy_usd:,.0f} at ${defaults.usd_per_kwh:g}/kWh",
            )
            console.print(table)

        Output(json).emit(data, render)
