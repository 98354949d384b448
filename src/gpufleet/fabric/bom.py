"""Bill of materials of a built topology: switches per tier, ports used and free, cables, optics, power.

Cable rule (judgement, documented): a node's NIC to its leaf is a copper DAC when the leaf sits in the
node's rack (non-rail fat-tree / leaf-spine leaves are top-of-rack: copper); rail-optimized leaves
serve many racks (optics), and every switch-to-switch link leaves the rack (optics: a transceiver at
each end). Fabric power = switches x the network's `switch_power_w` (null in the catalog where no
primary figure exists: the BOM then says so instead of guessing) + 2 transceivers per optical link at
`OPTIC_POWER_W` (QM97xx user manual: OSFP cages support Class 8, up to 17 W per cage, 2 ports each).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpufleet.fabric.graph import CORE, LEAF, NIC, SPINE, FabricGraph
from gpufleet.fabric.topology import Cluster

#: Power per transceiver end: half of a 17 W twin-port OSFP cage (QM97xx user manual, Class 8).
OPTIC_POWER_W = 8.5


@dataclass(frozen=True, slots=True)
class TierCount:
    tier: str
    switches: int
    ports_used: int
    ports_free: int


@dataclass(frozen=True, slots=True)
class Bom:
    tiers: tuple[TierCount, ...]
    copper_cables: int
    optical_cables: int
    transceivers: int
    switch_power_w: float | None  # None: the catalog has no switch power for this network
    optics_power_w: float

    @property
    def switches(self) -> int:
        return sum(t.switches for t in self.tiers)

    @property
    def fabric_power_w(self) -> float | None:
        return None if self.switch_power_w is None else self.switch_power_w + self.optics_power_w


def bill_of_materials(graph: FabricGraph, cluster: Cluster) -> Bom:
    """Count what `graph` (built from `cluster`) needs."""
    radix = cluster.fabric.network.switch_radix
    tiers = []
    for kind, name in ((LEAF, "leaf"), (SPINE, "spine"), (CORE, "core")):
        vertices = np.flatnonzero(graph.kind == kind)
        if len(vertices) == 0:
            continue
        ports = int(np.isin(graph.src, vertices).sum())  # one outgoing link per used port
        tiers.append(TierCount(name, len(vertices), ports, len(vertices) * radix - ports))
    nic_links = int(np.count_nonzero((graph.kind[graph.src] == NIC) & (graph.kind[graph.dst] == LEAF)))
    leaf = np.flatnonzero(graph.kind == LEAF)
    switch_links = int(np.count_nonzero(np.isin(graph.src, leaf) & (graph.kind[graph.dst] >= SPINE)))
    spine = np.flatnonzero(graph.kind == SPINE)
    switch_links += int(np.count_nonzero(np.isin(graph.src, spine) & (graph.kind[graph.dst] == CORE)))
    rail = cluster.fabric.kind == "rail-optimized"
    copper = 0 if rail else nic_links
    optical = switch_links + (nic_links if rail else 0)
    transceivers = 2 * optical
    power = cluster.fabric.network.switch_power_w
    total_switches = sum(t.switches for t in tiers)
    return Bom(tuple(tiers), copper, optical, transceivers,
               None if power is None else power * total_switches, transceivers * OPTIC_POWER_W)
