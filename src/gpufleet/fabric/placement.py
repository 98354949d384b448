"""Where a communication group's ranks land: how many share a node, how many nodes and leaves it spans.

Ranks are numbered in the layout's order (Megatron: tp fastest, then cp, dp, pp; expert groups are
carved out as tp-ep-…) and filled into nodes in block order. `scatter` placement models a scheduler
that ignored topology: a group's nodes land on different leaves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from gpufleet.fabric.topology import Cluster
from gpufleet.parallel.layout import Layout, expert_parallel_degrees

GroupKind = Literal["tp", "cp", "dp", "dp_cp", "ep", "pp", "edp", "etp"]
Placement = Literal["block", "scatter"]


@dataclass(frozen=True, slots=True)
class GroupSpan:
    """One communication group as placed: its size and how it spreads over nodes and leaves."""

    size: int
    per_node: int  # members of the group that share a node (and its NICs)
    nodes: int  # nodes the group spans
    nodes_per_leaf: int  # of the group's nodes, how many share one leaf switch
    leaves: int  # leaf switches the group spans
    contiguous: bool = True  # consecutive ranks' nodes share a leaf (block); False: they alternate (scatter)
    #: scatter only: ring hops that leave (and enter) the busiest leaf, min(c, nodes - c) for its c nodes
    crossing_nodes_per_leaf: int = 0
    #: scatter only: NCCL double-binary-tree traffic that leaves the busiest leaf, in ring-hop units
    tree_crossing_nodes_per_leaf: float = 0.0

    @property
    def intra_node(self) -> bool:
        return self.nodes == 1


def _degree(layout: Layout, dim: str) -> int:
    return int(getattr(layout, dim))


def group_stride_and_size(layout: Layout, kind: GroupKind) -> tuple[int, int]:
    """Rank stride between consecutive members and the group size, in the layout's rank order."""
    if kind in ("etp", "ep", "edp"):  # expert ranks are ordered etp fastest, then ep, then edp (Megatron-Core)
        etp, edp = expert_parallel_degrees(layout)
        return {"etp": (1, etp), "ep": (etp, layout.ep), "edp": (etp * layout.ep, edp)}[kind]
    dense_order = [d for d in layout.order if d != "ep"]
    if kind == "dp_cp":
        stride = 1
        for dim in dense_order:
            if dim in ("cp", "dp"):
                break
            stride *= _degree(layout, dim)
        return stride, layout.dp * layout.cp
    stride = 1
    for dim in dense_order:
        if dim == kind:
            return stride, _degree(layout, dim)
        stride *= _degree(layout, dim)
    raise ValueError(f"unknown group kind {kind}")


def group_span(layout: Layout, kind: GroupKind, cluster: Cluster, placement: Placement = "block") -> GroupSpan:
    """How the `kind` group of `layout` lands on `cluster`."""
    stride, size = group_stride_and_size(layout, kind)
    gpus_per_node = cluster.gpus_per_node
    if size <= 1:
        return GroupSpan(size=1, per_node=1, nodes=1, nodes_per_leaf=1, leaves=1)
    return _placed(stride, size, gpus_per_node, cluster.num_nodes, cluster.nodes_per_leaf, placement)


@lru_cache(maxsize=4096)
def _placed(stride: int, size: int, gpus_per_node: int, num_nodes: int, leaf_nodes: int,
            placement: Placement) -> GroupSpan:
    """group_span of a group of `size` ranks `stride` apart, from the numbers of the cluster it depends on (a
    search asks for the same few spans thousands of times)."""
    if stride >= gpus_per_node:
        per_node = 1
        node_stride = stride // gpus_per_node
    else:
        per_node = min(size, max(1, gpus_per_node // stride))
        node_stride = 1
    return _span(size, per_node, math.ceil(size / per_node), num_nodes, leaf_nodes, placement, node_stride)


def leaf_capacities(cluster: Cluster) -> list[int]:
    """Nodes under each leaf as the cluster is cabled: full leaves in node order, the last one holds the rest."""
    return _leaf_capacities(cluster.num_nodes, cluster.nodes_per_leaf)


def _leaf_capacities(num_nodes: int, leaf_nodes: int) -> list[int]:
    full, rest = divmod(num_nodes, leaf_nodes)
    return [leaf_nodes] * full + ([rest] if rest else [])


def _dealt_over_leaves(nodes: int, capacities: list[int]) -> list[int]:
    """Nodes per leaf when a topology-blind scheduler deals `nodes` out to the leaves in turn."""
    counts: list[int] = []
    remaining = nodes
    ordered = sorted(capacities)
    for index, capacity in enumerate(ordered):
        take = min(capacity, math.ceil(remaining / (len(ordered) - index)))
        if take > 0:
            counts.append(take)
        remaining -= take
    return counts


@lru_cache(maxsize=256)
def _scattered_tree_crossing(counts: tuple[int, ...]) -> float:
    """Tree traffic leaving the busiest leaf when nodes are dealt out to leaves in turn (`counts` each)."""
    import numpy as np  # only scatter placement needs it: `plan` starts without numpy

    from gpufleet.fabric.trees import tree_crossing_node_equivalents

    columns = [[leaf] * count for leaf, count in enumerate(counts)]
    return tree_crossing_node_equivalents(np.asarray(dealt_in_turn(columns), dtype=np.int64))


def dealt_in_turn(columns: Sequence[Sequence[int]]) -> list[int]:
    """Scatter order: the first item of every column, then the second of each, ... (columns may differ in
    length). The simulator deals node ids this way; the analytical model deals leaf labels."""
    width = max((len(column) for column in columns), default=0)
    return [int(column[i]) for i in range(width) for column in columns if i < len(column)]


def span_over_nodes(size: int, per_node: int, nodes: int, cluster: Cluster, placement: Placement = "block",
                    node_stride: int = 1) -> GroupSpan:
    """The span of a group of `size` ranks, `per_node` on each of `nodes` nodes (every `node_stride`-th).

    Block: nodes in order, so a leaf holds as many of the group's nodes as fit under it. Scatter: a
    scheduler that ignored topology deals the nodes out to the cluster's leaves in turn, so ring
    neighbours sit under different leaves; `crossing_nodes_per_leaf` counts the hops that leave the
    busiest leaf (all of its nodes' hops, unless the other leaves run out of nodes first).
    """
    return _span(size, per_node, nodes, cluster.num_nodes, cluster.nodes_per_leaf, placement, node_stride)


def _span(size: int, per_node: int, nodes: int, num_nodes: int, leaf_nodes: int, placement: Placement,
          node_stride: int) -> GroupSpan:
    """span_over_nodes on a cluster of `num_nodes` nodes, `leaf_nodes` under each leaf."""
    if nodes == 1:
        return GroupSpan(size, per_node, 1, 1, 1)
    if placement == "scatter":
        counts = _dealt_over_leaves(nodes, _leaf_capacities(num_nodes, leaf_nodes))
        if len(counts) > 1:
            crossing = max(min(count, nodes - count) for count in counts)
            return GroupSpan(size, per_node, nodes, max(counts), len(counts), contiguous=False,
                             crossing_nodes_per_leaf=crossing,
                             tree_crossing_nodes_per_leaf=_scattered_tree_crossing(tuple(counts)))
    group_nodes_per_leaf = max(1, min(nodes, leaf_nodes // node_stride))
    leaves = math.ceil(nodes / group_nodes_per_leaf)
    return GroupSpan(size, per_node, nodes, group_nodes_per_leaf, leaves)
