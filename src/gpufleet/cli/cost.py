"""`gpufleet cost`: a job's bill on every cloud offer, and on-prem TCO with break-even against one offer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.cli.common import CatalogOption, JsonOption, open_catalog
from gpufleet.cli.facility import node_network, resolve_node
from gpufleet.cli.output import Output
from gpufleet.errors import CatalogError, InputError


def plan_gpu_hours(path: Path) -> tuple[float, str, int]:
    """(GPU-hours, GPU id, GPUs) of the best plan in a `gpufleet plan --json` file."""
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        cluster = data["cluster"]
        best = data["plans"][0]
        gpus = int(cluster["gpus"])
        return gpus * float(best["time_to_train_s"]) / 3600.0, str(cluster["gpu"]), gpus
    except OSError as error:
        raise InputError(f"cannot read plan file {path}: {error.strerror}") from error
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise InputError(f"{path} is not a `gpufleet plan --json` output (needs cluster.gpus, cluster.gpu and "
                         f"plans[0].time_to_train_s)") from error


def register(app: typer.Typer) -> None:
    @app.command("cost")
    def cost(
        gpu_hours: str = typer.Option(None, "--gpu-hours", help="GPU-hours to price (e.g. 2.5M)."),
        plan_file: Path = typer.Option(
            None, "--plan", help="A `gpufleet plan --json` output file: prices its best plan's GPU-hours "
            "(GPUs x time-to-train) on its GPU and cluster size."
        ),
        gpu: str = typer.Option("h100-sxm", "--gpu", help="GPU id (see `gpufleet catalog list gpus`)."),
        node: str = typer.Option(None, "--node", help="Node id for on-prem (default: the GPU's node)."),
        gpus: int = typer.Option(512, "--gpus", help="Size of the owned cluster for on-prem TCO."),
        offer_name: str = typer.Option(
            None,
            "--offer",
            help="Cloud offer for break-even (default: the cheapest on-demand offer for the GPU).",
        ),
        utilization: float = typer.Option(
            None, "--utilization", help="Fraction of hours the owned cluster does useful work (default 0.7)."
        ),
        years: float = typer.Option(None, "--years", help="Amortization horizon (default 4)."),
        pue: float = typer.Option(None, "--pue", help="Power usage effectiveness (default 1.3)."),
        usd_per_kwh: float = typer.Option(None, "--usd-per-kwh", help="Electricity price (default 0.08)."),
        pricing: list[str] = typer.Option(
            None,
            "--pricing",
            help="Only these pricing models (on-demand, spot, reserved-1y, ...); repeatable.",
        ),
        catalog: list[Path] = CatalogOption,
        json: bool = JsonOption,
    ) -> None:
        """Cost per cloud offer and on-prem: $/GPU-hour, break-even utilization and months."""
        from gpufleet.economics.cloud import cost_of_gpu_hours, offer, offers_for_gpu, reference_offer
        from gpufleet.economics.defaults import facility_defaults
        from gpufleet.economics.tco import onprem_tco
        from gpufleet.units import parse_count

        cat = open_catalog(catalog)
        if (gpu_hours is None) == (plan_file is None):
            raise InputError("give exactly one of --gpu-hours H or --plan PLAN.json")
        if plan_file is not None:
            hours, gpu, gpus = plan_gpu_hours(plan_file)
        else:
            hours = parse_count(gpu_hours, "--gpu-hours")
        if utilization is not None and not 0 < utilization <= 1:
            raise InputError(f"--utilization must be in (0, 1], got {utilization:g}")
        if gpus < 1:
            raise InputError(f"--gpus must be at least 1, got {gpus}")
        cat.gpu(gpu)
        defaults = facility_defaults(
            cat, pue=pue, usd_per_kwh=usd_per_kwh, amortization_years=years, fleet_utilization=utilization
        )
        offers = offers_for_gpu(cat, gpu, pricing or None)
        if not offers:
            raise CatalogError(
                f"no cloud offer for GPU {gpu!r}" + (f" with pricing {pricing}" if pricing else "")
            )
        costs = sorted((cost_of_gpu_hours(o, hours) for o in offers), key=lambda c: (c.usd, c.name))
        against = offer(cat, offer_name) if offer_name else reference_offer(cat, gpu)
        if against.gpu != gpu:
            raise InputError(f"offer {against.id!r} rents {against.gpu}, not {gpu}")
        spec = resolve_node(cat, node, gpu)
        if spec.gpu != gpu:
            raise InputError(f"node {spec.id!r} holds {spec.gpu}, not {gpu}")
        tco = onprem_tco(cat, spec, gpus, defaults, node_network(cat, spec))
        u = defaults.fleet_utilization
        rate = tco.usd_per_gpu_hour(u)
        onprem: dict[str, Any] = {
            "gpus": gpus,
            "node": spec.id,
            "utilization": u,
            "amortization_years": defaults.amortization_years,
            "usd_per_gpu_hour": rate,
            "usd": rate * hours,
            "capex_usd": tco.capex.total_usd,
            "capex": {
                "servers_usd": tco.capex.servers_usd,
                "switches_usd": tco.capex.switches_usd,
                "optics_usd": tco.capex.optics_usd,
                "storage_usd": tco.capex.storage_usd,
                "facility_usd": tco.capex.facility_usd,
            },
            "annual_usd": tco.annual_usd(u),
            "opex_usd_per_month": tco.opex_usd_per_month(u),
            "against_offer": against.id,
            "against_usd_per_gpu_hour": against.usd_per_gpu_hour,
            "breakeven_utilization": tco.breakeven_utilization(against.usd_per_gpu_hour),
            "breakeven_months": tco.breakeven_months(against.usd_per_gpu_hour, u),
        }
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
            "onprem": onprem,
        }

        def render(console: Console) -> None:
            table = Table(title=f"{hours:,.0f} {gpu} GPU-hours", title_justify="left")
            for column in ("offer", "pricing", "$/GPU-h", "total $", "as of"):
                table.add_column(column, justify="right" if "$" in column else "left")
            for c in costs:
                table.add_row(c.name, c.pricing, f"{c.usd_per_gpu_hour:.2f}", f"{c.usd:,.0f}", c.as_of)
            table.add_row("on-prem", f"{u:.0%} utilized", f"{rate:.2f}", f"{rate * hours:,.0f}", "estimate")
            console.print(table)
            months = onprem["breakeven_months"]
            breakeven = onprem["breakeven_utilization"]
            console.print(
                f"On-prem {gpus} GPUs: capex ${tco.capex.total_usd:,.0f}, ${tco.annual_usd(u):,.0f}/year at "
                f"{u:.0%}. Against {against.id} (${against.usd_per_gpu_hour:g}/GPU-h): break-even at "
                + (f"{breakeven:.0%} utilization" if breakeven is not None else "no utilization <= 100%")
                + (
                    f", capex repaid in {months:.1f} months at {u:.0%}."
                    if months is not None
                    else "; the cloud is cheaper to run."
                )
            )

        Output(json).emit(data, render)
