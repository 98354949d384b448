"""Topologies as explicit graphs: GPUs, NICs, scale-up switches or meshes, leaf/spine/core switches.

Every link is directed and carries a capacity per direction (bytes/s, already multiplied by the
transport's measured achievable fraction, so that a ring over one NIC reaches NCCL's bus bandwidth)
and the latency of the hop it enters (a switch hop; 0 into a NIC or a GPU).

Builders (the `Fabric.kind` of a `Cluster` picks one):

* **fat-tree**: leaves take whole nodes (`Fabric.nodes_under_leaf`); every leaf is cabled as a full
  one: ceil(p / oversubscription) uplinks for the p node-facing ports of a full leaf. Up to `radix`
  leaves: two tiers, every leaf spreads its uplinks round-robin over the fewest spines (at least
  ceil(uplinks / radix)) that divide a leaf's uplinks evenly, so every leaf has the same number of
  parallel links to every spine, as in NVIDIA's SuperPOD. (An uneven spread, 20 uplinks over 9
  spines, left some spine-to-leaf bundles 1.5x as loaded as others under all-to-all traffic.)
  Beyond: three tiers (Al-Fares): pods of radix·s/(1+s) leaves (s = the
  spine tier's oversubscription), one aggregation switch per leaf uplink index, core groups per index.
* **leaf-spine**: the same two tiers; more leaves than the radix is an error.
* **rail-optimized**: SuperPOD scalable units: NIC i of every node of a unit goes to the unit's leaf i,
  then the same spine/core tiers (NVIDIA's RA tables: 1 SU = 8 leaves + 4 spines ... 64 SU = 512 leaves,
  512 spines, 256 cores for radix 64).
* **dragonfly+**: groups of radix·s/(1+s) leaves with their own spines (a leaf-spine each); spine i of
  every group links to spine i of every other group (global links, minimal routing).
* inside a node: a switched domain (NVSwitch: 8 GPUs, or 72 in an NVL72 rack; PCIe treated alike) where
  each GPU has one link to the domain's switch, or AMD's fully connected 8-GPU mesh (one link per pair).
* `join_clusters`: two clusters whose top switches reach a gateway each, gateways joined by a WAN link.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from gpufleet.errors import InputError
from gpufleet.fabric.topology import Cluster, Fabric

GPU, NIC, SCALE_UP, LEAF, SPINE, CORE, GATEWAY = range(7)
VERTEX_KINDS = ("gpu", "nic", "scale-up switch", "leaf", "spine", "core", "gateway")
#: Link tiers, in words (the index is what `FabricGraph.tier` stores).
TIERS = ("scale-up", "gpu-nic", "nic-leaf", "leaf-nic", "leaf-spine", "spine-leaf", "spine-core", "core-spine",
         "global", "gateway", "wan")
_T = {name: index for index, name in enumerate(TIERS)}
#: Capacity of links that are not modelled as a bottleneck (GPU to its own NIC over PCIe, switch to gateway).
UNLIMITED_BYTES_PER_S = 1e15

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class FabricGraph:
    """An explicit topology. Vertex ids: GPUs first (0..gpus-1), then NICs, then switches."""

    gpus: int
    kind: IntArray  # vertex kind, one of GPU..GATEWAY
    src: IntArray  # per directed link
    dst: IntArray
    capacity_bytes_per_s: FloatArray
    latency_s: FloatArray
    tier: IntArray  # index into TIERS
    node_of_gpu: IntArray
    local_of_gpu: IntArray  # index of the GPU inside its node
    node_first_gpu: IntArray  # per node
    node_gpus: IntArray  # per node
    nic_of_gpu: IntArray  # NIC vertex each GPU drives
    node_nics: IntArray  # per node: the NIC vertices, padded with -1, shape (nodes, max nics)
    leaf_group_of_node: IntArray  # the leaf (or rail-optimized scalable unit) a node sits under
    endpoint_latency_s: FloatArray  # per GPU: software + NIC latency of one network message
    scale_up_latency_s: float
    edge_up: IntArray  # per GPU: link GPU -> its scale-up switch (-1 in a mesh)
    edge_down: IntArray  # per GPU: link scale-up switch -> GPU (-1 in a mesh)
    mesh_edge: IntArray  # (gpus, max GPUs per node): link GPU -> local peer in a mesh, else -1
    edge_gpu_nic: IntArray  # per GPU: link GPU -> NIC it drives
    edge_nic_gpu: IntArray  # per GPU: link NIC -> GPU
    edge_nic_leaf: IntArray  # per NIC vertex (indexed by vertex id): NIC -> leaf, -1 elsewhere
    edge_leaf_nic: IntArray
    leaf_of_nic: IntArray  # per vertex: the leaf a NIC plugs into, -1 elsewhere
    description: str = ""
    _cache: dict[str, object] = field(default_factory=dict, repr=False)

    @property
    def vertices(self) -> int:
        return len(self.kind)

    @property
    def links(self) -> int:
        return len(self.src)

    @property
    def nodes(self) -> int:
        return len(self.node_gpus)

    def count(self, vertex_kind: int) -> int:
        return int(np.count_nonzero(self.kind == vertex_kind))

    def switch_vertices(self) -> IntArray:
        return np.flatnonzero(self.kind >= LEAF)

    def link_name(self, edge: int) -> str:
        """A link in words, e.g. 'leaf 3 -> spine 1 (leaf-spine)'."""
        return f"{self.vertex_name(int(self.src[edge]))} -> {self.vertex_name(int(self.dst[edge]))} " \
               f"({TIERS[int(self.tier[edge])]})"

    def vertex_name(self, vertex: int) -> str:
        kind = int(self.kind[vertex])
        ordinal = int(np.count_nonzero(self.kind[:vertex] == kind))
        return f"{VERTEX_KINDS[kind]} {ordinal}"

    def with_capacity(self, capacity_bytes_per_s: FloatArray) -> FabricGraph:
        """The same graph with other link capacities (tests: adding capacity never slows a collective)."""
        values = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "_cache"}
        values["capacity_bytes_per_s"] = np.asarray(capacity_bytes_per_s, dtype=float)
        return FabricGraph(**values)


class _Builder:
    """Accumulates vertices and links; `finish` turns them into a FabricGraph."""

    def __init__(self, gpus: int) -> None:
        self.kinds: list[IntArray] = [np.full(gpus, GPU, dtype=np.int64)]
        self.vertices = gpus
        self.parts: list[tuple[IntArray, IntArray, FloatArray, FloatArray, IntArray]] = []
        self.links = 0

    def add_vertices(self, kind: int, count: int) -> IntArray:
        ids = np.arange(self.vertices, self.vertices + count, dtype=np.int64)
        self.kinds.append(np.full(count, kind, dtype=np.int64))
        self.vertices += count
        return ids

    def add_links(self, src: IntArray, dst: IntArray, capacity: float | FloatArray, latency: float | FloatArray,
                  tier: str) -> IntArray:
        src = np.asarray(src, dtype=np.int64)
        dst = np.broadcast_to(np.asarray(dst, dtype=np.int64), src.shape).copy()
        n = len(src)
        cap = np.broadcast_to(np.asarray(capacity, dtype=float), (n,)).copy()
        lat = np.broadcast_to(np.asarray(latency, dtype=float), (n,)).copy()
        self.parts.append((src, dst, cap, lat, np.full(n, _T[tier], dtype=np.int64)))
        ids = np.arange(self.links, self.links + n, dtype=np.int64)
        self.links += n
        return ids

    def add_both(self, a: IntArray, b: IntArray, capacity: float | FloatArray, latency_into_a: float,
                 latency_into_b: float, tier_ab: str, tier_ba: str) -> tuple[IntArray, IntArray]:
        return (self.add_links(a, b, capacity, latency_into_b, tier_ab),
                self.add_links(b, a, capacity, latency_into_a, tier_ba))

    def kind_array(self) -> IntArray:
        return np.concatenate(self.kinds)

    def link_arrays(self) -> tuple[IntArray, IntArray, FloatArray, FloatArray, IntArray]:
        if not self.parts:
            empty_i = np.zeros(0, dtype=np.int64)
            return empty_i, empty_i, np.zeros(0), np.zeros(0), empty_i
        return tuple(np.concatenate([part[i] for part in self.parts]) for i in range(5))  # type: ignore[return-value]


@dataclass
class _ClusterPart:
    """What one cluster contributed to a builder: per-GPU and per-node arrays and its top switches."""

    node_of_gpu: IntArray
    local_of_gpu: IntArray
    node_first_gpu: IntArray
    node_gpus: IntArray
    nic_of_gpu: IntArray
    node_nics: IntArray
    leaf_group_of_node: IntArray
    endpoint_latency_s: FloatArray
    edge_up: IntArray
    edge_down: IntArray
    mesh_edge: IntArray
    edge_gpu_nic: IntArray
    edge_nic_gpu: IntArray
    nic_vertices: IntArray
    nic_leaf: IntArray
    edge_nic_leaf: IntArray
    edge_leaf_nic: IntArray
    top_switches: IntArray
    scale_up_latency_s: float


def _add_scale_up(b: _Builder, cluster: Cluster, gpu_base: int) -> tuple[IntArray, IntArray, IntArray]:
    """NVSwitch/PCIe domains or meshes inside each node; returns edge_up, edge_down, mesh_edge."""
    gpn, nodes = cluster.gpus_per_node, cluster.num_nodes
    scale_up = cluster.scale_up
    gpus = np.arange(gpu_base, gpu_base + gpn * nodes, dtype=np.int64)
    line = scale_up.bytes_per_s_per_direction * scale_up.achievable_fraction
    edge_up = np.full(len(gpus), -1, dtype=np.int64)
    edge_down = np.full(len(gpus), -1, dtype=np.int64)
    mesh_edge = np.full((len(gpus), gpn), -1, dtype=np.int64)
    if gpn == 1:
        return edge_up, edge_down, mesh_edge
    if scale_up.kind == "mesh":
        links = scale_up.links or (gpn - 1)
        local_a, local_b = np.meshgrid(np.arange(gpn), np.arange(gpn), indexing="ij")
        pairs = local_a != local_b
        la, lb = local_a[pairs], local_b[pairs]
        node_index = np.repeat(np.arange(nodes), len(la))
        a = node_index * gpn + np.tile(la, nodes)
        bb = node_index * gpn + np.tile(lb, nodes)
        ids = b.add_links(gpus[a], gpus[bb], line / links, 0.0, "scale-up")
        mesh_edge[a, np.tile(lb, nodes)] = ids
        return edge_up, edge_down, mesh_edge
    switches = b.add_vertices(SCALE_UP, nodes)
    owner = switches[np.arange(len(gpus)) // gpn]
    edge_up, edge_down = b.add_both(gpus, owner, line, 0.0, 0.0, "scale-up", "scale-up")
    return edge_up, edge_down, mesh_edge


def _full_leaf(cluster: Cluster) -> int:
    """What one full leaf serves: the nodes of a rail-optimized scalable unit (one NIC of each), else its
    node-facing ports. Raises when a leaf cannot take that many."""
    fabric, node = cluster.fabric, cluster.node
    nics, radix = node.nics, fabric.network.switch_radix
    if fabric.kind == "rail-optimized":
        unit = fabric.nodes_under_leaf(node)
        if unit > radix:
            raise InputError(f"{unit} nodes per rail leaf exceed the switch radix {radix}")
        return unit
    if nics > fabric.leaf_down_ports():  # a node wider than a leaf (NVL72): its NICs span several leaves
        return fabric.leaf_down_ports()
    ports = fabric.nodes_under_leaf(node) * nics
    if ports >= radix:
        raise InputError(
            f"{ports // nics} nodes x {nics} NICs per leaf need {ports} ports plus uplinks; "
            f"a {fabric.network.id} switch has {radix}"
        )
    return ports


def _leaves_for(cluster: Cluster, nodes: int, full: int) -> int:
    """Leaves that `nodes` nodes of `cluster` occupy, `full` being what `_full_leaf` says one leaf serves."""
    if cluster.fabric.kind == "rail-optimized":
        return math.ceil(nodes / full) * cluster.node.nics
    return math.ceil(nodes * cluster.node.nics / full)


def _leaves_per_group(fabric: Fabric) -> int:
    """Leaves under one fat-tree pod or one dragonfly+ group: the down ports of a switch above the leaves."""
    spine_os = fabric.spine_oversubscription
    return max(1, int(fabric.network.switch_radix * spine_os / (1 + spine_os)))


def max_leaves(fabric: Fabric) -> int:
    """The most leaves the builders below can join: `radix` in a two-tier leaf-spine; radix pods of
    radix·s/(1+s) leaves in a three-tier fat tree (rail-optimized alike); in a dragonfly+, one group more
    than a spine's global ports (every group reaches every other directly)."""
    radix = fabric.network.switch_radix
    group = _leaves_per_group(fabric)
    if fabric.kind == "leaf-spine":
        return radix
    if fabric.kind == "dragonfly+":
        return group * (max(1, math.ceil(group / fabric.spine_oversubscription)) + 1)
    return radix * group


def max_gpus(cluster: Cluster) -> int:
    """The most GPUs, in nodes like `cluster`'s, that its topology and switch radix can connect."""
    full = _full_leaf(cluster)
    most = max_leaves(cluster.fabric)
    nics = cluster.node.nics
    nodes = full * (most // nics) if cluster.fabric.kind == "rail-optimized" else most * full // nics
    return nodes * cluster.gpus_per_node


def check_size(cluster: Cluster) -> None:
    """Refuse, by arithmetic and before anything is built, a cluster larger than its topology can connect."""
    full = _full_leaf(cluster)
    leaves = _leaves_for(cluster, cluster.num_nodes, full)
    most = max_leaves(cluster.fabric)
    if leaves <= most:
        return
    fabric = cluster.fabric
    shape = {"fat-tree": "three-tier fat tree", "leaf-spine": "two-tier leaf-spine",
             "rail-optimized": "three-tier rail-optimized fabric", "dragonfly+": "dragonfly+ fabric"}[fabric.kind]
    hint = "use --topology fat-tree (three tiers), higher-radix switches (--network) or fewer GPUs" \
        if fabric.kind == "leaf-spine" else "use higher-radix switches (--network), fewer GPUs, or split the job"
    raise InputError(
        f"{cluster.gpus:,} GPUs need {leaves:,} leaf switches, but a {shape} of {fabric.network.id} switches "
        f"(radix {fabric.network.switch_radix}) at {fabric.oversubscription:g}:1 joins at most {most:,} leaves: "
        f"at most {max_gpus(cluster):,} GPUs in {cluster.node.id} nodes; {hint}"
    )


def _leaf_uplinks(cluster: Cluster, full: int) -> int:
    """Uplinks of every leaf: a full leaf's node ports over the oversubscription (as `_add_cluster` cables them)."""
    return max(1, math.ceil(full / cluster.fabric.oversubscription - 1e-9))


def estimate_links(cluster: Cluster) -> int:
    """Directed links `build_graph(cluster)` would hold, by arithmetic (tests hold it within 10 %): what the
    simulator's work estimate uses before anything is built."""
    gpn, nodes, nics = cluster.gpus_per_node, cluster.num_nodes, cluster.node.nics
    gpus = gpn * nodes
    scale_up = 0 if gpn == 1 else gpus * (gpn - 1) if cluster.scale_up.kind == "mesh" else 2 * gpus
    links = scale_up + 2 * gpus + 2 * nodes * nics  # GPU <-> NIC, NIC <-> leaf
    full = _full_leaf(cluster)
    leaves = _leaves_for(cluster, nodes, full)
    if leaves <= 1:
        return links
    fabric = cluster.fabric
    up = _leaf_uplinks(cluster, full)
    links += 2 * leaves * up  # leaf <-> spine (aggregation)
    if fabric.kind == "dragonfly+":
        group = _leaves_per_group(fabric)
        groups = math.ceil(leaves / group)
        if groups > 1:
            ports = max(1, math.ceil(min(group, leaves) / fabric.spine_oversubscription))
            links += 2 * up * groups * (groups - 1) // 2 * max(1, ports // (groups - 1))
    elif leaves > fabric.network.switch_radix:  # three tiers: aggregation <-> core
        links += 2 * math.ceil(leaves * up / fabric.spine_oversubscription)
    return links


def estimate_switches(cluster: Cluster) -> int:
    """Leaf, spine and core switches `build_graph(cluster)` would hold, by arithmetic (tests hold it exact)."""
    full = _full_leaf(cluster)
    leaves = _leaves_for(cluster, cluster.num_nodes, full)
    if leaves <= 1:
        return leaves
    fabric = cluster.fabric
    radix, up = fabric.network.switch_radix, _leaf_uplinks(cluster, full)
    if fabric.kind == "dragonfly+":
        return leaves + math.ceil(leaves / _leaves_per_group(fabric)) * up
    if leaves <= radix:
        return leaves + _even_spine_count(leaves * up, up, radix)
    pod = _leaves_per_group(fabric)
    pods = math.ceil(leaves / pod)
    in_pod = [min(pod, leaves - i * pod) for i in range(pods)]  # leaves under each pod (the last may be short)
    agg_up = [math.ceil(count / fabric.spine_oversubscription - 1e-9) for count in in_pod]
    return leaves + pods * up + up * max(1, math.ceil(sum(agg_up) / radix))


def estimate_spray_path_links(cluster: Cluster) -> int:
    """Links a packet-sprayed flow between the two farthest leaves spreads over (its up and down fan-out), an upper
    bound (a part-filled last pod has fewer cores); tests hold it to what routing gives."""
    full = _full_leaf(cluster)
    leaves = _leaves_for(cluster, cluster.num_nodes, full)
    if leaves <= 1:
        return 0
    fabric = cluster.fabric
    up = _leaf_uplinks(cluster, full)
    if fabric.kind == "dragonfly+":
        group = _leaves_per_group(fabric)
        groups = math.ceil(leaves / group)
        if groups <= 1:
            return 2 * up
        ports = max(1, math.ceil(min(group, leaves) / fabric.spine_oversubscription))
        return 2 * up + up * max(1, ports // (groups - 1))
    if leaves <= fabric.network.switch_radix:
        return 2 * up
    pod = min(_leaves_per_group(fabric), leaves)
    return 2 * up * (1 + math.ceil(pod / fabric.spine_oversubscription))


@dataclass(frozen=True, slots=True)
class FabricSize:
    """What the simulator's work estimate needs to know of a topology."""

    links: int
    leaves: int
    switches: int  # leaves included: routing keeps a hop count from every switch to every leaf
    spray_path_links: int  # links of a spray path between the farthest leaves (0 with one leaf)
    near_path_links: int  # links of a spray path between two leaves of one pod (group): up one tier and down
    pod_nodes: int  # nodes under one pod (dragonfly+ group; all of them in two tiers)
    pair_fanout: int  # leaf pairs the flows from one node to another can join: one per rail, more if nodes straddle
    gpus_per_node: int


def estimate_fabric_size(cluster: Cluster) -> FabricSize:
    """The FabricSize of `build_graph(cluster)`, by arithmetic (nothing is built)."""
    full = _full_leaf(cluster)
    nics, nodes = cluster.node.nics, cluster.num_nodes
    leaves = _leaves_for(cluster, nodes, full)
    fabric = cluster.fabric
    if fabric.kind == "rail-optimized":  # NIC i of every node on rail leaf i of its unit
        fanout = nics
    else:  # a node's NICs on consecutive leaves; two nodes may cut their local indices apart differently
        reach = 1 if nics <= full and full % nics == 0 else min(nics, math.ceil(nics / full) + 1)
        fanout = min(nics, 2 * reach - 1)
    tiers_of_pods = fabric.kind == "dragonfly+" or leaves > fabric.network.switch_radix
    pod_nodes = max(1, _leaves_per_group(fabric) * full // nics) if tiers_of_pods else nodes
    near = 2 * _leaf_uplinks(cluster, full) if leaves > 1 else 0
    return FabricSize(estimate_links(cluster), leaves, estimate_switches(cluster), estimate_spray_path_links(cluster),
                      near, min(pod_nodes, nodes), max(1, fanout), cluster.gpus_per_node)


def _leaf_ports(cluster: Cluster) -> tuple[IntArray, IntArray, int]:
    """Leaf index of every NIC (node-major) and the leaf-group (scalable unit) of every node."""
    nodes, nics = cluster.num_nodes, cluster.node.nics
    full = _full_leaf(cluster)
    nic_node = np.repeat(np.arange(nodes), nics)
    nic_local = np.tile(np.arange(nics), nodes)
    if cluster.fabric.kind == "rail-optimized":
        leaf = (nic_node // full) * nics + nic_local
        return leaf, np.arange(nodes) // full, full
    leaf = np.arange(nodes * nics) // full
    group = leaf[np.arange(nodes) * nics]
    return leaf, group, full


def _add_cluster(b: _Builder, cluster: Cluster, gpu_base: int, node_base: int) -> _ClusterPart:
    check_size(cluster)
    fabric, node, network = cluster.fabric, cluster.node, cluster.fabric.network
    gpn, nodes, nics = cluster.gpus_per_node, cluster.num_nodes, node.nics
    radix = network.switch_radix
    count = gpn * nodes
    gpus = np.arange(gpu_base, gpu_base + count, dtype=np.int64)
    local = np.arange(count) % gpn
    node_index = np.arange(count) // gpn
    edge_up, edge_down, mesh_edge = _add_scale_up(b, cluster, gpu_base)

    nic_vertices = b.add_vertices(NIC, nodes * nics)
    nic_of_gpu = nic_vertices[node_index * nics + (local * nics) // node.gpus]
    edge_gpu_nic, edge_nic_gpu = b.add_both(gpus, nic_of_gpu, UNLIMITED_BYTES_PER_S, 0.0, 0.0, "gpu-nic", "gpu-nic")
    port_cap = min(node.nic_gbps, network.link_gbps) * 1e9 / 8 * network.achievable_fraction
    link_cap = network.link_bytes_per_s * network.achievable_fraction
    hop = network.hop_latency_s

    leaf_index, group_of_node, full_ports = _leaf_ports(cluster)
    leaves = int(leaf_index.max()) + 1
    leaf_vertices = b.add_vertices(LEAF, leaves)
    nic_leaf = leaf_vertices[leaf_index]
    edge_nic_leaf, edge_leaf_nic = b.add_both(nic_vertices, nic_leaf, port_cap, 0.0, hop, "nic-leaf", "leaf-nic")
    used = np.bincount(leaf_index, minlength=leaves)
    os = fabric.oversubscription
    # every leaf is cabled as a full one: ceil(ports of a full leaf / os) uplinks (a part-filled last leaf too)
    uplinks = np.full(leaves, _leaf_uplinks(cluster, max(full_ports, int(used.max()))), dtype=np.int64)
    too_full = used + uplinks > radix
    if leaves > 1 and too_full.any():
        raise InputError(
            f"a leaf needs {int(used.max())} node ports + {int(uplinks.max())} uplinks at "
            f"{os:g}:1 but a {network.id} switch has {radix} ports; lower the nodes per leaf or raise the ratio"
        )
    top = leaf_vertices
    if leaves > 1:
        top = _add_upper_tiers(b, cluster, leaf_vertices, uplinks, link_cap, hop)
    return _ClusterPart(
        node_of_gpu=node_base + node_index, local_of_gpu=local,
        node_first_gpu=gpu_base + np.arange(nodes) * gpn, node_gpus=np.full(nodes, gpn, dtype=np.int64),
        nic_of_gpu=nic_of_gpu, node_nics=nic_vertices.reshape(nodes, nics), leaf_group_of_node=group_of_node,
        endpoint_latency_s=np.full(count, network.endpoint_latency_s), edge_up=edge_up, edge_down=edge_down,
        mesh_edge=mesh_edge, edge_gpu_nic=edge_gpu_nic, edge_nic_gpu=edge_nic_gpu, nic_vertices=nic_vertices,
        nic_leaf=nic_leaf, edge_nic_leaf=edge_nic_leaf, edge_leaf_nic=edge_leaf_nic, top_switches=top,
        scale_up_latency_s=cluster.scale_up_step_latency_s,
    )


def _spread(b: _Builder, lower: IntArray, up_counts: IntArray, upper: IntArray, cap: float, hop: float,
            tier_up: str, tier_down: str) -> None:
    """Uplink u of lower switch i goes to upper switch (u + i) % len(upper), both directions."""
    owners = np.repeat(np.arange(len(lower)), up_counts)
    starts = np.repeat(np.cumsum(up_counts) - up_counts, up_counts)
    u = np.arange(len(owners)) - starts
    target = upper[(u + owners) % len(upper)]
    b.add_both(lower[owners], target, cap, hop, hop, tier_up, tier_down)


def _even_spine_count(total_uplinks: int, leaf_uplinks: int, radix: int) -> int:
    """Fewest spines, with ports for every uplink, that take an equal share of each full leaf's uplinks."""
    fewest = max(1, math.ceil(total_uplinks / radix))
    return next((d for d in range(fewest, leaf_uplinks + 1) if leaf_uplinks % d == 0), fewest)


def _add_upper_tiers(b: _Builder, cluster: Cluster, leaves: IntArray, uplinks: IntArray, cap: float,
                     hop: float) -> IntArray:
    fabric = cluster.fabric
    radix = fabric.network.switch_radix
    spine_os = fabric.spine_oversubscription
    n_leaves = len(leaves)
    if fabric.kind == "dragonfly+":
        return _add_dragonfly(b, cluster, leaves, uplinks, cap, hop)
    if n_leaves <= radix:
        spines = b.add_vertices(SPINE, _even_spine_count(int(uplinks.sum()), int(uplinks.max()), radix))
        _spread(b, leaves, uplinks, spines, cap, hop, "leaf-spine", "spine-leaf")
        return spines
    pod = _leaves_per_group(fabric)  # leaves per pod = aggregation down ports (check_size kept pods <= radix)
    pods = math.ceil(n_leaves / pod)
    per_pod = int(uplinks.max())  # one aggregation switch per leaf uplink index
    aggs = b.add_vertices(SPINE, pods * per_pod)
    pod_of_leaf = np.arange(n_leaves) // pod
    owners = np.repeat(np.arange(n_leaves), uplinks)
    u = np.arange(len(owners)) - np.repeat(np.cumsum(uplinks) - uplinks, uplinks)
    b.add_both(leaves[owners], aggs[pod_of_leaf[owners] * per_pod + u], cap, hop, hop, "leaf-spine", "spine-leaf")
    agg_down = np.bincount(pod_of_leaf[owners] * per_pod + u, minlength=pods * per_pod)
    agg_up = np.where(agg_down > 0, np.ceil(agg_down / spine_os - 1e-9), 0).astype(np.int64)
    cores_all: list[IntArray] = []
    for index in range(per_pod):  # core group `index` serves aggregation switch `index` of every pod
        members = np.arange(pods) * per_pod + index
        total = int(agg_up[members].sum())
        if total == 0:
            continue
        cores = b.add_vertices(CORE, max(1, math.ceil(total / radix)))
        _spread(b, aggs[members], agg_up[members], cores, cap, hop, "spine-core", "core-spine")
        cores_all.append(cores)
    return np.concatenate(cores_all)


def _add_dragonfly(b: _Builder, cluster: Cluster, leaves: IntArray, uplinks: IntArray, cap: float,
                   hop: float) -> IntArray:
    fabric = cluster.fabric
    spine_os = fabric.spine_oversubscription
    per_group = _leaves_per_group(fabric)
    n_leaves = len(leaves)
    groups = math.ceil(n_leaves / per_group)
    per_spine_set = int(uplinks.max())
    spines = b.add_vertices(SPINE, groups * per_spine_set)
    group_of_leaf = np.arange(n_leaves) // per_group
    owners = np.repeat(np.arange(n_leaves), uplinks)
    u = np.arange(len(owners)) - np.repeat(np.cumsum(uplinks) - uplinks, uplinks)
    b.add_both(leaves[owners], spines[group_of_leaf[owners] * per_spine_set + u], cap, hop, hop,
               "leaf-spine", "spine-leaf")
    if groups == 1:
        return spines
    global_ports = max(1, math.ceil(min(per_group, n_leaves) / spine_os))  # check_size kept groups - 1 <= it
    multiplicity = max(1, global_ports // (groups - 1))
    g_a, g_b = np.triu_indices(groups, k=1)
    for index in range(per_spine_set):
        a = np.repeat(spines[g_a * per_spine_set + index], multiplicity)
        c = np.repeat(spines[g_b * per_spine_set + index], multiplicity)
        b.add_both(a, c, cap, hop, hop, "global", "global")
    return spines


def _finish(b: _Builder, parts: list[_ClusterPart], description: str) -> FabricGraph:
    src, dst, cap, lat, tier = b.link_arrays()
    kinds = b.kind_array()
    vertices = len(kinds)
    edge_nic_leaf = np.full(vertices, -1, dtype=np.int64)
    edge_leaf_nic = np.full(vertices, -1, dtype=np.int64)
    leaf_of_nic = np.full(vertices, -1, dtype=np.int64)
    width = max(p.mesh_edge.shape[1] for p in parts)
    nic_width = max(p.node_nics.shape[1] for p in parts)
    mesh = np.full((sum(len(p.node_of_gpu) for p in parts), width), -1, dtype=np.int64)
    node_nics = np.full((sum(len(p.node_gpus) for p in parts), nic_width), -1, dtype=np.int64)
    row = node_row = 0
    group_base = 0
    groups: list[IntArray] = []
    for p in parts:
        edge_nic_leaf[p.nic_vertices] = p.edge_nic_leaf
        edge_leaf_nic[p.nic_vertices] = p.edge_leaf_nic
        leaf_of_nic[p.nic_vertices] = p.nic_leaf
        mesh[row:row + len(p.node_of_gpu), : p.mesh_edge.shape[1]] = p.mesh_edge
        node_nics[node_row:node_row + len(p.node_gpus), : p.node_nics.shape[1]] = p.node_nics
        row += len(p.node_of_gpu)
        node_row += len(p.node_gpus)
        groups.append(p.leaf_group_of_node + group_base)
        group_base += int(p.leaf_group_of_node.max()) + 1

    def cat(name: str) -> IntArray:
        return np.concatenate([getattr(p, name) for p in parts])

    return FabricGraph(
        gpus=int(sum(len(p.node_of_gpu) for p in parts)), kind=kinds, src=src, dst=dst,
        capacity_bytes_per_s=cap, latency_s=lat, tier=tier, node_of_gpu=cat("node_of_gpu"),
        local_of_gpu=cat("local_of_gpu"), node_first_gpu=cat("node_first_gpu"), node_gpus=cat("node_gpus"),
        nic_of_gpu=cat("nic_of_gpu"), node_nics=node_nics, leaf_group_of_node=np.concatenate(groups),
        endpoint_latency_s=np.concatenate([p.endpoint_latency_s for p in parts]),
        scale_up_latency_s=parts[0].scale_up_latency_s,
        edge_up=cat("edge_up"), edge_down=cat("edge_down"), mesh_edge=mesh, edge_gpu_nic=cat("edge_gpu_nic"),
        edge_nic_gpu=cat("edge_nic_gpu"), edge_nic_leaf=edge_nic_leaf, edge_leaf_nic=edge_leaf_nic,
        leaf_of_nic=leaf_of_nic, description=description,
    )


def _describe(cluster: Cluster) -> str:
    fabric = cluster.fabric
    return (f"{cluster.gpus} x {cluster.gpu.id} in {cluster.num_nodes} {cluster.node.id}, {fabric.kind} of "
            f"{fabric.network.id} (radix {fabric.network.switch_radix}), {fabric.oversubscription:g}:1")


@lru_cache(maxsize=32)
def build_graph(cluster: Cluster) -> FabricGraph:
    """The explicit graph of `cluster` (cached: clusters are immutable)."""
    b = _Builder(cluster.gpus_per_node * cluster.num_nodes)
    part = _add_cluster(b, cluster, 0, 0)
    return _finish(b, [part], _describe(cluster))


def join_clusters(first: Cluster, second: Cluster, wan_gbps: float, wan_latency_s: float) -> FabricGraph:
    """Two clusters (GPUs of `first`, then of `second`) joined by one WAN link of `wan_gbps` each way."""
    if wan_gbps <= 0 or wan_latency_s < 0:
        raise InputError("a WAN link needs a positive bandwidth and a non-negative latency")
    count_a = first.gpus_per_node * first.num_nodes
    count_b = second.gpus_per_node * second.num_nodes
    b = _Builder(count_a + count_b)
    part_a = _add_cluster(b, first, 0, 0)
    part_b = _add_cluster(b, second, count_a, first.num_nodes)
    gateways = b.add_vertices(GATEWAY, 2)
    for part, gateway, network in ((part_a, gateways[0], first.fabric.network),
                                   (part_b, gateways[1], second.fabric.network)):
        b.add_both(part.top_switches, np.full(len(part.top_switches), gateway), UNLIMITED_BYTES_PER_S,
                   network.hop_latency_s, network.hop_latency_s, "gateway", "gateway")
    b.add_both(gateways[:1], gateways[1:], wan_gbps * 1e9 / 8, wan_latency_s, wan_latency_s, "wan", "wan")
    return _finish(b, [part_a, part_b], f"{_describe(first)} + {_describe(second)} over a {wan_gbps:g} Gb/s WAN")
