"""`gpufleet catalog list|show`: what gpufleet knows, with sources."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.fits import FitRecord
from gpufleet.catalog.intervals import IntervalRecord
from gpufleet.catalog.judgements import ConstantFit, JudgementRecord
from gpufleet.catalog.records import GPUSpec, ModelSpec, NetworkSpec, NodeSpec, Record
from gpufleet.catalog.registry import KINDS, as_plain
from gpufleet.catalog.stacks import StackRecord
from gpufleet.cli.common import CatalogOption, JsonOption, open_catalog
from gpufleet.cli.output import Output
from gpufleet.workload.params import count_params


def _summary(record: Record) -> str:
    if isinstance(record, GPUSpec):
        bf16 = record.dense_tflops.bf16
        return (f"{record.name}: {record.hbm_gib:g} GiB @ {record.hbm_tbps:g} TB/s, "
                f"bf16 {bf16:g} TFLOP/s, {record.tdp_w:g} W" if bf16 else record.name)
    if isinstance(record, NodeSpec):
        return (f"{record.gpus}x {record.gpu}, {record.nics}x {record.nic_gbps:g} Gb/s, "
                f"{record.max_power_w / 1000:g} kW max, {record.rack_units}U")
    if isinstance(record, NetworkSpec):
        return f"{record.name}: {record.link_gbps:g} Gb/s, radix {record.switch_radix}"
    if isinstance(record, ModelSpec):
        params = count_params(record)
        active = f", {params.active / 1e9:.1f}B active" if params.active != params.total else ""
        return f"{record.name}: {params.total / 1e9:.2f}B params{active}, {record.layers} layers"
    if isinstance(record, CalibrationProfile):
        fp8 = f", fp8 {record.gemm_fraction_fp8:.0%}" if record.gemm_fraction_fp8 is not None else ""
        return (f"GEMM {record.gemm_fraction_16bit:.0%} of 16-bit peak{fp8} (x{record.in_training_fraction:g} "
                f"in training), attention {record.attention_kernel} {record.attention_fraction:.0%}, "
                f"HBM {record.hbm_fraction:.0%}")
    if isinstance(record, FitRecord):
        return (f"fitted {record.field} = {record.value:g} on {len(record.chosen_on)} runs"
                + (f" ({', '.join(record.gpus)})" if record.gpus else ""))
    if isinstance(record, IntervalRecord):
        bands = ", ".join(f"{name} ±{math.sinh(band.quantile_log):.0%}" for name, band in record.regimes.items())
        return f"{record.level:.0%} intervals from {len(record.residuals)} runs ({record.built}): {bands}"
    if isinstance(record, StackRecord):
        return f"{record.name}: {len(record.stated())} documented settings"
    if isinstance(record, ConstantFit):
        return f"fitted {record.value:g} on {len(record.chosen_on)} measurements"
    if isinstance(record, JudgementRecord):
        return f"{record.value:g} ({'judgement' if record.source.startswith('judgement') else 'cited'})"
    return getattr(record, "name", "") or ""


def _details(record: Record) -> dict[str, Any]:
    data = as_plain(record)
    if isinstance(record, ModelSpec):
        params = count_params(record)
        data["params_total"] = params.total
        data["params_active"] = params.active
    return data


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Browse the built-in catalog (GPUs, nodes, networks, models, …) and your overrides.",
                        no_args_is_help=True)
    app.add_typer(group, name="catalog")

    @group.command("list")
    def list_(
        kind: str = typer.Argument(None, help=f"One of: {', '.join(KINDS)}. Omit for all."),
        catalog: list[Path] = CatalogOption,
        json: bool = JsonOption,
    ) -> None:
        """List catalog entries with a one-line summary each.

        Example: `gpufleet catalog list models` (or gpus, nodes, networks, calibrations, cloud_offers, …)
        """
        cat = open_catalog(catalog)
        kinds = [kind] if kind else list(KINDS)  # an unknown kind: Catalog.records names the known ones
        data = {k: {rid: _summary(cat.calibration(rid) if k == "calibrations" else rec)  # with the fits applied
                    for rid, rec in cat.records(k).items()} for k in kinds}

        def render(console: Console) -> None:
            for k in kinds:
                table = Table(title=k, title_justify="left")
                table.add_column("id", style="bold")
                table.add_column("summary")
                for rid, text in data[k].items():
                    table.add_row(rid, text)
                console.print(table)

        Output(json).emit(data, render)

    @group.command("show")
    def show(
        name: str = typer.Argument(..., help="An id from `gpufleet catalog list`."),
        catalog: list[Path] = CatalogOption,
        json: bool = JsonOption,
    ) -> None:
        """Show every field of one entry, with its source.

        Example: `gpufleet catalog show h100-sxm`
        """
        cat = open_catalog(catalog)
        kind, record = cat.find(name)
        data = {"kind": kind, **_details(record)}

        def render(console: Console) -> None:
            table = Table(title=f"{kind[:-1]} {name}", title_justify="left", show_header=False)
            table.add_column("field", style="bold")
            table.add_column("value")
            for key, value in data.items():
                table.add_row(key, str(value))
            console.print(table)

        Output(json).emit(data, render)
