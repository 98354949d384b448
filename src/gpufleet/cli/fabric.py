"""`gpufleet fabric build|simulate`: a topology's summary and bill of materials; a simulated collective."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.cli.common import MAX_SWEEP_COUNTS, CatalogOption, JsonOption, check_gpu_count, gpu_for, open_catalog
from gpufleet.cli.output import Output
from gpufleet.economics.defaults import facility_defaults
from gpufleet.economics.requests import resolve_node
from gpufleet.errors import InputError
from gpufleet.fabric.bom import bill_of_materials
from gpufleet.fabric.collectives import OPS, Op, bus_factor, collective_cost
from gpufleet.fabric.graph import CORE, LEAF, SPINE, build_graph, check_size, estimate_fabric_size
from gpufleet.fabric.placement import GroupSpan, Placement, span_over_nodes
from gpufleet.fabric.routing import ROUTING_MODES, RoutingMode
from gpufleet.fabric.simulate import (
    ALGORITHMS,
    Algorithm,
    check_work,
    default_routing,
    estimate_work,
    shape_of_span,
    simulate_collective,
)
from gpufleet.fabric.topology import TOPOLOGY_KINDS, Cluster, Fabric, TopologyKind
from gpufleet.report.plots import PLOT_SUFFIXES, Series, check_output_path, write_series_plot
from gpufleet.units import format_bytes, parse_bytes_list, parse_int_list, parse_ratio

#: Buffer per rank `fabric simulate` takes: 1 byte to 1 TiB. The top is 3.5x the largest GPU memory in the
#: catalog (288 GiB), so every buffer a GPU can hold fits; a larger one cannot be a real rank's buffer, and
#: the simulated time only scales with it (1e30 bytes used to print a time of 10^17 seconds).
MIN_SIZE_BYTES = 1
MAX_SIZE_BYTES = 2**40
_SIZE_RANGE = "the simulator takes 1 byte (a bare number is bytes) to 1 TiB per rank, e.g. 1GiB"


def _gbps(value: float) -> str:
    """A bandwidth in GB/s, with digits left for tiny ones (a 1-byte collective moves ~0.0001 GB/s)."""
    return f"{value:.1f}" if value >= 1 or value == 0 else f"{value:.2g}"


def _choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise InputError(f"{what} {value!r} is not one of {', '.join(allowed)}")
    return value


def _cluster(catalog_paths: list[Path] | None, gpus: int, topology: str, network: str, node: str | None,
             gpu: str | None, oversubscription: str) -> Cluster:
    """The cluster the flags describe, refused (by arithmetic, before any graph is built) when its topology
    cannot connect that many GPUs."""
    catalog = open_catalog(catalog_paths)
    node_spec = resolve_node(catalog, node, gpu_for(catalog, node, gpu))
    fabric = Fabric(catalog.network(network), cast(TopologyKind, _choice(topology, TOPOLOGY_KINDS, "--topology")),
                    parse_ratio(oversubscription, "--oversubscription"))
    cluster = Cluster(catalog.gpu(node_spec.gpu), node_spec, gpus, fabric)
    check_size(cluster)
    return cluster


def block_span(cluster: Cluster, placement: Placement) -> GroupSpan:
    """The span of a group of every GPU of `cluster`, as placement.group_span would give it."""
    return span_over_nodes(cluster.gpus, cluster.gpus_per_node, cluster.num_nodes, cluster, placement)


def _check_work(op: Op, cluster: Cluster, placement: Placement, algorithm: Algorithm, routing: RoutingMode | None,
                catalog_paths: list[Path] | None, topology: str, network: str, node: str | None, gpu: str | None,
                oversubscription: str) -> None:
    """Refuse, before anything is simulated, a cluster whose simulation is over the simulator's limits; the
    message names the largest power-of-two GPU count that fits on this fabric."""

    def check(c: Cluster, hint: str = "") -> None:
        mode = routing or default_routing(c)
        work = estimate_work(op, algorithm, mode, shape_of_span(c, block_span(c, placement)), estimate_fabric_size(c))
        check_work(work, hint)

    try:
        check(cluster)
    except InputError:
        fits = None
        count = 2 ** (cluster.gpus.bit_length() - 1)
        while count >= 2 and fits is None:
            if count < cluster.gpus:
                try:
                    check(_cluster(catalog_paths, count, topology, network, node, gpu, oversubscription))
                    fits = count
                except InputError:
                    pass
            count //= 2
        check(cluster, f"--gpus {fits} fits" if fits else "")


def _simulate_one(op: Op, size: float, cluster: Cluster, placement: Placement, algorithm: Algorithm,
                  routing: RoutingMode | None, seed: int) -> dict[str, Any]:
    span = block_span(cluster, placement)
    result = simulate_collective(op, size, span, cluster, placement=placement, algorithm=algorithm,
                                 routing=routing, seed=seed)
    analytical = collective_cost(op, size, span, cluster)
    factor = bus_factor(op, cluster.gpus)
    analytical_bus = size * factor / analytical.time_s if analytical.time_s > 0 else math.inf
    return {
        "collective": op, "size_bytes": size, "gpus": cluster.gpus, "topology": cluster.fabric.kind,
        "network": cluster.fabric.network.id, "oversubscription": cluster.fabric.oversubscription,
        "placement": placement, "algorithm": result.algorithm, "routing": result.routing,
        "time_s": result.time_s, "algbw_gbps": result.algbw_bytes_per_s / 1e9,
        "busbw_gbps": result.bus_bytes_per_s / 1e9, "analytical_time_s": analytical.time_s,
        "analytical_busbw_gbps": analytical_bus / 1e9, "analytical_link": analytical.link,
        "bottlenecks": [{"tier": b.tier, "links": b.links, "example": b.example,
                         "fair_share_gbps": b.fair_share_bytes_per_s / 1e9} for b in result.bottlenecks],
    }


def _plot(path: Path, rows: list[dict[str, Any]], x_key: str) -> None:
    series: Series = {}
    for row in rows:
        label = f"{row['topology']} {row['network']} {row['oversubscription']:g}:1"
        series.setdefault(label, []).append((row[x_key], row["busbw_gbps"]))
    write_series_plot(path, series, x_label="message bytes" if x_key == "size_bytes" else "GPUs",
                      y_label="bus bandwidth, GB/s", title="Bus bandwidth (GB/s)")


def register(app: typer.Typer) -> None:
    fabric_app = typer.Typer(help="Build a network topology (summary, bill of materials) or simulate a collective.",
                             no_args_is_help=True)
    app.add_typer(fabric_app, name="fabric")

    @fabric_app.command("build")
    def build(
        topology: str = typer.Option("fat-tree", "--topology", help=f"One of {', '.join(TOPOLOGY_KINDS)}."),
        gpus: int = typer.Option(..., "--gpus", min=1, help="GPUs in the cluster."),
        network: str = typer.Option("ndr400", "--network", help="Network id (`gpufleet catalog list networks`)."),
        gpu: str | None = typer.Option(None, "--gpu", help="GPU id; its default node is used [default: --node's "
                                       "GPU, else h100-sxm]."),
        node: str | None = typer.Option(None, "--node", help="Node id instead of --gpu's default node (it must "
                                        "hold --gpu when both are given)."),
        oversubscription: str = typer.Option("1:1", "--oversubscription", help="Leaf down:up ratio, e.g. 2:1."),
        catalog: list[Path] = CatalogOption,
        json_mode: bool = JsonOption,
    ) -> None:
        """Summary and bill of materials of a topology.

        Example: `gpufleet fabric build --gpus 1024 --topology rail-optimized --network ndr400`
        """
        cluster = _cluster(catalog, gpus, topology, network, node, gpu, oversubscription)  # the topology's limit
        check_gpu_count(gpus)  # then gpufleet's, for switches of a radix that would allow millions
        graph = build_graph(cluster)
        bom = bill_of_materials(graph, cluster)
        # No switch power for this network: the facility model's per-switch default (optics included, a judgement
        # in facility.yaml), so `fabric build` and `facility` count the same watts.
        if bom.switch_power_w is not None:
            switch_w, optics_w, power_source = bom.switch_power_w, bom.optics_power_w, "network catalog entry"
        else:  # the default already counts each switch's optics: none on top, so switch + optics = fabric
            per_switch_w = facility_defaults(open_catalog(catalog)).switch_power_w
            switch_w, optics_w = per_switch_w * bom.switches, 0.0
            power_source = f"facility default {per_switch_w / 1e3:g} kW per switch incl. optics (judgement)"
        fabric_w = switch_w + optics_w
        data = {
            "description": graph.description, "gpus": cluster.gpus, "nodes": cluster.num_nodes,
            "leaf_switches": graph.count(LEAF), "spine_switches": graph.count(SPINE),
            "core_switches": graph.count(CORE), "switches": bom.switches,
            "tiers": [{"tier": t.tier, "switches": t.switches, "ports_used": t.ports_used,
                       "ports_free": t.ports_free} for t in bom.tiers],
            "copper_cables": bom.copper_cables, "optical_cables": bom.optical_cables,
            "transceivers": bom.transceivers, "switch_power_w": switch_w,
            "optics_power_w": optics_w, "fabric_power_w": fabric_w, "switch_power_source": power_source,
        }

        def render(console: Console) -> None:
            console.print(graph.description)
            table = Table("tier", "switches", "ports used", "ports free")
            for t in bom.tiers:
                table.add_row(t.tier, str(t.switches), str(t.ports_used), str(t.ports_free))
            console.print(table)
            console.print(f"cables: {bom.copper_cables} copper, {bom.optical_cables} optical "
                          f"({bom.transceivers} transceivers"
                          + (f", {optics_w / 1e3:.1f} kW)" if optics_w else ", powered within the per-switch figure)"))
            console.print(f"fabric power: {fabric_w / 1e3:.1f} kW ({power_source})")

        Output(json_mode).emit(data, render)

    @fabric_app.command("simulate")
    def simulate(
        collective: str = typer.Option("all-reduce", "--collective", help=f"One of {', '.join(OPS)}."),
        size: str = typer.Option("1GiB", "--size", help="Buffer per rank, 1 byte to 1 TiB: a bare number is bytes; "
                                 "units KiB/MiB/GiB/TiB (or K/M/G/T) and KB/MB/GB/TB, e.g. 1GiB, or a list 1MiB,1GiB."),
        gpus: str = typer.Option(..., "--gpus", help="GPUs in the group (= cluster): a count, a list 128,256, or a "
                                 "range 64-1024 (doublings, the top included) or 64-512:64 (steps of 64)."),
        topology: str = typer.Option("fat-tree", "--topology", help=f"One of {', '.join(TOPOLOGY_KINDS)}."),
        network: str = typer.Option("ndr400", "--network", help="Network id, or a list ndr400,roce200."),
        gpu: str | None = typer.Option(None, "--gpu", help="GPU id; its default node is used [default: --node's "
                                       "GPU, else h100-sxm]."),
        node: str | None = typer.Option(None, "--node", help="Node id instead of --gpu's default node (it must "
                                        "hold --gpu when both are given)."),
        oversubscription: str = typer.Option("1:1", "--oversubscription", help="Leaf down:up ratio, e.g. 4:1."),
        placement: str = typer.Option("block", "--placement", help="block or scatter."),
        algorithm: str = typer.Option("auto", "--algorithm", help=f"One of {', '.join(ALGORITHMS)}."),
        routing: str | None = typer.Option(None, "--routing", help="ecmp or spray [default: spray on IB]."),
        seed: int | None = typer.Option(None, "--seed", help="ECMP hash seed (with ecmp routing only) [default: 0]."),
        plot: Path | None = typer.Option(None, "--plot", help="Write busbw vs size (or GPUs) to a file ending in "
                                         f"{', '.join(PLOT_SUFFIXES)} (.html needs no matplotlib)."),
        catalog: list[Path] = CatalogOption,
        json_mode: bool = JsonOption,
    ) -> None:
        """Simulate one collective (flow level) and compare with the analytical model.

        One simulation is limited to about a minute and 2 GiB (on 2 cores); a larger one (all-to-all over
        thousands of GPUs, ECMP routing) is refused at once with the largest GPU count that fits.

        Example: `gpufleet fabric simulate --collective all-reduce --size 1GiB --gpus 256 --topology leaf-spine
        --oversubscription 4:1`
        """
        if plot is not None:
            check_output_path(plot, "--plot")
        op = cast(Op, _choice(collective, OPS, "--collective"))
        place = cast(Placement, _choice(placement, ("block", "scatter"), "--placement"))
        algo = cast(Algorithm, _choice(algorithm, ALGORITHMS, "--algorithm"))
        mode = cast(RoutingMode, _choice(routing, ROUTING_MODES, "--routing")) if routing else None
        sizes = parse_bytes_list(size, "--size", least_bytes=MIN_SIZE_BYTES, most_bytes=MAX_SIZE_BYTES,
                                 note=_SIZE_RANGE)
        counts = parse_int_list(gpus, "--gpus", most=MAX_SWEEP_COUNTS)
        if min(counts) < 2:
            raise InputError(f"--gpus {min(counts)}: a collective needs a group of at least 2 GPUs")
        networks = [n.strip() for n in network.split(",")]
        topologies = [t.strip() for t in topology.split(",")]
        described = [(net, topo, _cluster(catalog, count, topo, net, node, gpu, oversubscription))
                     for net in networks for topo in topologies for count in counts]
        clusters = [c for _, _, c in described]
        if seed is not None and all((mode or default_routing(c)) != "ecmp" for c in clusters):
            raise InputError("--seed seeds ECMP hashing, but every simulation here routes by spray "
                             f"({', '.join(networks)}); add --routing ecmp or leave out --seed")
        for net, topo, c in described:  # every simulation is checked before the first one runs
            _check_work(op, c, place, algo, mode, catalog, topo, net, node, gpu, oversubscription)
        rows = [_simulate_one(op, s, c, place, algo, mode, seed or 0) for c in clusters for s in sizes]
        if plot is not None:
            _plot(plot, rows, "size_bytes" if len(sizes) > 1 else "gpus")
        data: dict[str, Any] = rows[0] if len(rows) == 1 else {"results": rows}

        def render(console: Console) -> None:
            table = Table("GPUs", "network", "topology", "size", "algorithm", "time ms", "algbw GB/s",
                          "busbw GB/s", "analytical busbw", "bottleneck")
            for row in rows:
                neck = ", ".join(f"{b['tier']} ×{b['links']}" for b in row["bottlenecks"])
                table.add_row(str(row["gpus"]), row["network"], f"{row['topology']} {row['oversubscription']:g}:1",
                              format_bytes(row["size_bytes"]), row["algorithm"], f"{row['time_s'] * 1e3:.2f}",
                              _gbps(row["algbw_gbps"]), _gbps(row["busbw_gbps"]),
                              _gbps(row["analytical_busbw_gbps"]), neck)
            console.print(table)

        Output(json_mode).emit(data, render)
