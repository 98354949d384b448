"""Routes of GPU-to-GPU flows over a FabricGraph: ECMP (one hashed path per flow) or ideal packet spray.

A flow inside a node rides the scale-up domain (GPU -> NVSwitch -> GPU, or the one mesh link of the
pair). A flow between nodes leaves through the NIC on the destination GPU's rail (NCCL's PXN: when the
source GPU drives another NIC, the data first crosses NVLink to the GPU that owns the rail NIC), climbs
from that NIC's leaf along shortest paths to the destination's leaf and comes down its NIC.

Between leaves every switch forwards to a neighbour one hop closer to the destination leaf (hop counts
from a breadth-first search over the switches). `ecmp` picks one such link per (flow, switch) with a
seeded hash of the flow's endpoints, as a switch hashes a 5-tuple: deterministic, and it collides like
real ECMP. `spray` splits every flow evenly over all such links (ideal adaptive routing / packet spray).

The result is a sparse incidence: (link, flow, weight) triples, weight = the fraction of the flow's
rate that crosses the link (1 for ECMP; fractions that sum to 1 per tier for spray). Spray splits a
flow by where it starts and ends (its two leaves), never by its endpoints' hash, so every flow between
the same two leaves takes the same weighted links: those are routed once per leaf pair and kept as a
shared *path* (`Routes.path_*`), which each such flow references (`Routes.path_of_flow`) instead of
carrying its own copy. Results are the same; a three-tier spray path spans ~2,000 links, so per-flow
copies made a 65,536-GPU all-reduce or send-recv need tens of GiB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from gpufleet.errors import InputError
from gpufleet.fabric.graph import LEAF, FabricGraph, FloatArray, IntArray

RoutingMode = Literal["ecmp", "spray"]
ROUTING_MODES: tuple[RoutingMode, ...] = ("ecmp", "spray")


@dataclass(frozen=True)
class Routes:
    """Flows as a sparse incidence over links, with each flow's one-way latency.

    A flow's links are its own entries (`link`, `flow`, `weight`) plus, when `path_of_flow` is not -1,
    every entry of that shared path (`path_link`, `path`, `path_weight`).
    """

    flows: int
    link: IntArray
    flow: IntArray
    weight: FloatArray
    latency_s: FloatArray  # per flow: endpoint + switch hops, or one scale-up step
    path_of_flow: IntArray  # per flow: the shared between-leaf path it takes (spray), -1 if none
    path_link: IntArray
    path: IntArray
    path_weight: FloatArray

    @property
    def paths(self) -> int:
        return int(self.path_of_flow.max(initial=-1)) + 1


@dataclass(frozen=True)
class _SwitchTables:
    index_of: IntArray  # vertex -> row in the switch tables, -1 for non-switches
    out_ptr: IntArray  # CSR over switch rows: outgoing switch-to-switch links
    out_link: IntArray
    out_head: IntArray  # head of each outgoing link, as a switch row
    leaf_rows: IntArray  # switch rows of the leaves
    leaf_pos: IntArray  # switch row -> column in `hops`, -1 if not a leaf
    hops: IntArray  # (switches, leaves): hop count from each switch to each leaf


def _tables(graph: FabricGraph) -> _SwitchTables:
    cached = graph._cache.get("switch_tables")
    if isinstance(cached, _SwitchTables):
        return cached
    switches = graph.switch_vertices()
    index_of = np.full(graph.vertices, -1, dtype=np.int64)
    index_of[switches] = np.arange(len(switches))
    is_switch_link = (index_of[graph.src] >= 0) & (index_of[graph.dst] >= 0)
    links = np.flatnonzero(is_switch_link)
    tail, head = index_of[graph.src[links]], index_of[graph.dst[links]]
    order = np.argsort(tail, kind="stable")
    links, tail, head = links[order], tail[order], head[order]
    out_ptr = np.concatenate([[0], np.cumsum(np.bincount(tail, minlength=len(switches)))]).astype(np.int64)
    leaf_rows = index_of[np.flatnonzero(graph.kind == LEAF)]
    leaf_pos = np.full(len(switches), -1, dtype=np.int64)
    leaf_pos[leaf_rows] = np.arange(len(leaf_rows))
    if len(links):
        from scipy.sparse import csr_matrix  # scipy is imported when a route is built, not by `gpufleet --help`
        from scipy.sparse.csgraph import shortest_path

        adjacency = csr_matrix((np.ones(len(links)), (tail, head)), shape=(len(switches), len(switches)))
        dist = shortest_path(adjacency, directed=True, unweighted=True, indices=leaf_rows)  # from leaves
        # links are symmetric, so distance from a leaf equals distance to it
        hops = np.where(np.isfinite(dist), dist, -1).astype(np.int64).T
    else:
        hops = np.zeros((len(switches), len(leaf_rows)), dtype=np.int64)
    tables = _SwitchTables(index_of, out_ptr, links, head, leaf_rows, leaf_pos, hops)
    graph._cache["switch_tables"] = tables
    return tables


def spans(begin: IntArray, length: IntArray) -> IntArray:
    """begin[0], begin[0]+1, ..., begin[0]+length[0]-1, begin[1], ...: consecutive runs, concatenated."""
    total = int(length.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    return np.arange(total, dtype=np.int64) + np.repeat(begin - (np.cumsum(length) - length), length)


def switch_hops(graph: FabricGraph, leaf: int) -> IntArray:
    """Switch hops from every leaf to leaf vertex `leaf` (-1 where unreachable), in the order of the graph's leaves."""
    t = _tables(graph)
    return t.hops[t.leaf_rows, t.leaf_pos[t.index_of[leaf]]]


def _hash(*parts: IntArray | np.integer) -> IntArray:
    """A deterministic 64-bit mix (splitmix64) of integer arrays."""
    value = np.zeros(np.broadcast(*parts).shape, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for part in parts:
            value = value ^ (np.asarray(part).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15))
            value = (value ^ (value >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            value = (value ^ (value >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            value = value ^ (value >> np.uint64(31))
    return value.astype(np.int64) & np.int64(0x7FFFFFFFFFFFFFFF)


def _between_leaves(graph: FabricGraph, flow: IntArray, start: IntArray, goal: IntArray, src: IntArray,
                    dst: IntArray, mode: RoutingMode, seed: int, peak: list[int] | None = None
                    ) -> tuple[IntArray, IntArray, FloatArray, FloatArray]:
    """Links (and per-flow latency) from leaf vertex `start` to leaf vertex `goal` for each unit.

    `flow` must be increasing. `peak`, if given, gets the largest candidate-link array built (memory)."""
    t = _tables(graph)
    cur = t.index_of[start]
    goal_col = t.leaf_pos[t.index_of[goal]]
    weight = np.ones(len(flow))
    out_links: list[IntArray] = []
    out_flows: list[IntArray] = []
    out_weights: list[FloatArray] = []
    latency = np.zeros(len(flow))
    unit_flow, unit_src, unit_dst = flow, src, dst
    remaining = t.hops[cur, goal_col]
    if np.any(remaining < 0):
        raise InputError("the topology has no path between two of the collective's GPUs")
    active = remaining > 0
    cur, goal_col, weight = cur[active], goal_col[active], weight[active]
    unit_flow, unit_src, unit_dst = unit_flow[active], unit_src[active], unit_dst[active]
    goals = t.hops.shape[1]
    while len(cur):
        # the links one hop closer to the goal depend on (switch, goal) only: found once per distinct pair
        pair_key, pair = np.unique(cur * goals + goal_col, return_inverse=True)
        at, to = pair_key // goals, pair_key % goals
        degree = t.out_ptr[at + 1] - t.out_ptr[at]
        pair_owner = np.repeat(np.arange(len(at)), degree)
        every = spans(t.out_ptr[at], degree)
        good = t.hops[t.out_head[every], to[pair_owner]] == t.hops[at, to][pair_owner] - 1
        good_links = every[good]  # candidates of each (switch, goal), in the switch's link order
        pair_count = np.bincount(pair_owner[good], minlength=len(at))
        pair_first = np.cumsum(pair_count) - pair_count
        count = pair_count[pair]
        if mode == "ecmp":
            pick = _hash(unit_src, unit_dst, graph.switch_vertices()[cur], np.int64(seed)) % np.maximum(count, 1)
            owner = np.arange(len(cur))
            cand = good_links[pair_first[pair] + pick]
            new_weight = weight
        else:
            owner = np.repeat(np.arange(len(cur)), count)
            cand = good_links[spans(pair_first[pair], count)]
            new_weight = weight[owner] / count[owner]
        if peak is not None:
            peak.append(max(len(every), len(cand)))
        head = t.out_head[cand]
        link = t.out_link[cand]
        out_links.append(link)
        out_flows.append(unit_flow[owner])
        out_weights.append(new_weight)
        np.add.at(latency, np.searchsorted(flow, unit_flow[owner]), new_weight * graph.latency_s[link])
        cur = head
        goal_col = goal_col[owner]
        unit_flow, unit_src, unit_dst = unit_flow[owner], unit_src[owner], unit_dst[owner]
        weight = new_weight
        if mode == "spray" and len(cur):  # merge units that reached the same switch
            key = unit_flow * len(t.index_of) + cur
            uniq, inverse = np.unique(key, return_inverse=True)
            merged = np.asarray(np.bincount(inverse, weights=weight), dtype=np.float64)
            first_of = np.zeros(len(uniq), dtype=np.int64)
            first_of[inverse[::-1]] = np.arange(len(inverse))[::-1]
            cur, goal_col = cur[first_of], goal_col[first_of]
            unit_flow, unit_src, unit_dst = unit_flow[first_of], unit_src[first_of], unit_dst[first_of]
            weight = merged
        done = t.hops[cur, goal_col] == 0
        keep = ~done
        cur, goal_col, weight = cur[keep], goal_col[keep], weight[keep]
        unit_flow, unit_src, unit_dst = unit_flow[keep], unit_src[keep], unit_dst[keep]
    if not out_links:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0), latency
    return np.concatenate(out_links), np.concatenate(out_flows), np.concatenate(out_weights), latency


#: Candidate links one batch of spray paths may expand at a hop (int64 arrays of this length, a few at
#: once: ~30 MB each). A 65,536-GPU three-tier path expands ~1,000 at its top: a batch holds thousands of pairs.
SPRAY_BATCH_CANDIDATES = 4_000_000


def spray_paths(graph: FabricGraph, start: IntArray, goal: IntArray
                ) -> tuple[IntArray, IntArray, FloatArray, FloatArray]:
    """Spray routes between leaf pairs start[i] -> goal[i]: entries (link, pair, weight) and per-pair latency.

    Routed in batches sized after the first, so that the candidate arrays stay near SPRAY_BATCH_CANDIDATES.
    """
    pairs = len(start)
    links: list[IntArray] = []
    owners: list[IntArray] = []
    weights: list[FloatArray] = []
    latency = np.zeros(pairs)
    batch, done = 16, 0
    while done < pairs:
        take = np.arange(done, min(pairs, done + batch), dtype=np.int64)
        peak: list[int] = []
        link, owner, weight, lat = _between_leaves(graph, take, start[take], goal[take], take, take, "spray", 0, peak)
        links.append(link)
        owners.append(owner)
        weights.append(weight)
        latency[take] = lat
        done += len(take)
        per_pair = max(peak, default=0) / len(take)
        batch = max(1, int(SPRAY_BATCH_CANDIDATES // max(per_pair, 1.0)))
    if not links:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0), latency
    return np.concatenate(links), np.concatenate(owners), np.concatenate(weights), latency


def relay_gpu(graph: FabricGraph, src_node: IntArray | int, dst: IntArray) -> IntArray:
    """The GPU of `src_node` that relays (PXN) a flow to GPU `dst` on another node: the one on dst's rail (the
    same local index), or the node's last GPU when it has fewer. Element-wise over arrays."""
    return graph.node_first_gpu[src_node] + np.minimum(graph.local_of_gpu[dst], graph.node_gpus[src_node] - 1)


def route(graph: FabricGraph, src: IntArray, dst: IntArray, mode: RoutingMode = "ecmp", seed: int = 0) -> Routes:
    """Routes for flows src[i] -> dst[i] (GPU ids; src != dst)."""
    if mode not in ROUTING_MODES:
        raise InputError(f"routing {mode!r} is not one of {', '.join(ROUTING_MODES)}")
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    flows = len(src)
    ids = np.arange(flows, dtype=np.int64)
    path_of_flow = np.full(flows, -1, dtype=np.int64)
    path_parts: tuple[IntArray, IntArray, FloatArray] = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                                                        np.zeros(0))
    links: list[IntArray] = []
    owners: list[IntArray] = []
    weights: list[FloatArray] = []
    latency = np.zeros(flows)

    def add(link: IntArray, owner: IntArray) -> None:
        links.append(link)
        owners.append(owner)
        weights.append(np.ones(len(link)))

    same = graph.node_of_gpu[src] == graph.node_of_gpu[dst]
    # inside a node
    f = ids[same]
    s, d = src[same], dst[same]
    switched = graph.edge_up[s] >= 0
    add(graph.edge_up[s[switched]], f[switched])
    add(graph.edge_down[d[switched]], f[switched])
    mesh = ~switched
    add(graph.mesh_edge[s[mesh], graph.local_of_gpu[d[mesh]]], f[mesh])
    latency[f] = graph.scale_up_latency_s
    # between nodes: PXN relay to the GPU on the destination's rail, then NIC -> leaf ... leaf -> NIC -> GPU
    f = ids[~same]
    s, d = src[~same], dst[~same]
    if len(f):
        src_node = graph.node_of_gpu[s]
        relay = relay_gpu(graph, src_node, d)
        rail_nic = graph.nic_of_gpu[relay]
        hop = relay != s
        hs, hr, hf = s[hop], relay[hop], f[hop]
        sw = graph.edge_up[hs] >= 0
        add(graph.edge_up[hs[sw]], hf[sw])
        add(graph.edge_down[hr[sw]], hf[sw])
        add(graph.mesh_edge[hs[~sw], graph.local_of_gpu[hr[~sw]]], hf[~sw])
        add(graph.edge_gpu_nic[relay], f)
        add(graph.edge_nic_leaf[rail_nic], f)
        dst_nic = graph.nic_of_gpu[d]
        add(graph.edge_leaf_nic[dst_nic], f)
        add(graph.edge_nic_gpu[d], f)
        start, goal = graph.leaf_of_nic[rail_nic], graph.leaf_of_nic[dst_nic]
        cross = start != goal
        latency[f] = graph.endpoint_latency_s[s] + graph.latency_s[graph.edge_nic_leaf[rail_nic]]
        if mode == "ecmp":  # one hashed path per flow
            link, owner, weight, lat = _between_leaves(graph, f[cross], start[cross], goal[cross], s[cross],
                                                       d[cross], mode, seed)
            links.append(link)
            owners.append(owner)
            weights.append(weight)
            latency[f[cross]] += lat
        else:  # spray: one shared path per pair of leaves
            pair_key, pair_of_cross = np.unique(start[cross] * graph.vertices + goal[cross], return_inverse=True)
            link, pair, weight, lat = spray_paths(graph, pair_key // graph.vertices, pair_key % graph.vertices)
            path_of_flow[f[cross]] = pair_of_cross
            path_parts = (link, pair, weight)
            latency[f[cross]] += lat[pair_of_cross]
    return Routes(flows, np.concatenate(links), np.concatenate(owners), np.concatenate(weights), latency,
                  path_of_flow, *path_parts)
