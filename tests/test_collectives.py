"""Analytical collective costs against hand-derived figures and physical bounds."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.catalog.registry import load_catalog
from gpufleet.fabric.collectives import OPS, bus_factor, collective_cost
from gpufleet.fabric.placement import GroupSpan, group_span
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.parallel.layout import Layout

CATALOG = load_catalog()
H100 = CATALOG.gpu("h100-sxm")
DGX = CATALOG.node("dgx-h100")
NDR = CATALOG.network("ndr400")


def cluster(gpus: int, oversubscription: float = 1.0, nodes_per_leaf: int | None = None) -> Cluster:
    return Cluster(H100, DGX, gpus, Fabric(NDR, oversubscription=oversubscription, nodes_per_leaf=nodes_per_leaf))


def test_bus_factors_follow_nccl_tests() -> None:
    assert bus_factor("all-reduce", 8) == 2 * 7 / 8
    assert bus_factor("all-gather", 8) == 7 / 8
    assert bus_factor("reduce-scatter", 4) == 3 / 4
    assert bus_factor("broadcast", 4) == 1.0


def test_gradient_all_reduce_of_8b_over_two_ndr400_nodes_by_hand() -> None:
    # Llama 3.1 8B: 8.03e9 bf16 gradients, data parallel over 2 nodes x 8 GPUs.
    grad_bytes = 8.03e9 * 2
    two_nodes = cluster(16)
    span = group_span(Layout(dp=16), "dp_cp", two_nodes)
    assert (span.size, span.per_node, span.nodes) == (16, 8, 2)
    # Ring across nodes: 8 NICs of 400 Gb/s at 96 % (nccl-tests: 48 of 50 GB/s per NDR NIC) = 384 GB/s,
    # capped by the NVLink ring inside the node: 450 GB/s x 0.82 (370 GB/s measured) = 369 GB/s.
    bus = min(8 * 400e9 / 8 * 0.96, 450e9 * 0.82)
    expected = grad_bytes * 2 * 15 / 16 / bus  # ~81.6 ms, plus a few microseconds of latency
    cost = collective_cost("all-reduce", grad_bytes, span, two_nodes)
    assert math.isclose(cost.time_s, expected, rel_tol=0.01)
    assert 0.080 < cost.time_s < 0.083


def test_all_to_all_across_two_nodes_by_hand() -> None:
    # 16 ranks, 8 per node: each rank sends half its buffer to the other node over its own NIC.
    message = 1e9
    two_nodes = cluster(16)
    span = GroupSpan(size=16, per_node=8, nodes=2, nodes_per_leaf=2, leaves=1)
    expected = message * 8 / 16 / (400e9 / 8 * 0.96)
    cost = collective_cost("all-to-all", message, span, two_nodes)
    assert math.isclose(cost.time_s, expected, rel_tol=0.01)


def test_tp_group_inside_a_node_rides_nvlink() -> None:
    span = group_span(Layout(tp=8, dp=2), "tp", cluster(16))
    assert span.intra_node
    cost = collective_cost("all-reduce", 1e9, span, cluster(16))
    assert "scale-up" in cost.link
    assert math.isclose(cost.bus_bytes_per_s, 450e9 * 0.82)


def test_mesh_pair_gets_one_link() -> None:
    mi300x = CATALOG.gpu("mi300x")
    node = CATALOG.node_for_gpu("mi300x")
    mesh = Cluster(mi300x, node, 8, Fabric(CATALOG.network(node.default_network)))
    pair = GroupSpan(size=2, per_node=2, nodes=1, nodes_per_leaf=1, leaves=1)
    full = GroupSpan(size=8, per_node=8, nodes=1, nodes_per_leaf=1, leaves=1)
    pair_bw = collective_cost("all-reduce", 1e9, pair, mesh).bus_bytes_per_s
    full_bw = collective_cost("all-reduce", 1e9, full, mesh).bus_bytes_per_s
    links = mi300x.scale_up.links or 7
    assert math.isclose(full_bw / pair_bw, links)


def test_scattered_ring_pays_the_spine_oversubscription() -> None:
    # 4 nodes per leaf; a DP group of one GPU per node over 32 nodes.
    big = cluster(256, oversubscription=4.0, nodes_per_leaf=4)
    block = group_span(Layout(tp=8, dp=32), "dp_cp", big, "block")
    scatter = group_span(Layout(tp=8, dp=32), "dp_cp", big, "scatter")
    t_block = collective_cost("all-reduce", 1e9, block, big).time_s
    t_scatter = collective_cost("all-reduce", 1e9, scatter, big).time_s
    nic = 400e9 / 8 * 0.96
    # Block: 4 of the group's nodes per leaf -> uplinks carry 4:1 / 4 = no slowdown.
    assert math.isclose(t_block, 1e9 * 2 * 31 / 32 / nic, rel_tol=0.02)
    # Scatter: nodes dealt out to the 8 leaves in turn. Every ring hop crosses: the 4 nodes' traffic shares
    # the uplinks of a 4-node leaf at 4:1, a quarter of the NIC rate. NCCL's tree edges span 1, 2, 4, ...
    # positions; only those of span 8 and 16 stay under one leaf, and they all sit under the root's leaf:
    # every other leaf sends all its tree traffic across, so the tree is also 4x slower than the NIC
    # (the flow simulator: ring 0.162 s, tree 0.167 s). NCCL takes the one with less latency.
    alpha = 5e-6 + 3 * 0.3e-6  # endpoint + leaf-spine-leaf hops
    ring = 1e9 * 2 * 31 / 32 / (nic / 4) + 2 * 31 * alpha
    tree = 1e9 * 2 * 31 / 32 / (nic / 4) + 2 * 5 * alpha
    assert math.isclose(t_scatter, min(ring, tree), rel_tol=0.01)
    assert t_scatter > 3 * t_block


@settings(max_examples=200, deadline=None)
@given(
    op=st.sampled_from(OPS),
    message=st.floats(min_value=1e3, max_value=1e11),
    log_nodes=st.integers(min_value=0, max_value=9),
    per_node=st.sampled_from([1, 2, 4, 8]),
    oversubscription=st.sampled_from([1.0, 2.0, 4.0]),
)
def test_no_collective_beats_its_line_rate(op: str, message: float, log_nodes: int, per_node: int,
                                           oversubscription: float) -> None:
    nodes = 2**log_nodes
    gpus = max(8, nodes * 8)
    c = cluster(gpus, oversubscription)
    size = nodes * per_node if op != "send-recv" else 2
    span = GroupSpan(size=size, per_node=min(per_node, size), nodes=max(1, size // per_node),
                     nodes_per_leaf=1, leaves=max(1, size // per_node))
    if size < 2:
        return
    cost = collective_cost(op, message, span, c)  # type: ignore[arg-type]
    nvlink_line = 450e9
    nic_line = 400e9 / 8
    line = nvlink_line if span.nodes == 1 else min(nvlink_line, nic_line * span.per_node)
    if op == "all-to-all" and span.nodes > 1:
        remote = (size - span.per_node) / size
        floor = message * remote / nic_line
    else:
        floor = message * bus_factor(op, size) / line  # type: ignore[arg-type]
    assert cost.time_s >= floor * (1 - 1e-9)


@settings(max_examples=100, deadline=None)
@given(message=st.floats(min_value=1e4, max_value=1e10), log_dp=st.integers(min_value=1, max_value=8))
def test_more_oversubscription_never_speeds_a_collective(message: float, log_dp: int) -> None:
    gpus = 8 * 2**log_dp
    layout = Layout(tp=8, dp=2**log_dp)
    times = []
    for os_ratio in (1.0, 2.0, 4.0, 8.0):
        c = cluster(gpus, os_ratio, nodes_per_leaf=2)
        span = group_span(layout, "dp_cp", c, "scatter")
        times.append(collective_cost("all-reduce", message, span, c).time_s)
    assert times == sorted(times)


def test_a_job_that_does_not_fill_whole_nodes_spreads_evenly() -> None:
    # 256 GB200s on 72-GPU NVL72 racks run as 4 racks of 64 (NVIDIA's own benchmarks); 12 H100s as 2 x 6;
    # each used GPU keeps its NIC. 13 H100s cannot spread evenly over 2 nodes: one-line InputError.
    import pytest

    from gpufleet.errors import InputError
    from gpufleet.fabric.topology import node_as_used

    catalog = load_catalog()
    rack = node_as_used(catalog.node("gb200-nvl72"), 256)
    assert (rack.gpus, rack.nics) == (64, 64)
    cluster = Cluster(catalog.gpu("gb200"), catalog.node("gb200-nvl72"), 256, Fabric(catalog.network("ndr400")))
    assert (cluster.node.gpus, cluster.node.nics, cluster.num_nodes, cluster.gpus_per_node) == (64, 64, 4, 64)
    dgx = catalog.node("dgx-h100")
    assert node_as_used(dgx, 12).gpus == 6 and node_as_used(dgx, 16) is dgx and node_as_used(dgx, 4) is dgx
    with pytest.raises(InputError, match="spread evenly"):
        node_as_used(dgx, 13)
    # the error names the nearest counts that work: 12 = 2 nodes of 6, 14 = 2 of 7; 97 (prime) -> 96 = 12 x 8,
    # 104 = 13 x 8 (98..103 over 13 nodes leave remainders)
    for count, below, above in ((13, 12, 14), (97, 96, 104)):
        with pytest.raises(InputError, match=f"nearest counts that do: {below} or {above}$"):
            node_as_used(dgx, count)
        assert node_as_used(dgx, below) and node_as_used(dgx, above)
    with pytest.raises(InputError, match="spread evenly"):
        Cluster(catalog.gpu("h100-sxm"), dgx, 13, Fabric(catalog.network("ndr400")))


def test_expert_groups_follow_the_expert_tensor_parallel_degree() -> None:
    # Megatron-Core orders expert ranks etp fastest, then ep, then edp. With etp = tp = 2 an ep-64 group takes every
    # second rank (4 per 8-GPU node, 16 nodes); with etp = 1 (Megatron-Bridge's MoE presets) it is 64 consecutive
    # ranks: 8 per node on 8 nodes, and the 2 groups of a 128-rank stage hold the same experts (edp = 2).
    big = cluster(1024)
    strided = Layout(tp=2, dp=64, pp=8, ep=64, sequence_parallel=True)
    span = group_span(strided, "ep", big)
    assert (span.size, span.per_node, span.nodes) == (64, 4, 16)
    folded = strided.with_(expert_tp=1)
    span = group_span(folded, "ep", big)
    assert (span.size, span.per_node, span.nodes) == (64, 8, 8)
    expert_dp = group_span(folded, "edp", big)
    assert (expert_dp.size, expert_dp.per_node, expert_dp.nodes) == (2, 1, 2)
