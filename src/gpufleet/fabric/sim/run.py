"""Running a simulation: solve each phase over its routes, add the phases up; from a GroupSpan (what the
analytical model takes) to ranks on the cluster's graph."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from gpufleet.errors import InputError
from gpufleet.fabric.collectives import OPS, Op, bus_factor
from gpufleet.fabric.graph import (
    TIERS,
    FabricGraph,
    IntArray,
    build_graph,
    estimate_fabric_size,
)
from gpufleet.fabric.placement import GroupSpan, Placement, dealt_in_turn
from gpufleet.fabric.routing import RoutingMode, route
from gpufleet.fabric.sim.maxmin import Incidence, _distinct, max_min_rates
from gpufleet.fabric.sim.phases import (
    _pairwise_phase,
    _pairwise_plan,
    _together,
    collective_phases,
)
from gpufleet.fabric.sim.records import (
    ALGORITHMS,
    Algorithm,
    Bottleneck,
    Phase,
    PhaseResult,
    SimResult,
)
from gpufleet.fabric.sim.work import (
    check_work,
    estimate_work,
    fabric_size,
    shape_of_ranks,
    shape_of_span,
)
from gpufleet.fabric.topology import Cluster


def _solve(graph: FabricGraph, phase: Phase, routing: RoutingMode, seed: int) -> PhaseResult:
    routes = route(graph, phase.src, phase.dst, routing, seed)
    every = np.concatenate([routes.link, routes.path_link])
    used = _distinct(every, graph.links)
    column_of = np.zeros(graph.links, dtype=np.int64)
    column_of[used] = np.arange(len(used))
    column = column_of[every]
    from scipy.sparse import csr_matrix

    own = csr_matrix((routes.weight, (column[: len(routes.link)], routes.flow)), shape=(len(used), routes.flows))
    shared = csr_matrix((routes.path_weight, (column[len(routes.link):], routes.path)),
                        shape=(len(used), routes.paths))
    rate, rounds = max_min_rates(Incidence(own, shared, routes.path_of_flow), graph.capacity_bytes_per_s[used])
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
    shape = shape_of_ranks(graph, groups)
    check_work(estimate_work(op, algorithm, routing, shape, fabric_size(graph)))
    if op == "all-reduce" and algorithm == "auto" and shape.nodes > 1:
        candidates = [simulate_ranks(graph, op, message_bytes, groups, algorithm=a, routing=routing, seed=seed)
                      for a in ("ring", "tree")]
        return min(candidates, key=lambda r: r.time_s)
    same_phases: Iterable[Sequence[Phase]]
    if op == "all-to-all" and algorithm in ("pairwise", "auto"):  # built phase by phase: up to 128 of them
        same_phases = ([_pairwise_phase(message_bytes, row, shifts, weight) for row in groups]
                       for shifts, weight in _pairwise_plan(n))
    else:
        same_phases = zip(*[collective_phases(graph, op, message_bytes, row, algorithm) for row in groups],
                          strict=True)
    results = tuple(_solve(graph, _together(same), routing, seed) for same in same_phases)
    time_s = sum(r.bandwidth_s + r.latency_s for r in results)
    name = algorithm if algorithm != "auto" else {"all-to-all": "pairwise", "send-recv": "direct"}.get(op, "ring")
    bus = message_bytes * bus_factor(op, n) / time_s if time_s > 0 else math.inf
    return SimResult(op, name, routing, message_bytes, n, time_s, bus, results)



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
    mode = routing if routing is not None else default_routing(cluster)
    if graph is None and isinstance(span_or_ranks, GroupSpan | int | np.integer):  # refused before it is built
        span = span_or_ranks if isinstance(span_or_ranks, GroupSpan) else int(span_or_ranks)
        check_work(estimate_work(op, algorithm, mode, shape_of_span(cluster, span, siblings),
                                 estimate_fabric_size(cluster)))
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
    return simulate_ranks(graph, op, message_bytes, ranks, algorithm=algorithm, routing=mode, seed=seed)


def default_routing(cluster: Cluster) -> RoutingMode:
    """InfiniBand fabrics spread load (adaptive routing on Quantum switches): `spray`; Ethernet: `ecmp`."""
    return "spray" if cluster.fabric.network.kind == "infiniband" else "ecmp"
