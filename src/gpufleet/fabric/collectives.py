"""Analytical (α–β) cost of collectives for a group of ranks as placed on a cluster.

Bandwidth follows nccl-tests' bus-bandwidth conventions: a collective moving a buffer of S bytes
takes S * bus_factor / bus_bandwidth (+ latency), with bus_factor 2(n-1)/n for all-reduce, (n-1)/n
for all-gather, reduce-scatter and all-to-all, 1 for broadcast and send/recv. The bus bandwidth a
group gets is the bottleneck of the links its ring really crosses:

* inside a node: the GPU's scale-up link × its measured achievable fraction (a mesh gives a pair one
  link; a ring over n members of an 8-GPU mesh uses n-1 of the 7 links);
* across nodes: each member on a node drives its own NIC, so a ring with k members per node gets
  k NICs' worth (hierarchical: NVLink inside, NICs between), never more than the scale-up link;
* across leaves: a leaf's uplinks carry 1/oversubscription of its down bandwidth. A ring crosses a
  leaf boundary once per leaf, so a group with m of its nodes under each leaf loads the uplinks
  os/m times their share: it slows down by max(1, os/m). When consecutive ranks' nodes sit under
  different leaves (scatter placement, `GroupSpan.contiguous` False) the hops that leave a leaf, c of
  them, share the uplinks of a full leaf of L nodes: max(1, os·c/L); a tree is charged for the edges
  of NCCL's double binary tree that leave the busiest leaf (`GroupSpan.tree_crossing_nodes_per_leaf`) (the
  flow-level simulator showed the old os/m was optimistic by up to os×). Uniform traffic (all-to-all)
  sends a fraction 1 - m/nodes of its bytes across, slowing by max(1, os · that fraction), in any order.
Latency: α per ring step (scale-up step latency inside a node; NIC + switch hops between nodes);
NCCL picks a tree (2·log2 n steps) when that is faster for an all-reduce.

Measured collectives (a calibration profile's `collectives`, carried by `Cluster.collective_calibration`): for an
op on a tier (scale-up inside a node, the network across nodes) with measurements, each measured point gives the
ratio modelled / measured time of that very group (its ranks and ranks per node, under one leaf) on this cluster;
a collective of that op on that tier takes the model's time divided by the ratio, interpolated linearly in log size
between the points and held at the end points' ratios beyond them. Half the measured bus bandwidth thus doubles the
time; a group or placement unlike the measured one keeps the model's structure (group size, NICs per node, spine
oversubscription) and only the measured efficiency carries over. No measurement for an op and tier: the model alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, cast

from gpufleet.fabric.placement import GroupSpan
from gpufleet.fabric.topology import Cluster

Op = Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast", "send-recv"]
OPS: tuple[Op, ...] = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast", "send-recv")

#: Switch hops a message crosses between two leaves of a two-tier fabric (leaf-spine-leaf).
CROSS_LEAF_HOPS = 3


def bus_factor(op: Op, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: bus bytes per buffer byte."""
    if n <= 1:
        return 0.0
    if op == "all-reduce":
        return 2 * (n - 1) / n
    if op in ("all-gather", "reduce-scatter", "all-to-all"):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True, slots=True)
class CollectiveCost:
    """Time of one collective and what bounded it."""

    op: Op
    message_bytes: float
    group_size: int
    time_s: float
    bus_bytes_per_s: float  # achieved bus bandwidth (nccl-tests convention), latency excluded
    link: str  # the bottleneck link, in words

    @property
    def algbw_bytes_per_s(self) -> float:
        return self.message_bytes / self.time_s if self.time_s > 0 else math.inf


def scale_up_bus_bytes_per_s(cluster: Cluster, members: int, op: Op) -> float:
    """Bus bandwidth inside one scale-up domain for a group of `members` GPUs."""
    scale_up = cluster.scale_up
    line = scale_up.bytes_per_s_per_direction * scale_up.achievable_fraction
    if scale_up.kind == "mesh":
        links = scale_up.links or (cluster.gpus_per_node - 1)
        per_link = line / links
        usable = 1 if op == "send-recv" else min(links, members - 1)
        return per_link * usable
    return line


def _cross_leaf_slowdown(cluster: Cluster, span: GroupSpan, op: Op) -> float:
    if span.leaves <= 1:
        return 1.0
    os = cluster.fabric.oversubscription
    if op == "all-to-all":
        crossing = 1.0 - span.nodes_per_leaf / span.nodes
        return max(1.0, os * crossing)
    if not span.contiguous:  # the hops that leave the busiest leaf share a full leaf's uplinks
        return max(1.0, os * span.crossing_nodes_per_leaf / cluster.nodes_per_leaf)
    return max(1.0, os / span.nodes_per_leaf)


#: Flows of NCCL's double binary tree that leave a contiguous block of nodes, per channel: each tree
#: cuts a block of consecutive ranks on a couple of edges (the link to its parent subtree and part of
#: a sibling link), the two trees together on about 3. A leaf's uplinks carry those flows with
#: 1/oversubscription of the bandwidth its m nodes have below it, so the tree slows by
#: max(1, 3 · os / m). The count is calibrated against the flow simulator (a second method, not a
#: measured run) on evenly cabled two-tier fabrics: tests/test_fabric_sim.py holds the two within
#: 15 % on the oversubscribed grid (measured: 4.7 % worst with 3; 3.5 was fitted when the simulated
#: spines were cabled unevenly, and is 15 % off now).
TREE_BOUNDARY_FLOWS = 3.0


def _tree_cross_leaf_slowdown(cluster: Cluster, span: GroupSpan) -> float:
    if span.leaves <= 1:
        return 1.0
    os = cluster.fabric.oversubscription
    if not span.contiguous:  # ranks alternate leaves: the tree edges that leave the busiest leaf share its uplinks
        return max(1.0, os * span.tree_crossing_nodes_per_leaf / cluster.nodes_per_leaf)
    return max(1.0, TREE_BOUNDARY_FLOWS * os / span.nodes_per_leaf)


#: Most collective costs a cluster remembers (Cluster.collective_memo); past this the memo starts again.
MEMO_ENTRIES = 1 << 16


def collective_cost(op: Op, message_bytes: float, span: GroupSpan, cluster: Cluster) -> CollectiveCost:
    """Time for one `op` over `message_bytes` (the full buffer per rank) on group `span`: the α–β model, scaled by
    the cluster's measured efficiency for this op and tier when it has one (module docstring); remembered per
    cluster (Cluster.collective_memo)."""
    memo = cluster.collective_memo
    key = (op, message_bytes, span)
    found = memo.get(key)
    if found is None:
        if len(memo) >= MEMO_ENTRIES:
            memo.clear()
        found = memo[key] = _calibrated_cost(op, message_bytes, span, cluster)
    return cast(CollectiveCost, found)


def _calibrated_cost(op: Op, message_bytes: float, span: GroupSpan, cluster: Cluster) -> CollectiveCost:
    """The α–β model's cost, divided by the measured efficiency of `op` on this tier at this size, if measured."""
    cost = modeled_cost(op, message_bytes, span, cluster)
    if not cluster.collective_calibration or cost.time_s <= 0:
        return cost
    tier = "scale-up" if span.intra_node else "network"
    curve = _measured_efficiency(op, tier, cluster)
    if curve is None:
        return cost
    log_sizes, ratios = curve
    ratio = _interpolate(math.log(message_bytes), log_sizes, ratios)
    return CollectiveCost(op, message_bytes, cost.group_size, cost.time_s / ratio, cost.bus_bytes_per_s * ratio,
                          f"{cost.link}; measured {ratio:.2f}x the model's bus bandwidth")


@lru_cache(maxsize=256)
def _measured_efficiency(op: Op, tier: str, cluster: Cluster) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """(log sizes, modelled / measured time) of the cluster's measured `op` on `tier`, by size; None unmeasured."""
    points = sorted((p for p in cluster.collective_calibration if p.op == op and p.tier == tier),
                    key=lambda p: p.size_bytes)
    if not points:
        return None
    ratios = []
    for point in points:
        nodes = point.ranks // point.ranks_per_node
        measured_span = GroupSpan(size=point.ranks, per_node=point.ranks_per_node, nodes=nodes, nodes_per_leaf=nodes,
                                  leaves=1)
        ratios.append(modeled_cost(op, point.size_bytes, measured_span, cluster).time_s / point.time_s)
    return tuple(math.log(p.size_bytes) for p in points), tuple(ratios)


def _interpolate(x: float, xs: tuple[float, ...], ys: tuple[float, ...]) -> float:
    """Piecewise-linear y(x) through the points (xs ascending), held at the end values outside them (as
    numpy.interp does; plain Python so that plan does not import numpy)."""
    if x <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys, strict=True), zip(xs[1:], ys[1:], strict=True), strict=False):
        if x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


def modeled_cost(op: Op, message_bytes: float, span: GroupSpan, cluster: Cluster) -> CollectiveCost:
    """The α–β model's time for one `op` over `message_bytes` on group `span`, measurements left out."""
    n = span.size
    if n <= 1 or message_bytes <= 0:
        return CollectiveCost(op, message_bytes, n, 0.0, math.inf, "none (group of one)")
    scale_up_bw = scale_up_bus_bytes_per_s(cluster, span.per_node if not span.intra_node else n, op)
    network = cluster.fabric.network
    network_bw = slowdown = 1.0
    if span.intra_node:
        bus_bw = scale_up_bw
        alpha = cluster.scale_up_step_latency_s  # a catalog judgement
        link = f"{cluster.scale_up.kind} scale-up ({bus_bw / 1e9:.0f} GB/s bus)"
    else:
        nic_bw = cluster.nic_bytes_per_s_per_gpu
        if op == "all-to-all":
            # Every member sends (n - per_node)/n of its buffer over its own NIC.
            remote_fraction = (n - span.per_node) / n
            nic_share = nic_bw / max(remote_fraction / bus_factor(op, n), 1e-12)
            network_bw = nic_share
        else:
            network_bw = nic_bw * (span.per_node if op != "send-recv" else 1)
        slowdown = _cross_leaf_slowdown(cluster, span, op)
        network_bw /= slowdown
        bus_bw = min(network_bw, scale_up_bw) if span.per_node > 1 else network_bw
        alpha = network.endpoint_latency_s + (CROSS_LEAF_HOPS if span.leaves > 1 else 1) * network.hop_latency_s
        where = f"{network.id} NIC" + (f" × {span.per_node}" if span.per_node > 1 and op != "send-recv" else "")
        if slowdown > 1:
            where += f", spine {cluster.fabric.oversubscription:g}:1 (÷{slowdown:.2g})"
        link = f"{where} ({bus_bw / 1e9:.0f} GB/s bus)"
    bandwidth_s = message_bytes * bus_factor(op, n) / bus_bw
    if op == "all-reduce":
        ring_s = bandwidth_s + 2 * (n - 1) * alpha
        if span.intra_node:
            return CollectiveCost(op, message_bytes, n, ring_s, bus_bw, link)
        # NCCL's double binary tree: 2·log2(n) latency steps, but its edges between upper tree levels
        # leave the leaf: with oversubscription it pays more of the spine than a block-placed ring.
        tree_slowdown = _tree_cross_leaf_slowdown(cluster, span)
        tree_bus_bw = network_bw * slowdown / tree_slowdown
        if span.per_node > 1:
            tree_bus_bw = min(tree_bus_bw, scale_up_bw)
        tree_s = message_bytes * bus_factor(op, n) / tree_bus_bw + 2 * math.ceil(math.log2(n)) * alpha
        if tree_s < ring_s:
            return CollectiveCost(op, message_bytes, n, tree_s, tree_bus_bw,
                                  f"{link}, tree" + (f" (spine ÷{tree_slowdown:.2g})" if tree_slowdown > 1 else ""))
        return CollectiveCost(op, message_bytes, n, ring_s, bus_bw, f"{link}, ring")
    if op in ("all-gather", "reduce-scatter", "all-to-all"):
        latency = (n - 1) * alpha
    elif op == "broadcast":
        latency = math.ceil(math.log2(n)) * alpha
    else:
        latency = alpha
    return CollectiveCost(op, message_bytes, n, bandwidth_s + latency, bus_bw, link)
