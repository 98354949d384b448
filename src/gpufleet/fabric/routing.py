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
rate that crosses the link (1 for ECMP; fractions that sum to 1 per tier for spray).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from gpufleet.errors import InputError
from gpufleet.fabric.graph import LEAF, FabricGraph, FloatArray, IntArray

RoutingMode = Literal["ecmp", "spray"]
ROUTING_MODES: tuple[RoutingMode, ...] = ("ecmp", "spray")


@dataclass(frozen=True)
class Routes:
    """Flows as a sparse incidence over links, with each flow's one-way latency."""

    flows: int
    link: IntArray
    flow: IntArray
    weight: FloatArray
    latency_s: FloatArray  # per flow: endpoint + switch hops, or one scale-up step


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
        adjacency = csr_matrix((np.ones(len(links)), (tail, head)), shape=(len(switches), len(switches)))
        dist = shortest_path(adjacency, directed=True, unweighted=True, indices=leaf_rows)  # from leaves
        # links are symmetric, so distance from a leaf equals distance to it
        hops = np.where(np.isfinite(dist), dist, -1).astype(np.int64).T
    else:
        hops = np.zeros((len(switches), len(leaf_rows)), dtype=np.int64)
    tables = _SwitchTables(index_of, out_ptr, links, head, leaf_rows, leaf_pos, hops)
    graph._cache["switch_tables"] = tables
    return tables


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
                    dst: IntArray, mode: RoutingMode, seed: int) -> tuple[IntArray, IntArray, FloatArray, FloatArray]:
    """Links (and per-flow latency) from leaf vertex `start` to leaf vertex `goal` for each unit."""
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
    while len(cur):
        degree = t.out_ptr[cur + 1] - t.out_ptr[cur]
        owner = np.repeat(np.arange(len(cur)), degree)
        offsets = np.arange(len(owner)) - np.repeat(np.cumsum(degree) - degree, degree)
        cand = t.out_ptr[cur][owner] + offsets
        head = t.out_head[cand]
        good = t.hops[head, goal_col[owner]] == t.hops[cur[owner], goal_col[owner]] - 1
        owner, cand, head = owner[good], cand[good], head[good]
        count = np.bincount(owner, minlength=len(cur))
        if mode == "ecmp":
            first = np.cumsum(count) - count
            pick = _hash(unit_src, unit_dst, graph.switch_vertices()[cur], np.int64(seed)) % np.maximum(count, 1)
            chosen = first + pick
            owner, cand, head = owner[chosen], cand[chosen], head[chosen]
            new_weight = weight
        else:
            new_weight = weight[owner] / count[owner]
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


def route(graph: FabricGraph, src: IntArray, dst: IntArray, mode: RoutingMode = "ecmp", seed: int = 0) -> Routes:
    """Routes for flows src[i] -> dst[i] (GPU ids; src != dst)."""
    if mode not in ROUTING_MODES:
        raise InputError(f"routing {mode!r} is not one of {', '.join(ROUTING_MODES)}")
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    flows = len(src)
    ids = np.arange(flows, dtype=np.int64)
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
        relay = graph.node_first_gpu[src_node] + np.minimum(graph.local_of_gpu[d], graph.node_gpus[src_node] - 1)
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
        link, owner, weight, lat = _between_leaves(graph, f[cross], start[cross], goal[cross], s[cross], d[cross],
                                                   mode, seed)
        links.append(link)
        owners.append(owner)
        weights.append(weight)
        latency[f] = graph.endpoint_latency_s[s] + graph.latency_s[graph.edge_nic_leaf[rail_nic]]
        latency[f[cross]] += lat
    return Routes(flows, np.concatenate(links), np.concatenate(owners), np.concatenate(weights), latency)
