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

Scale. Flows between the same two leaves share one spray path (routing.py), kept once in a factored
incidence (`Incidence`); progressive filling is incremental (`max_min_rates`); all-to-all phases are
built one at a time. Together that took a 1,024-GPU all-to-all from 57 s and 4.5 GB to under a second,
and a 65,536-GPU all-reduce or send-recv (the three-tier NDR fat tree's maximum) from an out-of-memory
kill to a few seconds and ~1 GiB; results are unchanged (to float rounding, tests compare). What is left
grows with flows x phases and, under ECMP, with rounds x links: `estimate_work` prices a simulation by
arithmetic before anything is built, and `check_work` refuses, in one line, one estimated over
MAX_SIM_SECONDS (about a minute) or MAX_SIM_BYTES (2 GiB) on 2 cores. With DGX H100 nodes on a 1:1 fat
tree that allows every collective up to 65,536 GPUs on NDR400 (spray) except all-to-all (8,192), and on
RoCE (ECMP) all-to-all up to 2,048 and all-reduce up to 32,768; benchmarks/bench_fabric.py runs the
largest allowed per collective. `plan --fabric-model sim` goes through the same check.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from gpufleet.errors import InputError
from gpufleet.fabric.collectives import OPS, Op, bus_factor
from gpufleet.fabric.graph import (
    LEAF,
    TIERS,
    FabricGraph,
    FabricSize,
    FloatArray,
    IntArray,
    build_graph,
    estimate_fabric_size,
)
from gpufleet.fabric.placement import GroupSpan, Placement, dealt_in_turn
from gpufleet.fabric.routing import RoutingMode, relay_gpu, route, spans, spray_paths, switch_hops
from gpufleet.fabric.topology import Cluster
from gpufleet.fabric.trees import double_binary_tree

if TYPE_CHECKING:
    from scipy.sparse import csr_matrix

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


def _distinct(ids: IntArray, size: int) -> IntArray:
    """The distinct values of `ids` (all below `size`), ascending: a mask when there are many, else a sort."""
    if len(ids) * 8 < size:
        return np.unique(ids)
    mark = np.zeros(size, dtype=bool)
    mark[ids] = True
    return np.flatnonzero(mark)


def _ranges(indptr: IntArray, rows: IntArray) -> IntArray:
    """Positions, in a CSR's indices/data, of the entries of `rows` (concatenated, in row order)."""
    return spans(indptr[rows], indptr[rows + 1] - indptr[rows])


class Incidence:
    """A links x flows incidence A = F + S·P: each flow's own entries F (links x flows), plus the shared
    paths S (links x paths) that P assigns flows to (`path_of_flow`, -1 for none). Flows on one path
    share its weighted links; keeping them once per path instead of once per flow is what lets a
    three-tier spray fabric (~2,000 links a path) be simulated at scale. Sums over flows are exact;
    only the order of floating-point additions differs from the expanded matrix."""

    def __init__(self, own: csr_matrix, shared: csr_matrix | None = None, path_of_flow: IntArray | None = None):
        from scipy.sparse import csr_matrix  # imported when a collective is simulated, not by `gpufleet --help`

        own = csr_matrix(own)
        own.sum_duplicates()
        self.shape: tuple[int, int] = own.shape
        self.by_link = own  # links x flows
        self.by_flow = own.T.tocsr()  # flows x links
        flows = self.shape[1]
        self.shared: csr_matrix | None = None
        self.path_of_flow = np.full(flows, -1, dtype=np.int64) if path_of_flow is None else path_of_flow
        if shared is not None and shared.shape[1] > 0:
            shared = csr_matrix(shared)
            shared.sum_duplicates()
            self.shared = shared  # links x paths
            self.shared_by_path = shared.T.tocsr()  # paths x links
            on_path = np.flatnonzero(self.path_of_flow >= 0)
            order = np.argsort(self.path_of_flow[on_path], kind="stable")
            self.flows_of_path = on_path[order]  # flows grouped by path (CSR over paths)
            counts = np.bincount(self.path_of_flow[on_path], minlength=shared.shape[1])
            self.path_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def entries_of(self, flows: IntArray) -> tuple[IntArray, FloatArray, IntArray]:
        """The entries of `flows` (distinct flow ids): link, summed weight and number of those flows, per entry
        (a link may appear in several entries)."""
        at = _ranges(self.by_flow.indptr, flows)
        where, weight = self.by_flow.indices[at], self.by_flow.data[at]
        times = np.ones(len(at), dtype=np.int64)
        if self.shared is None:
            return where, weight, times
        path = self.path_of_flow[flows]
        per_path = np.bincount(path[path >= 0], minlength=self.shared.shape[1])
        touched = np.flatnonzero(per_path)
        at = _ranges(self.shared_by_path.indptr, touched)
        repeat = np.repeat(per_path[touched], np.diff(self.shared_by_path.indptr)[touched])
        return (np.concatenate([where, self.shared_by_path.indices[at]]),
                np.concatenate([weight, self.shared_by_path.data[at] * repeat]), np.concatenate([times, repeat]))

    def flows_on(self, links: IntArray) -> IntArray:
        """Flows that cross any of `links`, ascending."""
        found = self.by_link.indices[_ranges(self.by_link.indptr, links)]
        if self.shared is not None:
            paths = _distinct(self.shared.indices[_ranges(self.shared.indptr, links)], self.shared.shape[1])
            found = np.concatenate([found, self.flows_of_path[_ranges(self.path_ptr, paths)]])
        return _distinct(found, self.shape[1])


def max_min_rates(incidence: csr_matrix | Incidence, capacity: FloatArray, tolerance: float = 1e-9
                  ) -> tuple[FloatArray, list[tuple[IntArray, float]]]:
    """Max-min fair rates by progressive filling.

    `incidence` is links x flows with the fraction of each flow on each link. All unfrozen flows rise
    together until a link fills; the flows on it freeze. Returns the rates and, per round, the links
    that filled and the rate their flows froze at.

    Incremental: the unfrozen flows all sit at the current level, so link l fills when the level reaches
    fill[l] = (capacity - what its frozen flows hold) / (weight of its unfrozen flows), and counts as full
    (within `tolerance` of its capacity) from full_at[l] = fill[l] - tolerance·capacity / weight. Both
    change only when some of the link's flows freeze, so a round updates the links that its frozen flows
    cross. Each flow's entries are visited once: the cost is the incidence's size plus rounds x (two
    vector passes over the links), not rounds x the incidence (a collective over ECMP's colliding paths
    takes thousands of rounds).
    """
    a = incidence if isinstance(incidence, Incidence) else Incidence(incidence)
    links, flows = a.shape
    rate = np.zeros(flows)
    active = np.ones(flows, dtype=bool)
    frozen_rounds: list[tuple[IntArray, float]] = []
    level = 0.0
    where, weight, times = a.entries_of(np.arange(flows, dtype=np.int64))
    load = np.bincount(where, weights=weight, minlength=links)  # weight of the unfrozen flows, per link
    count = np.bincount(where, weights=times, minlength=links).astype(np.int64)  # and their number
    held = np.zeros(links)  # capacity the frozen flows hold
    usable = capacity - tolerance * np.maximum(capacity, 1.0)
    fill = np.full(links, math.inf)  # level at which each link fills (inf: no unfrozen flow on it)
    full_at = np.full(links, math.inf)  # level from which it counts as full
    remaining = flows

    def refresh(touched: IntArray) -> None:
        busy = (count[touched] > 0) & (load[touched] > 1e-15)
        on, off = touched[busy], touched[~busy]
        fill[off] = full_at[off] = math.inf
        fill[on] = (capacity[on] - held[on]) / load[on]
        full_at[on] = (usable[on] - held[on]) / load[on]

    refresh(np.arange(links, dtype=np.int64))
    while remaining:
        tightest = int(np.argmin(fill))
        if not math.isfinite(fill[tightest]):  # flows on no link at all (cannot happen for real routes)
            rate[active] = math.inf
            break
        level = max(level, float(fill[tightest]))
        full_links = np.flatnonzero(full_at <= level)
        frozen_rounds.append((full_links, level))
        newly = a.flows_on(full_links)
        newly = newly[active[newly]]
        if not len(newly):  # numerical safety: freeze the flows of the tightest link
            newly = a.flows_on(np.array([tightest], dtype=np.int64))
            newly = newly[active[newly]]
        rate[newly] = level
        active[newly] = False
        remaining -= len(newly)
        where, weight, times = a.entries_of(newly)
        np.add.at(held, where, level * weight)
        np.subtract.at(load, where, weight)
        np.subtract.at(count, where, times)
        refresh(_distinct(np.concatenate([where, full_links]), links))
    return rate, frozen_rounds


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


def _pairwise_plan(n: int) -> list[tuple[IntArray, float]]:
    """The shifts of each all-to-all phase that is solved over n ranks, and how many phases each stands for."""
    per_phase = max(1, MAX_CONCURRENT_FLOWS // n)  # shifts posted together (NCCL groups every peer)
    starts = range(1, n, per_phase)
    picked: Sequence[int] = range(len(starts))
    weight = 1.0
    if len(starts) > MAX_ALL_TO_ALL_STEPS:  # only the picked phases are built: cheap for a million ranks too
        picked = np.unique(np.linspace(0, len(starts) - 1, MAX_ALL_TO_ALL_STEPS).round().astype(np.int64)).tolist()
        weight = len(starts) / len(picked)
    return [(np.arange(starts[i], min(n, starts[i] + per_phase)), weight) for i in picked]


def _pairwise_phase(size: float, ranks: IntArray, shifts: IntArray, weight: float) -> Phase:
    n = len(ranks)
    src = np.tile(ranks, len(shifts))
    dst = np.concatenate([np.roll(ranks, -int(shift)) for shift in shifts])
    return Phase(f"all-to-all shifts {shifts[0]}-{shifts[-1]}", src, dst, np.full(len(src), size / n),
                 weight, weight * len(shifts))


def _pairwise(size: float, ranks: IntArray) -> list[Phase]:
    return [_pairwise_phase(size, ranks, shifts, weight) for shifts, weight in _pairwise_plan(len(ranks))]


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


def _together(same: Sequence[Phase]) -> Phase:
    """One phase of every group, run at the same time."""
    return Phase(same[0].name, np.concatenate([p.src for p in same]), np.concatenate([p.dst for p in same]),
                 np.concatenate([p.bytes_per_flow for p in same]), same[0].repeat, same[0].latency_steps)


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


# ---------------------------------------------------------------------------------------------------
# What a simulation costs, by arithmetic before anything is built, and the limits it must stay under

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
