"""What a simulation costs, by arithmetic before anything is built, and the limits it must stay under."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpufleet.errors import InputError
from gpufleet.fabric.collectives import Op
from gpufleet.fabric.graph import (
    LEAF,
    FabricGraph,
    FabricSize,
    IntArray,
)
from gpufleet.fabric.placement import GroupSpan
from gpufleet.fabric.routing import RoutingMode, relay_gpu, spray_paths, switch_hops
from gpufleet.fabric.sim.phases import (
    _pairwise_plan,
)
from gpufleet.fabric.sim.records import (
    Algorithm,
)
from gpufleet.fabric.topology import Cluster

#: Limits of one simulation, a judgement: about a minute and well under 4 GiB on a 2-core machine. The
#: estimates below are calibrated there (benchmarks/bench_fabric.py prints estimate and measurement side
#: by side) and err on the safe side: measured runs take 1-60 % of their estimated time (the fewest rounds
#: where the most were feared: rings placed block by block), never much more.
MAX_SIM_SECONDS = 60.0
MAX_SIM_BYTES = 2 * 2**30
#: Calibration constants of `estimate_work` (seconds or bytes per unit, measured on 2 shared cores).
_SECONDS_PER_FLOW = 1.5e-6  # route one flow's endpoints and set it up (per phase it is in)
_SECONDS_PER_PATH_LINK = 3e-8  # route a spray path (per leaf pair) over each of its links
_SECONDS_PER_ROUND = 60e-6  # fixed cost of one round of progressive filling
_SECONDS_PER_ROUND_LINK = 1.5e-9  # each round scans every link twice
#: Rounds of progressive filling in a phase, as a fraction of sqrt(flows x links): ECMP's hash collisions
#: give many distinct fill levels, spray's even split very few. Highest measured (64-16,384 GPUs, fat-tree,
#: rail-optimized and leaf-spine, 1:1 and 4:1, block and scatter), rounded up.
_ROUNDS: dict[tuple[str, str], float] = {
    ("ecmp", "all-to-all"): 0.17, ("ecmp", "send-recv"): 0.1, ("ecmp", "ring"): 0.06,
    ("spray", "all-to-all"): 0.006, ("spray", "send-recv"): 0.003, ("spray", "ring"): 0.003,
}
_BYTES_BASE = 150 * 2**20  # interpreter, numpy/scipy and the catalog
_BYTES_PER_LINK = 200  # the graph's arrays and routing tables
_BYTES_PER_FLOW = 500  # a flow's routes, incidence (both orientations) and solver state, at the peak
_BYTES_PER_PATH_LINK = 80  # a spray path's entries (routes, incidence both ways, solver copies)
_SECONDS_PER_HOP_ENTRY = 2e-7  # routing's hop count from every switch to every leaf (breadth-first, once)
_BYTES_PER_HOP_ENTRY = 32  # the distances as floats, then as integers


@dataclass(frozen=True, slots=True)
class GroupShape:
    """What a simulation's work depends on: `groups` congruent groups, each `nodes` x `per_node` ranks."""

    groups: int  # the group and its siblings on the same nodes, solved together
    nodes: int
    per_node: int
    channels: int  # distinct NICs among one node's members: rings (or trees) per node
    mesh_strides: int  # rings run at once inside a node: k - 1 over an AMD mesh of k > 2 members, else 1

    @property
    def ranks(self) -> int:
        return self.nodes * self.per_node


@dataclass(frozen=True, slots=True)
class SimWork:
    """Estimated work of one simulation (`estimate_work`)."""

    op: str
    ranks: int  # all groups together
    phase_flows: tuple[int, ...]  # flows of each phase that is solved
    links: int
    seconds: float  # on a 2-core machine
    bytes: float  # peak

    @property
    def flows(self) -> int:
        return sum(self.phase_flows)


def _phases(op: Op, algorithm: Algorithm, shape: GroupShape) -> list[tuple[int, int]]:
    """(flows, pairs of nodes its flows between nodes join, at most) of every phase the simulator solves, all
    groups together. Ranks are numbered node by node in every placement, so a node's k ranks shifted by
    s..s+σ-1 land on a run of k+σ-1 ranks, which touches at most (σ+2k-3) // k + 1 nodes; a ring node sends
    to one node, a tree edge joins two."""
    g, m, k, c, strides, n = (shape.groups, shape.nodes, shape.per_node, shape.channels, shape.mesh_strides,
                              shape.ranks)
    if n < 2:
        return []
    across = m > 1
    if op == "all-to-all":
        phases = []
        for shift_ids, _ in _pairwise_plan(n):  # at most MAX_ALL_TO_ALL_STEPS small arrays, whatever n
            shifts = len(shift_ids)
            phases.append((g * n * shifts, g * m * min(m - 1, (shifts + 2 * k - 3) // k + 1) if across else 0))
        return phases
    if op == "send-recv":
        return [(g * (n // 2), g * min(n // 2, m) if across else 0)]  # half the nodes send, to two nodes each

    def ring(kind: Op) -> list[tuple[int, int]]:
        flows, into_root = (n * strides, strides) if m == 1 else (c * n, c)
        return [(g * (flows - into_root if kind == "broadcast" else flows), g * m if across else 0)]

    def tree() -> list[tuple[int, int]]:
        if m == 1:
            return ring("all-reduce")
        return [(g * c * 2 * (2 * m * (k - 1) + 2 * (m - 1)), g * 4 * (m - 1))]

    if algorithm == "tree":
        return tree()
    if algorithm == "hierarchical":
        intra = [(g * n * strides, 0)] if k > 1 else []
        return intra + ([(g * n, g * m)] if across else []) + intra
    if op == "all-reduce" and algorithm == "auto" and across:
        return ring(op) + tree()
    return ring(op)


def phase_flows(op: Op, algorithm: Algorithm, shape: GroupShape) -> list[int]:
    """Flows of every phase the simulator solves for `op` (all groups together), by arithmetic: the same
    counts as the phases `collective_phases` builds (`auto` all-reduce across nodes solves ring and tree)."""
    return [flows for flows, _ in _phases(op, algorithm, shape)]


def estimate_work(op: Op, algorithm: Algorithm, routing: RoutingMode, shape: GroupShape,
                  fabric: FabricSize) -> SimWork:
    """Time and peak memory of simulating `op` over `shape` on `fabric`, by arithmetic.

    Per phase of F flows over L links: F route set-ups; with spray, one path per pair of leaves its flows
    join (at most leaves², and one per pair of nodes and rail: PXN sends a node's flows to another node over
    one leaf pair per rail), each over the spray path's links; and rounds of progressive filling, each
    scanning the links: rounds = fraction x sqrt(F x L) (at most F and L; the fraction depends on routing and
    collective). Memory: the graph, and the largest phase's flows and spray paths.

    The path-length part assumes consecutive ranks mostly share a pod, so a ring's or tree's paths mostly
    stay in one (true of `ranks_for_span`'s rank orders, which `shape_of_span` describes). `simulate_ranks`
    takes any rank order: one that jumps between pods at every rank (e.g. a random permutation, from library
    code) builds longer spray paths and may cost more than estimated here, past the limits `check_work` keeps.
    """
    family = op if op in ("all-to-all", "send-recv") else "ring"
    links = fabric.links
    seconds, peak = 0.0, 0.0
    phases = _phases(op, algorithm, shape)
    spray = routing == "spray" and fabric.leaves > 1
    # a ring or tree joins nodes next to each other in rank order: most of its paths stay in a pod, and about
    # four per pod's worth of nodes leave it (the tree's long edges); all-to-all and send-recv reach far
    leaving = 4 * shape.groups * math.ceil(shape.nodes / fabric.pod_nodes) * fabric.pair_fanout
    for flows, node_pairs in phases:
        paths = min(node_pairs * fabric.pair_fanout, fabric.leaves**2) if spray else 0
        far = paths if family != "ring" else min(paths, leaving)
        path_links = far * fabric.spray_path_links + (paths - far) * fabric.near_path_links
        rounds = min(flows, links, _ROUNDS[routing, family] * math.sqrt(flows * links))
        seconds += (flows * _SECONDS_PER_FLOW + path_links * _SECONDS_PER_PATH_LINK
                    + rounds * (_SECONDS_PER_ROUND + links * _SECONDS_PER_ROUND_LINK))
        peak = max(peak, flows * _BYTES_PER_FLOW + path_links * _BYTES_PER_PATH_LINK)
    hop_entries = fabric.switches * fabric.leaves if fabric.leaves > 1 else 0
    seconds += hop_entries * _SECONDS_PER_HOP_ENTRY
    memory = _BYTES_BASE + links * _BYTES_PER_LINK + hop_entries * _BYTES_PER_HOP_ENTRY + peak
    return SimWork(op, shape.groups * shape.ranks, tuple(f for f, _ in phases), links, seconds, memory)


def check_work(work: SimWork, hint: str = "") -> None:
    """Refuse, in one line, a simulation whose estimated time or memory is over MAX_SIM_SECONDS / MAX_SIM_BYTES.
    `hint` (e.g. the largest GPU count that fits) goes before the alternatives."""
    if work.seconds <= MAX_SIM_SECONDS and work.bytes <= MAX_SIM_BYTES:
        return
    over = (f"~{work.seconds:,.0f} s" if work.seconds > MAX_SIM_SECONDS
            else f"~{work.bytes / 2**30:,.1f} GiB of memory")
    raise InputError(
        f"simulating {work.op} over {work.ranks:,} GPUs would solve {work.flows:,} flows in {len(work.phase_flows)} "
        f"phase(s) over {work.links:,} links, an estimated {over}; the flow simulator takes at most about "
        f"{MAX_SIM_SECONDS:.0f} s and {MAX_SIM_BYTES / 2**30:.0f} GiB per collective (on 2 cores): simulate fewer "
        f"GPUs{f' ({hint})' if hint else ''}, or use the analytical model "
        "(`gpufleet plan --fabric-model analytical`, the default)"
    )


def shape_of_ranks(graph: FabricGraph, groups: IntArray) -> GroupShape:
    """The shape of congruent groups of GPU ids (rows) on `graph`."""
    first = groups[0]
    node = graph.node_of_gpu[first]
    nodes, per_node = np.unique(node, return_counts=True)
    k = int(per_node.max())
    mesh = bool(graph.edge_up[first[0]] < 0) and k > 2
    channels = len(np.unique(graph.nic_of_gpu[first[node == node[0]]]))
    return GroupShape(len(groups), len(nodes), k, channels, k - 1 if mesh else 1)


def shape_of_span(cluster: Cluster, span: GroupSpan | int, siblings: bool = True) -> GroupShape:
    """The shape `ranks_for_span` (a GroupSpan) or the first n GPUs (an int) give, by arithmetic."""
    gpn = cluster.gpus_per_node
    if isinstance(span, GroupSpan):
        per_node, nodes = min(span.per_node, gpn), span.nodes
        stride = max(1, gpn // max(per_node, 1))
    else:
        per_node, nodes, stride = min(span, gpn), math.ceil(span / gpn), 1
    local = np.arange(per_node) * stride
    channels = len(np.unique(local * cluster.node.nics // cluster.node.gpus))
    mesh = cluster.scale_up.kind == "mesh" and gpn > 1 and per_node > 2
    groups = stride if isinstance(span, GroupSpan) and siblings else 1
    return GroupShape(groups, nodes, per_node, channels, per_node - 1 if mesh else 1)


def fabric_size(graph: FabricGraph) -> FabricSize:
    """The FabricSize of a built graph (`estimate_fabric_size` gives it for a cluster without building): path
    lengths from leaf 0 to the last leaf and to the next one, the pod as the nodes within two switch hops of
    leaf 0, and the most leaf pairs PXN uses from node 0 to any of a few other nodes."""
    cached = graph._cache.get("fabric_size")
    if isinstance(cached, FabricSize):
        return cached
    leaves = np.flatnonzero(graph.kind == LEAF)
    far = near = 0
    if len(leaves) > 1:
        far = len(spray_paths(graph, leaves[:1], leaves[-1:])[0])
        near = len(spray_paths(graph, leaves[:1], leaves[1:2])[0])
    hops = switch_hops(graph, int(leaves[0])) if len(leaves) else np.zeros(0, dtype=np.int64)
    in_pod = np.zeros(graph.vertices, dtype=bool)
    in_pod[leaves[(hops >= 0) & (hops <= 2)]] = True
    node_leaves = np.where(graph.node_nics >= 0, graph.leaf_of_nic[np.maximum(graph.node_nics, 0)], -1)
    pod_nodes = int(np.count_nonzero(in_pod[node_leaves[:, 0]])) if len(leaves) else graph.nodes
    fanout = 1
    local = np.arange(int(graph.node_gpus[0]))
    for other in sorted({1, 2, graph.nodes // 2, graph.nodes - 1} & set(range(1, graph.nodes))):
        dst = graph.node_first_gpu[other] + local[local < graph.node_gpus[other]]
        relay = relay_gpu(graph, 0, dst)
        pairs = set(zip(graph.leaf_of_nic[graph.nic_of_gpu[relay]].tolist(),
                        graph.leaf_of_nic[graph.nic_of_gpu[dst]].tolist(), strict=True))
        fanout = max(fanout, len(pairs))
    size = FabricSize(graph.links, len(leaves), len(graph.switch_vertices()), far, near, max(1, pod_nodes), fanout,
                      int(graph.node_gpus.max(initial=1)))
    graph._cache["fabric_size"] = size
    return size
