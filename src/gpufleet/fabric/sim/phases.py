"""Algorithms, NCCL-style: ranks (GPU ids in rank order) -> the phases of flows a collective runs
(gpufleet.fabric.simulate's docstring describes each algorithm)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gpufleet.errors import InputError
from gpufleet.fabric.collectives import Op
from gpufleet.fabric.graph import (
    FabricGraph,
    IntArray,
)
from gpufleet.fabric.sim.records import (
    MAX_ALL_TO_ALL_STEPS,
    MAX_CONCURRENT_FLOWS,
    Algorithm,
    Phase,
)
from gpufleet.fabric.trees import double_binary_tree


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
