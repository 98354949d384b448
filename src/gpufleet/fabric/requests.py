"""What `gpufleet fabric build` and `fabric simulate` ask, as typed requests, and the call that answers each.

The requests own their choices and parsing (topology kind, oversubscription ratio, collective, placement,
algorithm, routing, the buffer sizes and GPU counts of a sweep); the answers resolve the hardware in the catalog,
refuse a cluster over the topology's or the simulator's limits before anything is built, and compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

from pydantic import Field, model_validator

from gpufleet.catalog.economics_records import DEFAULT_ID, FacilityDefaults
from gpufleet.catalog.records import NetworkSpec, NodeSpec
from gpufleet.catalog.registry import DEFAULT_GPU, Catalog
from gpufleet.errors import InputError
from gpufleet.fabric.bom import Bom, bill_of_materials
from gpufleet.fabric.collectives import OPS, Op, bus_factor, collective_cost
from gpufleet.fabric.graph import CORE, LEAF, SPINE, FabricGraph, build_graph, check_size, estimate_fabric_size
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
from gpufleet.fabric.topology import TOPOLOGY_KINDS, Cluster, Fabric, TopologyKind, check_node_holds
from gpufleet.request import MAX_SWEEP_COUNTS, Request, check_gpu_count
from gpufleet.units import parse_bytes_list, parse_int_list, parse_ratio

#: Buffer per rank `fabric simulate` takes: 1 byte to 1 TiB. The top is 3.5x the largest GPU memory in the
#: catalog (288 GiB), so every buffer a GPU can hold fits; a larger one cannot be a real rank's buffer, and
#: the simulated time only scales with it (1e30 bytes used to print a time of 10^17 seconds).
MIN_SIZE_BYTES = 1
MAX_SIZE_BYTES = 2**40
_SIZE_RANGE = "the simulator takes 1 byte (a bare number is bytes) to 1 TiB per rank, e.g. 1GiB"


def _choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise InputError(f"{what} {value!r} is not one of {', '.join(allowed)}")
    return value


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


def cluster_of(catalog: Catalog, gpus: int, topology: str, network: str, node: str | None, gpu: str | None,
               oversubscription: str) -> Cluster:
    """The cluster described, refused (by arithmetic, before any graph is built) when its topology cannot
    connect that many GPUs. `gpu` None: --node's GPU, else DEFAULT_GPU."""
    gpu = gpu or (catalog.node(node).gpu if node else DEFAULT_GPU)
    node_spec = resolve_node(catalog, node, gpu)
    fabric = Fabric(catalog.network(network), cast(TopologyKind, _choice(topology, TOPOLOGY_KINDS, "--topology")),
                    parse_ratio(oversubscription, "--oversubscription"))
    cluster = Cluster(catalog.gpu(node_spec.gpu), node_spec, gpus, fabric,
                      scale_up_step_latency_s=catalog.judgements().scale_up_step_latency_s)
    check_size(cluster)
    return cluster


class FabricBuildRequest(Request):
    """A topology of `gpus` GPUs on `network`, leaf down:up `oversubscription` ('2:1')."""

    gpus: int = Field(ge=1)
    topology: str = "fat-tree"
    network: str = "ndr400"
    gpu: str | None = None
    node: str | None = None
    oversubscription: str = "1:1"


@dataclass(frozen=True)
class FabricBuild:
    graph: FabricGraph
    bom: Bom
    optics_w: float
    fabric_w: float
    power_source: str
    data: dict[str, Any]


def build_fabric(request: FabricBuildRequest, catalog: Catalog) -> FabricBuild:
    """Summary and bill of materials of the topology, with its power."""
    cluster = cluster_of(catalog, request.gpus, request.topology, request.network, request.node, request.gpu,
                         request.oversubscription)  # the topology's limit
    check_gpu_count(request.gpus)  # then gpufleet's, for switches of a radix that would allow millions
    graph = build_graph(cluster)
    bom = bill_of_materials(graph, cluster)
    # No switch power for this network: the facility model's per-switch default (optics included, a judgement
    # in facility.yaml), so `fabric build` and `facility` count the same watts.
    if bom.switch_power_w is not None:
        switch_w, optics_w, power_source = bom.switch_power_w, bom.optics_power_w, "network catalog entry"
    else:  # the default already counts each switch's optics: none on top, so switch + optics = fabric
        per_switch_w = catalog.get("facility_defaults", DEFAULT_ID, FacilityDefaults).switch_power_w
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
    return FabricBuild(graph, bom, optics_w, fabric_w, power_source, data)


class FabricSimulateRequest(Request):
    """One collective (or a sweep over sizes, GPU counts, networks and topologies), simulated at flow level."""

    collective: str = "all-reduce"
    #: buffer per rank: '1GiB', or a list '1MiB,1GiB'
    size: str = "1GiB"
    #: a count, a list '128,256', or a range '64-1024' (doublings) or '64-512:64'
    gpus: str
    topology: str = "fat-tree"
    network: str = "ndr400"
    gpu: str | None = None
    node: str | None = None
    oversubscription: str = "1:1"
    placement: str = "block"
    algorithm: str = "auto"
    #: None: spray on InfiniBand (`simulate.default_routing`)
    routing: str | None = None
    #: ECMP hash seed (ecmp routing only); None: 0
    seed: int | None = None

    @model_validator(mode="after")
    def _check(self) -> FabricSimulateRequest:
        _choice(self.collective, OPS, "--collective")
        _choice(self.placement, ("block", "scatter"), "--placement")
        _choice(self.algorithm, ALGORITHMS, "--algorithm")
        if self.routing:
            _choice(self.routing, ROUTING_MODES, "--routing")
        self.sizes  # noqa: B018 - parsed now: a bad list is refused with the request
        if min(self.counts) < 2:
            raise InputError(f"--gpus {min(self.counts)}: a collective needs a group of at least 2 GPUs")
        return self

    @property
    def sizes(self) -> list[float]:
        return parse_bytes_list(self.size, "--size", least_bytes=MIN_SIZE_BYTES, most_bytes=MAX_SIZE_BYTES,
                                note=_SIZE_RANGE)

    @property
    def counts(self) -> list[int]:
        return parse_int_list(self.gpus, "--gpus", most=MAX_SWEEP_COUNTS)


def block_span(cluster: Cluster, placement: Placement) -> GroupSpan:
    """The span of a group of every GPU of `cluster`, as placement.group_span would give it."""
    return span_over_nodes(cluster.gpus, cluster.gpus_per_node, cluster.num_nodes, cluster, placement)


def _check_work(request: FabricSimulateRequest, catalog: Catalog, cluster: Cluster, topology: str,
                network: str) -> None:
    """Refuse, before anything is simulated, a cluster whose simulation is over the simulator's limits; the
    message names the largest power-of-two GPU count that fits on this fabric."""
    op, algorithm, placement = cast(Op, request.collective), cast(Algorithm, request.algorithm), cast(
        Placement, request.placement)

    def check(c: Cluster, hint: str = "") -> None:
        mode = cast(RoutingMode | None, request.routing) or default_routing(c)
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
                    check(cluster_of(catalog, count, topology, network, request.node, request.gpu,
                                     request.oversubscription))
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


def simulate_fabric(request: FabricSimulateRequest, catalog: Catalog) -> list[dict[str, Any]]:
    """One row per cluster and size: simulated and analytical time and bus bandwidth, the bottleneck links.
    Every simulation is checked against the simulator's limits before the first one runs."""
    mode = cast(RoutingMode | None, request.routing or None)
    networks = [n.strip() for n in request.network.split(",")]
    topologies = [t.strip() for t in request.topology.split(",")]
    described = [(net, topo, cluster_of(catalog, count, topo, net, request.node, request.gpu,
                                        request.oversubscription))
                 for net in networks for topo in topologies for count in request.counts]
    clusters = [c for _, _, c in described]
    if request.seed is not None and all((mode or default_routing(c)) != "ecmp" for c in clusters):
        raise InputError("--seed seeds ECMP hashing, but every simulation here routes by spray "
                         f"({', '.join(networks)}); add --routing ecmp or leave out --seed")
    for net, topo, c in described:
        _check_work(request, catalog, c, topo, net)
    op, place, algo = cast(Op, request.collective), cast(Placement, request.placement), cast(
        Algorithm, request.algorithm)
    return [_simulate_one(op, s, c, place, algo, mode, request.seed or 0) for c in clusters for s in request.sizes]
