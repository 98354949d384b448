"""`gpufleet fabric build|simulate`: a topology's summary and bill of materials; a simulated collective."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.cli.common import CatalogOption, JsonOption, open_catalog
from gpufleet.cli.output import Output
from gpufleet.fabric.collectives import OPS
from gpufleet.fabric.requests import (
    FabricBuild,
    FabricBuildRequest,
    FabricSimulateRequest,
    build_fabric,
    simulate_fabric,
)
from gpufleet.fabric.requests import block_span as block_span  # the span a simulation prices (tests read it)
from gpufleet.fabric.simulate import ALGORITHMS
from gpufleet.fabric.topology import TOPOLOGY_KINDS
from gpufleet.output_paths import PLOT_SUFFIXES, check_output_path
from gpufleet.report.plots import Series, write_series_plot
from gpufleet.units import format_bytes

Topology = Annotated[str, typer.Option("--topology", help=f"One of {', '.join(TOPOLOGY_KINDS)}.")]
Gpu = Annotated[str | None, typer.Option(
    "--gpu", help="GPU id; its default node is used [default: --node's GPU, else h100-sxm].")]
Node = Annotated[str | None, typer.Option(
    "--node", help="Node id instead of --gpu's default node (it must hold --gpu when both are given).")]
Collective = Annotated[str, typer.Option("--collective", help=f"One of {', '.join(OPS)}.")]
Size = Annotated[str, typer.Option(
    "--size", help="Buffer per rank, 1 byte to 1 TiB: a bare number is bytes; "
    "units KiB/MiB/GiB/TiB (or K/M/G/T) and KB/MB/GB/TB, e.g. 1GiB, or a list 1MiB,1GiB.")]
SweepGpus = typer.Option(..., "--gpus", help="GPUs in the group (= cluster): a count, a list 128,256, or a "
                         "range 64-1024 (doublings, the top included) or 64-512:64 (steps of 64).")
Networks = Annotated[str, typer.Option("--network", help="Network id, or a list ndr400,roce200.")]
PlacementFlag = Annotated[str, typer.Option("--placement", help="block or scatter.")]
AlgorithmFlag = Annotated[str, typer.Option("--algorithm", help=f"One of {', '.join(ALGORITHMS)}.")]
Routing = Annotated[str | None, typer.Option("--routing", help="ecmp or spray [default: spray on IB].")]
Seed = Annotated[int | None, typer.Option("--seed", help="ECMP hash seed (with ecmp routing only) [default: 0].")]
Plot = Annotated[Path | None, typer.Option(
    "--plot", help=f"Write busbw vs size (or GPUs) to a file ending in {', '.join(PLOT_SUFFIXES)} (.html needs no "
    "matplotlib).")]


def _gbps(value: float) -> str:
    """A bandwidth in GB/s, with digits left for tiny ones (a 1-byte collective moves ~0.0001 GB/s)."""
    return f"{value:.1f}" if value >= 1 or value == 0 else f"{value:.2g}"


def _plot(path: Path, rows: list[dict[str, Any]], x_key: str) -> None:
    series: Series = {}
    for row in rows:
        label = f"{row['topology']} {row['network']} {row['oversubscription']:g}:1"
        series.setdefault(label, []).append((row[x_key], row["busbw_gbps"]))
    write_series_plot(path, series, x_label="message bytes" if x_key == "size_bytes" else "GPUs",
                      y_label="bus bandwidth, GB/s", title="Bus bandwidth (GB/s)")


def build(
    topology: Topology = "fat-tree",
    gpus: int = typer.Option(..., "--gpus", min=1, help="GPUs in the cluster."),
    network: str = typer.Option("ndr400", "--network", help="Network id (`gpufleet catalog list networks`)."),
    gpu: Gpu = None, node: Node = None,
    oversubscription: str = typer.Option("1:1", "--oversubscription", help="Leaf down:up ratio, e.g. 2:1."),
    catalog: list[Path] = CatalogOption,
    json_mode: bool = JsonOption,
) -> None:
    """Summary and bill of materials of a topology.

    Example: `gpufleet fabric build --gpus 1024 --topology rail-optimized --network ndr400`
    """
    cat = open_catalog(catalog)
    request = FabricBuildRequest(gpus=gpus, topology=topology, network=network, gpu=gpu, node=node,
                                 oversubscription=oversubscription)
    built = build_fabric(request, cat)
    Output(json_mode).emit(built.data, lambda console: _render_build(console, built))


def _render_build(console: Console, built: FabricBuild) -> None:
    bom = built.bom
    console.print(built.graph.description)
    table = Table("tier", "switches", "ports used", "ports free")
    for t in bom.tiers:
        table.add_row(t.tier, str(t.switches), str(t.ports_used), str(t.ports_free))
    console.print(table)
    console.print(f"cables: {bom.copper_cables} copper, {bom.optical_cables} optical "
                  f"({bom.transceivers} transceivers"
                  + (f", {built.optics_w / 1e3:.1f} kW)" if built.optics_w else
                     ", powered within the per-switch figure)"))
    console.print(f"fabric power: {built.fabric_w / 1e3:.1f} kW ({built.power_source})")


def simulate(
    collective: Collective = "all-reduce", size: Size = "1GiB", gpus: str = SweepGpus, topology: Topology = "fat-tree",
    network: Networks = "ndr400", gpu: Gpu = None, node: Node = None,
    oversubscription: str = typer.Option("1:1", "--oversubscription", help="Leaf down:up ratio, e.g. 4:1."),
    placement: PlacementFlag = "block", algorithm: AlgorithmFlag = "auto", routing: Routing = None, seed: Seed = None,
    plot: Plot = None, catalog: list[Path] = CatalogOption, json_mode: bool = JsonOption,
) -> None:
    """Simulate one collective (flow level) and compare with the analytical model.

    One simulation is limited to about a minute and 2 GiB (on 2 cores); a larger one (all-to-all over
    thousands of GPUs, ECMP routing) is refused at once with the largest GPU count that fits.

    Example: `gpufleet fabric simulate --collective all-reduce --size 1GiB --gpus 256 --topology leaf-spine
    --oversubscription 4:1`
    """
    if plot is not None:
        check_output_path(plot, "--plot")
    request = FabricSimulateRequest(
        collective=collective, size=size, gpus=gpus, topology=topology, network=network, gpu=gpu, node=node,
        oversubscription=oversubscription, placement=placement, algorithm=algorithm, routing=routing, seed=seed,
    )
    rows = simulate_fabric(request, open_catalog(catalog))
    if plot is not None:
        _plot(plot, rows, "size_bytes" if len(request.sizes) > 1 else "gpus")
    data: dict[str, Any] = rows[0] if len(rows) == 1 else {"results": rows}
    Output(json_mode).emit(data, lambda console: _render_simulate(console, rows))


def _render_simulate(console: Console, rows: list[dict[str, Any]]) -> None:
    table = Table("GPUs", "network", "topology", "size", "algorithm", "time ms", "algbw GB/s",
                  "busbw GB/s", "analytical busbw", "bottleneck")
    for row in rows:
        neck = ", ".join(f"{b['tier']} ×{b['links']}" for b in row["bottlenecks"])
        table.add_row(str(row["gpus"]), row["network"], f"{row['topology']} {row['oversubscription']:g}:1",
                      format_bytes(row["size_bytes"]), row["algorithm"], f"{row['time_s'] * 1e3:.2f}",
                      _gbps(row["algbw_gbps"]), _gbps(row["busbw_gbps"]),
                      _gbps(row["analytical_busbw_gbps"]), neck)
    console.print(table)


def register(app: typer.Typer) -> None:
    fabric_app = typer.Typer(help="Build a network topology (summary, bill of materials) or simulate a collective.",
                             no_args_is_help=True)
    app.add_typer(fabric_app, name="fabric")
    fabric_app.command("build")(build)
    fabric_app.command("simulate")(simulate)
