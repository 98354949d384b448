"""A wide-area link between sites, and what a collective across it costs (the α–β model of collectives.py).

Sites sit on a ring: two sites share one link, three or more each have a link to the next (the last to the
first). A link carries `gbps` each way at once (full duplex) with a one-way latency. `gbps` is what the link
delivers to NCCL, not its line rate: give the achievable figure (the flow simulator's `join_clusters` takes it
the same way).

A collective across sites runs between the members that share every other coordinate: `groups` congruent groups
of `sites` members, one member per site, all at once (every rank of a site talks to its counterparts). Their
traffic shares each link, so a group gets 1/groups of it, and never more than a GPU's own NIC. The bytes follow
nccl-tests' bus-bandwidth convention (`collectives.bus_factor`): a member's buffer S costs
S · bus_factor(op, sites) / bandwidth, plus one latency per step of the ring (2(sites − 1) for an all-reduce,
sites − 1 for an all-gather or reduce-scatter, one for a send-recv), each step paying the link's one-way latency
and the site's own path to its gateway (NIC, leaf, spine: collectives.CROSS_LEAF_HOPS hops).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufleet.errors import InputError
from gpufleet.fabric.collectives import CROSS_LEAF_HOPS, CollectiveCost, Op, bus_factor
from gpufleet.fabric.topology import Cluster


@dataclass(frozen=True)
class WanLink:
    """One link between two sites: Gb/s each way (what it delivers), one-way latency in seconds."""

    gbps: float
    latency_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.gbps) and self.gbps > 0):
            raise InputError(f"a WAN link needs a positive, finite bandwidth in Gb/s, got {self.gbps}")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise InputError(f"a WAN link needs a non-negative, finite latency, got {self.latency_s} s")

    @property
    def bytes_per_s(self) -> float:
        """Bytes per second in each direction."""
        return self.gbps * 1e9 / 8

    def describe(self) -> str:
        return f"WAN {self.gbps:g} Gb/s each way, {self.latency_s * 1e3:g} ms one-way"


def ring_latency_steps(op: Op, members: int) -> int:
    """Latency steps of `op` as a ring over `members` (the same counts collectives.collective_cost charges)."""
    if members <= 1:
        return 0
    if op == "all-reduce":
        return 2 * (members - 1)
    if op in ("all-gather", "reduce-scatter", "all-to-all"):
        return members - 1
    if op == "broadcast":
        return math.ceil(math.log2(members))
    return 1


def site_path_latency_s(cluster: Cluster) -> float:
    """One message's latency from a GPU to its site's WAN gateway: its NIC's endpoint latency and the switch hops
    of a leaf-spine path (collectives.CROSS_LEAF_HOPS)."""
    network = cluster.fabric.network
    return network.endpoint_latency_s + CROSS_LEAF_HOPS * network.hop_latency_s


def wan_collective_cost(op: Op, member_bytes: float, sites: int, groups: int, link: WanLink,
                        site: Cluster) -> CollectiveCost:
    """Time for `groups` groups of `sites` members (one per site, on `site`'s kind of cluster) to each run `op` on
    `member_bytes` (the full buffer per member), at once, over the sites' links."""
    if sites <= 1 or member_bytes <= 0 or groups < 1:
        return CollectiveCost(op, member_bytes, sites, 0.0, math.inf, "none (one site)")
    bus_bytes_per_s = min(site.nic_bytes_per_s_per_gpu, link.bytes_per_s / groups)
    bound = "the WAN link" if link.bytes_per_s / groups <= site.nic_bytes_per_s_per_gpu else "each GPU's NIC"
    alpha_s = link.latency_s + site_path_latency_s(site)
    time_s = member_bytes * bus_factor(op, sites) / bus_bytes_per_s + ring_latency_steps(op, sites) * alpha_s
    where = (f"{link.describe()}, shared by {groups:,} {op}s ({bus_bytes_per_s / 1e9:.3g} GB/s each, bound by "
             f"{bound})")
    return CollectiveCost(op, member_bytes, sites, time_s, bus_bytes_per_s, where)
