"""The scale-out fabric and the cluster it connects, as the analytical collective model sees them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from gpufleet.catalog.calibration import MeasuredCollective
from gpufleet.catalog.judgements import shipped_judgements
from gpufleet.catalog.records import GPUSpec, NetworkSpec, NodeSpec, ScaleUp
from gpufleet.errors import InputError

TopologyKind = Literal["fat-tree", "leaf-spine", "rail-optimized", "dragonfly+"]
TOPOLOGY_KINDS: tuple[TopologyKind, ...] = ("fat-tree", "leaf-spine", "rail-optimized", "dragonfly+")


@dataclass(frozen=True)
class Fabric:
    """Topology kind, transport, and the oversubscription of each tier above the leaves.

    `oversubscription` is the leaf tier's down:up ratio (4.0 = 4:1: a leaf has four times more
    bandwidth towards its nodes than towards the spine). `spine_oversubscription` applies to a
    third tier (fat-tree with cores, or dragonfly+ global links between groups).
    `nodes_per_leaf` defaults to what a leaf of the network's radix can serve at that ratio.
    """

    network: NetworkSpec
    kind: TopologyKind = "fat-tree"
    oversubscription: float = 1.0
    spine_oversubscription: float = 1.0
    nodes_per_leaf: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in TOPOLOGY_KINDS:
            raise InputError(f"topology {self.kind!r} is not one of {', '.join(TOPOLOGY_KINDS)}")
        if self.oversubscription < 1 or self.spine_oversubscription < 1:
            raise InputError("oversubscription must be at least 1:1")
        if self.nodes_per_leaf is not None and self.nodes_per_leaf < 1:
            raise InputError("nodes per leaf must be at least 1")

    def leaf_down_ports(self) -> int:
        """Ports of one leaf that face nodes: radix * os / (1 + os)."""
        return max(1, int(self.network.switch_radix * self.oversubscription / (1 + self.oversubscription)))

    def nodes_under_leaf(self, node: NodeSpec) -> int:
        """Nodes whose NICs share one leaf (a rail-optimized leaf takes one NIC of each node)."""
        if self.nodes_per_leaf is not None:
            return self.nodes_per_leaf
        if self.kind == "rail-optimized":
            return self.leaf_down_ports()
        return max(1, self.leaf_down_ports() // node.nics)


def _fits_nodes(node: NodeSpec, gpus: int) -> bool:
    """Whether `gpus` fill whole nodes, part of one, or spread evenly over the fewest nodes that hold them."""
    return gpus <= node.gpus or gpus % node.gpus == 0 or gpus % math.ceil(gpus / node.gpus) == 0


def check_node_holds(node: NodeSpec, gpu_id: str) -> None:
    """Refuse a node that holds another GPU than the one asked for (`--node` and `--gpu` disagree)."""
    if node.gpu != gpu_id:
        raise InputError(
            f"--node {node.id} holds {node.gpu} GPUs, not --gpu {gpu_id}; leave out --node to use {gpu_id}'s "
            f"default node, or pick a node that holds {gpu_id} (`gpufleet catalog list nodes`)"
        )


def node_as_used(node: NodeSpec, gpus: int) -> NodeSpec:
    """The node as a job of `gpus` GPUs uses it. A count that fills whole nodes (or part of one) uses them as
    they are; otherwise the job spreads evenly over the fewest nodes that hold it, each with that share of its
    GPUs and their NICs — 256 GPUs on 72-GPU NVL72 racks run as 4 racks of 64, as NVIDIA's own GB200
    benchmarks do. A count that does not spread evenly is an InputError."""
    if not _fits_nodes(node, gpus):
        below = next(count for count in range(gpus - 1, 0, -1) if _fits_nodes(node, count))
        above = next(count for count in range(gpus + 1, 2 * gpus + node.gpus) if _fits_nodes(node, count))
        raise InputError(
            f"{gpus} GPUs neither fill whole {node.id} nodes of {node.gpus} GPUs nor spread evenly over the "
            f"{math.ceil(gpus / node.gpus)} nodes that would hold them; the nearest counts that do: {below} or {above}"
        )
    if gpus <= node.gpus or gpus % node.gpus == 0:
        return node
    nodes = math.ceil(gpus / node.gpus)
    used = gpus // nodes
    return node.model_copy(update={
        "gpus": used,
        "nics": max(1, round(node.nics * used / node.gpus)),
        "name": f"{node.name}, {used} of {node.gpus} GPUs used",
    })


@dataclass(frozen=True)
class Cluster:
    """`gpus` GPUs in nodes of one type joined by a fabric (a job smaller than a node uses part of one; one
    that does not fill whole nodes spreads evenly over the fewest that hold it, see `node_as_used`)."""

    gpu: GPUSpec
    node: NodeSpec
    gpus: int
    fabric: Fabric
    #: measured collectives of this cluster (a calibration profile's `collectives`); collective_cost applies them
    collective_calibration: tuple[MeasuredCollective, ...] = ()
    #: per-step latency of a scale-up transfer (the catalog judgement scale-up-step-latency-s: whoever builds the
    #: cluster from a catalog passes the catalog's, else the shipped one); a field, so that every cache keyed on the
    #: cluster sees it
    scale_up_step_latency_s: float = field(default_factory=lambda: shipped_judgements().scale_up_step_latency_s)

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise InputError(f"GPU count must be positive, got {self.gpus}")
        check_node_holds(self.node, self.gpu.id)
        # `node` is the node as this job uses it (a count that does not fill whole nodes spreads evenly)
        object.__setattr__(self, "node", node_as_used(self.node, self.gpus))

    @property
    def scale_up(self) -> ScaleUp:
        """The GPU-to-GPU links inside a node: the node's override, else the GPU's own."""
        return self.node.scale_up_override or self.gpu.scale_up

    @property
    def gpus_per_node(self) -> int:
        """GPUs sharing one scale-up domain (an NVL72 rack counts as one node)."""
        return min(self.node.gpus, self.gpus)

    @property
    def num_nodes(self) -> int:
        return max(1, self.gpus // self.node.gpus)

    @cached_property
    def collective_memo(self) -> dict[tuple[object, ...], object]:
        """Collective costs already computed on this cluster (fabric.collectives fills it; a search asks for the same
        collective many times). Not part of the cluster's value: equality and hashing ignore it."""
        return {}

    @cached_property
    def nodes_per_leaf(self) -> int:
        """Nodes under one leaf switch (`Fabric.nodes_under_leaf` of this node; computed once)."""
        return self.fabric.nodes_under_leaf(self.node)

    @property
    def nic_bytes_per_s_per_gpu(self) -> float:
        """Achievable scale-out bandwidth per GPU, one direction (NIC or switch port, whichever is slower)."""
        per_port = min(self.node.nic_gbps, self.fabric.network.link_gbps) * 1e9 / 8
        return per_port * self.node.nics / self.node.gpus * self.fabric.network.achievable_fraction
