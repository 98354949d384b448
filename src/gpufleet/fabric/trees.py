"""NCCL's double binary tree over a group's nodes (ncclGetBtree / ncclGetDtree), as node positions.

Shared by the flow simulator (which routes every tree edge) and the analytical model (which counts
the edges that leave a leaf when a group's nodes are scattered over leaves).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]


def btree_parent(rank: IntArray, n: int) -> IntArray:
    """Parent of each rank > 0 in NCCL's binary tree; adjacent ranks are close in the tree."""
    bit = rank & -rank
    up = (rank ^ bit) | (bit << 1)
    return np.where(up >= n, rank ^ bit, up)


def double_binary_tree(n: int) -> list[tuple[IntArray, IntArray]]:
    """(child, parent) positions of NCCL's two complementary trees over `n` nodes."""
    rank = np.arange(1, n, dtype=np.int64)
    first = (rank, btree_parent(rank, n))
    if n % 2:  # odd: the second tree is the first shifted by one rank
        second = ((rank + 1) % n, (btree_parent(rank, n) + 1) % n)
    else:  # even: mirrored
        second = (n - 1 - rank, n - 1 - btree_parent(rank, n))
    return [first, second]


def tree_crossing_node_equivalents(leaf_of_position: IntArray) -> float:
    """Tree traffic that leaves the busiest leaf, in units of one node's ring traffic.

    Each tree edge carries S/2 each way per tree; a ring hop carries 2S: an edge is a quarter of a hop.
    """
    leaves = int(leaf_of_position.max(initial=0)) + 1
    counts = np.zeros(leaves, dtype=np.int64)
    for child, parent in double_binary_tree(len(leaf_of_position)):
        crossing = leaf_of_position[child] != leaf_of_position[parent]
        counts += np.bincount(leaf_of_position[child[crossing]], minlength=leaves)
        counts += np.bincount(leaf_of_position[parent[crossing]], minlength=leaves)
    return float(counts.max()) / 4
