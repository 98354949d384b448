"""Flow-level simulation of collectives on an explicit topology.

A collective is a list of phases; a phase is a set of GPU-to-GPU flows that run together and repeat
`repeat` times (the steps of a ring all move equal chunks over the same pairs, so one solve serves
them all). Flows share links by max-min fairness (progressive filling, vectorized over a sparse
link x flow incidence); a step ends when its slowest flow ends, plus the largest one-way latency of
its flows. Algorithms, NCCL-style:

* ring (all-reduce, all-gather, reduce-scatter, broadcast): one ring per NIC used by the group on a
  node (NCCL channels); channel c enters each node at the member on NIC c, walks the node's members
  over the scale-up links and leaves through NIC c again (PXN), so each NIC carries one channel each way.
  Inside an AMD mesh, rings of stride 1..k-1 run together (RCCL spreads rings over the mesh's links).
  All-reduce: 2(n-1) steps of S/(n·C) per flow; all-gather / reduce-scatter: n-1 steps.
* tree (all-reduce): NCCL's double binary tree over nodes, a chain inside each node, every channel
  and both trees pipelined at once: each tree carries half the buffer up (reduce) and down (broadcast).
* hierarchical (all-reduce): reduce-scatter inside nodes, k rings across nodes (one per local index,
  on S/k), all-gather inside nodes.
* pairwise (all-to-all): in shift s rank i sends S/n to rank i+s; NCCL posts every peer in one
  group, so shifts run together, as many as keep a phase under 65,536 flows (larger groups run in
  consecutive phases; at most 128 phases are solved, evenly spaced, and scaled). Each peer still
  costs one message latency (n-1 in all), as in the analytical model: NCCL's proxy posts them in turn.
* send-recv: rank i sends S to rank i + n/2 for the first half, all at once.

`auto` picks the faster of ring and tree for all-reduce, as NCCL's tuner does.
Bus bandwidth follows nccl-tests (collectives.bus_factor), so it compares with the analytical model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.sparse import csr_matrix

from gpufleet.errors import InputError
from gpufleet.fabric.collectives import OPS, Op, bus_factor
from gpufleet.fabric.graph import TIERS, FabricGraph, FloatArray, IntArray, build_graph
from gpufleet.fabric.placement import GroupSpan, Placement, dealt_in_turn
from gpufleet.fabric.routing import RoutingMode, route
from gpufleet.fabric.topology import Cluster
from gpufleet.fabric.trees import double_binary_tree

Algorithm = Literal["auto", "ring", "tree", "hierarchical", "pairwise", "direct"]
ALGORITHMS: tuple[Algorithm, ...] = ("auto", "ring", "tree", "hierarchical", "pairwise", "direct")
#: All-to-all phases actually solved; the rest are represented by these (evenly spaced) ones.
MAX_ALL_TO_ALL_STEPS = 128
#: Flows of one all-to-all phase: up to this many, every shift runs at once (NCCL posts all peers).
MAX_CONCURRENT_FLOWS = 65536


@dataclass(frozen=True)
class Phase:
    """Flows that run together, `repeat` times; `latency_steps` one-way latencies are paid in all."""

    name: str
    src: IntArray
    dst: IntArray
    bytes_per_flow: FloatArray
    repeat: float
    latency_steps: float


@dataclass(frozen=True, slots=True)
class Bottleneck:
    """A tier of links that saturated first, in words and numbers."""

    tier: str
    links: int  # saturated links of that tier
    example: str  # one of them, named
    fair_share_bytes_per_s: float  # rate of the flows it held back


@dataclass(frozen=True, slots=True)
class PhaseResult:
    name: str
    flows: int
    repeat: float
    bandwidth_s: float  # all repeats
    latency_s: float
    bottlenecks: tuple[Bottleneck, ...]


@dataclass(frozen=True, slots=True)
class SimResult:
    """One simulated collective: time, bandwidths (nccl-tests conventions) and what held it back."""

    op: Op
    algorithm: str
    routing: str
    message_bytes: float
    ranks: int
    time_s: float
    bus_bytes_per_s: float  # bus bandwidth including latency, as nccl-tests reports it
    phases: tuple[PhaseResult, ...]

    @property
    def algbw_bytes_per_s(self) -> float:
        return self.message_bytes / self.time_s if self.time_s > 0 else math.inf

    @property
    def bottlenecks(self) -> tuple[Bottleneck, ...]:
        """Bottlenecks of the phase that took longest."""
        if not self.phases:
            return ()
        return max(self.phases, key=lambda p: p.bandwidth_s + p.latency_s).bottlenecks


def max_min_rates(incidence: csr_matrix, capacity: FloatArray, tolerance: float = 1e-9
                  ) -> tuple[FloatArray, list[tuple[IntArray, float]]]:
    """Max-min fair rates by progressive filling.

    `incidence` is links x flows with the fraction of each flow on each link. All unfrozen flows rise
    together until a link fills; the flows on it freeze. Returns the rates and, per round, the links
    that filled and the rate their flows froze at.
    """
    _links, flows = incidence.shape
    rate = np.zeros(flows)
    active = np.ones(flows, dtype=bool)
    transposed = incidence.T.tocsr()
    frozen_rounds: list[tuple[IntArray, float]] = []
    level = 0.0
    on_link = np.asarray(incidence.sum(axis=1)).ravel() > 0
    while active.any():
        load = incidence @ active.astype(float)
        used = incidence @ rate
        room = capacity - used
        live = load > 1e-15
        if not live.any():  # flows on no link at all (cannot happen for real routes)
            rate[active] = math.inf
            break
        increment = float(np.min(room[live] / load[live]))
        increment = max(increment, 0.0)
        rate[active] += increment
        level += increment
        full = live & (room - increment * load <= tolerance * np.maximum(capacity, 1.0))
        full_links = np.flatnonzero(full & on_link)
        frozen_rounds.append((full_links, level))
        hit = (transposed @ full.astype(float)) > 0
        newly = active & hit
        if not newly.any():  # numerical safety: freeze the flows of the tightest link
            tight = np.flatnonzero(live)[np.argmin(room[live] / load[live])]
            newly = active & ((transposed[:, [tight]].toarray().ravel()) > 0)
        active &= ~newly
    return rate, frozen_rounds


def _solve(graph: FabricGraph, phase: Phase, routing: RoutingMode, seed: int) -> PhaseResult:
    routes = route(graph, phase.src, phase.dst, routing, seed)
    used, column = np.unique(routes.link, return_inverse=True)
    incidence = csr_matrix((routes.weight, (column, routes.flow)), shape=(len(used), routes.flows))
    incidence.sum_duplicates()
    rate, rounds = max_min_rates(incidence, graph.capacity_bytes_per_s[used])
    per_step = float(np.max(phase.bytes_per_flow / rate)) if routes.flows else 0.0
    latency = float(np.max(routes.latency_s)) if routes.flows else 0.0
    bottlenecks: list[Bottleneck] = []
    if rounds:
        first, share = rounds[0]
        tiers = graph.tier[used[first]]
        for tier in np.unique(tiers):
            members = used[first][tiers == tier]
            bottlenecks.append(Bottleneck(TIERS[int(tier)], len(members), graph.link_name(int(members[0])), share))
    return PhaseResult(phase.name, routes.flows, phase.repeat, per_step * phase.repeat,
                       latency * phase.latency_steps, tuple(bottlenecks))


# ---------------------------------------------------------------------------------------------------
# Algorithms: ranks (GPU ids in rank order) -> phases


def _by_node(graph: FabricGraph, ranks: IntArray) -> IntArray:
    """Members as a (nodes, k) array, nodes in order of first appearance; error if uneven."""
    nodes = graph.node_of_gpu[ranks]
    order, first = np.unique(nodes, return_index=True)
    node_order = order[np.argsort(first)]
    counts = np.bincount(np.searchsorted(order, nodes), minlength=len(order))
    if len(set(counts.tolist())) != 1:
        raise InputError("every node must hold the same number of the group's ranks")
    position = {int(n): i for i, n in enumerate(node_order)}
    rows = np.array([position[int(n)] for n in nodes])
    members = np.zeros((len(node_order), int(counts[0])), dtype=np.int64)
    fill = np.zeros(len(node_order), dtype=np.int64)
    for rank, row in zip(ranks, rows, strict=True):
        members[row, fill[row]] = rank
        fill[row] += 1
    return members


def _entries(graph: FabricGraph, members: IntArray) -> list[int]:
    """Per channel, the member index whose NIC carries it (one channel per distinct NIC on a node)."""
    nics = graph.nic_of_gpu[members[0]]
    _, first = np.unique(nics, return_index=True)
    return sorted(first.tolist())


def _intra_ring(graph: FabricGraph, members: IntArray) -> tuple[IntArray, IntArray, int]:
    """One step of rings inside every node (strided rings over an AMD mesh): (src, dst, channels)."""
    k = members.shape[1]
    mesh = graph.edge_up[members[0, 0]] < 0 and k > 2
    strides = range(1, k) if mesh else [1]
    position = np.arange(k)
    src = np.concatenate([members[:, position] for _ in strides], axis=1).ravel()
    dst = np.concatenate([members[:, (position + s) % k] for s in strides], axis=1).ravel()
    return src, dst, len(strides)


def _ring_flows(graph: FabricGraph, members: IntArray) -> tuple[IntArray, IntArray, int]:
    """Flows of one ring step with all channels: (src, dst, channels)."""
    if members.shape[0] == 1:
        return _intra_ring(graph, members)
    srcs: list[IntArray] = []
    dsts: list[IntArray] = []
    entries = _entries(graph, members)
    for entry in entries:
        order = np.roll(members, -entry, axis=1)  # channel enters every node at `entry`
        srcs.append(order[:, :-1].ravel())
        dsts.append(order[:, 1:].ravel())
        srcs.append(order[:, -1])
        dsts.append(np.roll(order[:, 0], -1))
    return np.concatenate(srcs), np.concatenate(dsts), len(entries)


def _ring(graph: FabricGraph, op: Op, size: float, members: IntArray) -> list[Phase]:
    n = members.size
    src, dst, channels = _ring_flows(graph, members)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    if op == "broadcast":  # pipelined chain from rank 0: the ring without its closing link
        root = members.ravel()[0]
        keep = dst != root
        return [Phase("ring broadcast", src[keep], dst[keep], np.full(int(keep.sum()), size / channels), 1, n - 1)]
    steps = 2 * (n - 1) if op == "all-reduce" else n - 1
    chunk = size / n / channels
    return [Phase(f"ring {op}", src, dst, np.full(len(src), chunk), steps, steps)]


def _tree(graph: FabricGraph, size: float, members: IntArray) -> list[Phase]:
    m, k = members.shape
    if m == 1:
        return _ring(graph, "all-reduce", size, members)
    srcs: list[IntArray] = []
    dsts: list[IntArray] = []
    entries = _entries(graph, members)
    channels = len(entries)
    trees = double_binary_tree(m)
    for entry in entries:
        order = np.roll(members, -(entry + 1), axis=1)  # chain ends at the member on this channel's NIC
        chain_src, chain_dst = order[:, :-1].ravel(), order[:, 1:].ravel()
        for child, parent in trees:
            child_gpu, parent_gpu = members[child, entry], members[parent, entry]
            srcs += [chain_src, chain_dst, child_gpu, parent_gpu]
            dsts += [chain_dst, chain_src, parent_gpu, child_gpu]
    src, dst = np.concatenate(srcs), np.concatenate(dsts)
    steps = 2 * math.ceil(math.log2(m)) + 2 * (k - 1)
    return [Phase("double binary tree all-reduce", src, dst, np.full(len(src), size / 2 / channels), 1, steps)]


def _hierarchical(graph: FabricGraph, size: float, members: IntArray) -> list[Phase]:
    m, k = members.shape
    phases: list[Phase] = []
    if k > 1:
        src, dst, channels = _intra_ring(graph, members)
        chunk = size / k / channels
        phases.append(Phase("intra-node reduce-scatter", src, dst, np.full(len(src), chunk), k - 1, k - 1))
    if m > 1:
        src = members.ravel()
        dst = np.roll(members, -1, axis=0).ravel()
        steps = 2 * (m - 1)
        phases.append(Phase("inter-node all-reduce", src, dst, np.full(len(src), size / k / m), steps, steps))
    if k > 1:
        first = phases[0]
        phases.append(Phase("intra-node all-gather", first.src, first.dst, first.bytes_per_flow, k - 1, k - 1))
    return phases


def _pairwise(size: float, ranks: IntArray) -> list[Phase]:
    n = len(ranks)
    per_phase = max(1, MAX_CONCURRENT_FLOWS // n)  # shifts posted together (NCCL groups every peer)
    groups = [np.arange(start, min(n, start + per_phase)) for start in range(1, n, per_phase)]
    weight = 1.0
    if len(groups) > MAX_ALL_TO_ALL_STEPS:
        picked = np.unique(np.linspace(0, len(groups) - 1, MAX_ALL_TO_ALL_STEPS).round().astype(np.int64))
        weight = len(groups) / len(picked)
        groups = [groups[int(i)] for i in picked]
    phases = []
    for shifts in groups:
        src = np.tile(ranks, len(shifts))
        dst = np.concatenate([np.roll(ranks, -int(shift)) for shift in shifts])
        phases.append(Phase(f"all-to-all shifts {shifts[0]}-{shifts[-1]}", src, dst, np.full(len(src), size / n),
                            weight, weight * len(shifts)))
    return phases


def _send_recv(size: float, ranks: IntArray) -> list[Phase]:
    n = len(ranks)
    if n % 2:
        raise InputError(f"send-recv pairs rank i with rank i + n/2; {n} ranks is odd")
    half = n // 2
    return [Phase("send-recv", ranks[:half], ranks[half:], np.full(half, size), 1, 1)]


def collective_phases(graph: FabricGraph, op: Op, size: float, ranks: IntArray, algorithm: Algorithm) -> list[Phase]:
    """The phases of `op` over `ranks` with `algorithm` (not `auto`)."""
    if op == "all-to-all":
        if algorithm not in ("pairwise", "auto"):
            raise InputError(f"all-to-all runs as pairwise exchange, not {algorithm}")
        return _pairwise(size, ranks)
    if op == "send-recv":
        if algorithm not in ("direct", "auto"):
            raise InputError(f"send-recv runs as direct transfers, not {algorithm}")
        return _send_recv(size, ranks)
    members = _by_node(graph, ranks)
    if algorithm == "tree":
        if op != "all-reduce":
            raise InputError("the double binary tree is an all-reduce algorithm")
        return _tree(graph, size, members)
    if algorithm == "hierarchical":
        if op != "all-reduce":
            raise InputError("the hierarchical algorithm is an all-reduce algorithm")
        return _hierarchical(graph, size, members)
    if algorithm in ("ring", "auto"):
        return _ring(graph, op, size, members)
    raise InputError(f"algorithm {algorithm!r} does not apply to {op}")


def simulate_ranks(graph: FabricGraph, op: Op, message_bytes: float, ranks: IntArray, *,
                   algorithm: Algorithm = "auto", routing: RoutingMode = "ecmp", seed: int = 0) -> SimResult:
    """Simulate `op` on `message_bytes` (the full buffer per rank, nccl-tests convention) over `ranks`.

    `ranks` is one group (GPU ids in rank order) or a 2-D array of congruent groups that run the same
    collective at the same time (the dp groups of every tp rank do), sharing the links.
    """
    if op not in OPS:
        raise InputError(f"collective {op!r} is not one of {', '.join(OPS)}")
    if algorithm not in ALGORITHMS:
        raise InputError(f"algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    if not message_bytes > 0:
        raise InputError(f"message size must be positive, got {message_bytes}")
    groups = np.atleast_2d(np.asarray(ranks, dtype=np.int64))
    n = groups.shape[1]
    if len(np.unique(groups)) != groups.size or n == 0 or groups.min() < 0 or groups.max() >= graph.gpus:
        raise InputError(f"ranks must be distinct GPU ids below {graph.gpus}")
    if n == 1:
        return SimResult(op, "none", routing, message_bytes, 1, 0.0, math.inf, ())
    if op == "all-reduce" and algorithm == "auto" and len(np.unique(graph.node_of_gpu[groups[0]])) > 1:
        candidates = [simulate_ranks(graph, op, message_bytes, groups, algorithm=a, routing=routing, seed=seed)
                      for a in ("ring", "tree")]
        return min(candidates, key=lambda r: r.time_s)
    per_group = [collective_phases(graph, op, message_bytes, row, algorithm) for row in groups]
    phases = [Phase(same[0].name, np.concatenate([p.src for p in same]), np.concatenate([p.dst for p in same]),
                    np.concatenate([p.bytes_per_flow for p in same]), same[0].repeat, same[0].latency_steps)
              for same in zip(*per_group, strict=True)]
    results = tuple(_solve(graph, phase, routing, seed) for phase in phases)
    time_s = sum(r.bandwidth_s + r.latency_s for r in results)
    name = algorithm if algorithm != "auto" else {"all-to-all": "pairwise", "send-recv": "direct"}.get(op, "ring")
    bus = message_bytes * bus_factor(op, n) / time_s if time_s > 0 else math.inf
    return SimResult(op, name, routing, message_bytes, n, time_s, bus, results)


# ---------------------------------------------------------------------------------------------------
# From a GroupSpan (what the analytical model takes) to ranks on the cluster's graph


def ranks_for_span(graph: FabricGraph, span: GroupSpan, cluster: Cluster, placement: Placement = "block",
                   siblings: bool = True) -> IntArray:
    """GPU ids, in rank order, of a group shaped like `span`.

    `per_node` members per node (spread evenly over the node's GPUs, as a tp-strided group is), on
    `nodes_per_leaf` nodes under each of `leaves` leaves. `block` numbers the nodes leaf by leaf;
    `scatter` deals consecutive ranks' nodes out to the leaves in turn (a scheduler that ignored topology).
    With `siblings`, returns (gpus_per_node / per_node, size): the group and its copies on the other
    GPUs of the same nodes, which run the same collective at the same time in training (the dp groups
    of the other tp ranks), as the analytical model assumes when it shares a leaf's uplinks.
    """
    gpn = cluster.gpus_per_node
    if span.per_node > gpn:
        raise InputError(f"a group with {span.per_node} members per node does not fit {gpn}-GPU nodes")
    stride = gpn // span.per_node
    local = np.arange(span.per_node) * stride
    groups = graph.leaf_group_of_node[: cluster.num_nodes]
    leaf_ids, per_leaf = np.unique(groups, return_counts=True)
    if span.nodes == 1:
        one = graph.node_first_gpu[0] + local
        return np.stack([one + offset for offset in range(stride)]) if siblings else one
    if span.leaves > len(leaf_ids) or span.nodes_per_leaf > int(per_leaf.max()):
        raise InputError(
            f"the group spans {span.leaves} leaves x {span.nodes_per_leaf} nodes; the cluster has "
            f"{len(leaf_ids)} leaves of at most {int(per_leaf.max())} nodes"
        )
    columns: list[IntArray] = []
    remaining = span.nodes
    chosen = leaf_ids[: span.leaves]
    for leaf in chosen:
        under = np.flatnonzero(groups == leaf)
        take = min(span.nodes_per_leaf, remaining, len(under))
        columns.append(under[:take])
        remaining -= take
    for i, leaf in enumerate(chosen):  # leaves with fewer nodes than the span says: fill up the others
        under = np.flatnonzero(groups == leaf)
        extra = min(remaining, len(under) - len(columns[i]))
        if extra > 0:
            columns[i] = under[: len(columns[i]) + extra]
            remaining -= extra
    if remaining > 0:
        raise InputError(f"the cluster cannot place {span.nodes} nodes as {span.leaves} x {span.nodes_per_leaf}")
    if placement == "scatter":
        nodes = dealt_in_turn([column.tolist() for column in columns])
    else:
        nodes = [int(n) for c in columns for n in c]
    first = graph.node_first_gpu[np.asarray(nodes)]
    group = (first[:, None] + local[None, :]).ravel()
    if not siblings:
        return group
    return np.stack([group + offset for offset in range(stride)])


def simulate_collective(op: Op, message_bytes: float, span_or_ranks: GroupSpan | IntArray | list[int] | int,
                        cluster: Cluster, *, placement: Placement = "block", algorithm: Algorithm = "auto",
                        routing: RoutingMode | None = None, seed: int = 0, graph: FabricGraph | None = None,
                        siblings: bool = True) -> SimResult:
    """Simulate one collective on `cluster`'s topology.

    `span_or_ranks`: a GroupSpan (as `placement.group_span` returns for the analytical model), an
    explicit list of GPU ids in rank order, or an int n for the first n GPUs of the cluster (block).
    `message_bytes` is the full buffer per rank (nccl-tests convention, as in `collective_cost`).
    `routing` defaults to `default_routing(cluster)`; `siblings` (GroupSpan only) also runs the copies
    of the group on the nodes' other GPUs, as training does (see `ranks_for_span`).
    """
    graph = graph if graph is not None else build_graph(cluster)
    if isinstance(span_or_ranks, GroupSpan):
        ranks = ranks_for_span(graph, span_or_ranks, cluster, placement, siblings)
    elif isinstance(span_or_ranks, int | np.integer):
        count = int(span_or_ranks)
        if not 1 <= count <= graph.gpus:
            raise InputError(f"group size {count} must be between 1 and the cluster's {graph.gpus} GPUs")
        ranks = np.arange(count, dtype=np.int64)
    else:
        ranks = np.asarray(span_or_ranks, dtype=np.int64)
    mode = routing if routing is not None else default_routing(cluster)
    return simulate_ranks(graph, op, message_bytes, ranks, algorithm=algorithm, routing=mode, seed=seed)


def default_routing(cluster: Cluster) -> RoutingMode:
    """InfiniBand fabrics spread load (adaptive routing on Quantum switches): `spray`; Ethernet: `ecmp`."""
    return "spray" if cluster.fabric.network.kind == "infiniband" else "ecmp"
