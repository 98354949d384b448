"""Power, racks and cooling for N GPUs in nodes of one type.

IT power at maximum is what the facility must provision (nodes at their PSU-rated maximum, switches,
storage); typical power is what it draws while training, which sets the energy bill. A node's draw at a
given MFU is interpolated linearly between idle and its catalog `typical_power_w` (reached at the
facility default `typical_mfu`), capped at maximum: a judgement, see docs/economics.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from gpufleet.catalog.economics_records import FacilityDefaults
from gpufleet.catalog.records import NetworkSpec, NodeSpec
from gpufleet.economics.network import FabricBom, fat_tree_bom
from gpufleet.errors import InputError

HOURS_PER_YEAR = 8760.0
Cooling = Literal["air", "rear-door", "direct-liquid"]


@dataclass(frozen=True)
class FacilityEstimate:
    gpus: int
    nodes: int
    node_max_w: float
    node_typical_w: float
    nodes_w_max: float
    fabric_w: float
    storage_w: float
    it_power_max_w: float
    it_power_typical_w: float
    nodes_per_rack: int
    nodes_per_rack_by_power: int
    nodes_per_rack_by_units: int
    racks: int
    rack_w: float
    cooling: Cooling
    pue: float
    facility_power_w: float
    annual_energy_kwh: float
    annual_energy_usd: float
    fabric: FabricBom


def nodes_for(gpus: int, node: NodeSpec) -> int:
    if gpus < 1:
        raise InputError(f"GPU count must be at least 1, got {gpus}")
    return math.ceil(gpus / node.gpus)


def node_power_w(node: NodeSpec, defaults: FacilityDefaults, mfu: float | None = None) -> float:
    """A node's average draw while training at `mfu` (default: its typical power)."""
    typical = node.typical_power_w if node.typical_power_w is not None else node.max_power_w
    if mfu is None:
        return typical
    if not 0 < mfu <= 1:
        raise InputError(f"MFU must be in (0, 1], got {mfu!r}")
    idle = defaults.node_idle_fraction * node.max_power_w
    return min(node.max_power_w, idle + (typical - idle) * mfu / defaults.typical_mfu)


def scale_out_fabric(node: NodeSpec, nodes: int, network: NetworkSpec | None) -> FabricBom:
    """The compute fabric: one port per compute NIC; none for a single node or without a network."""
    if network is None or nodes == 1:
        return FabricBom(0, network.switch_radix if network else 0, 0, 0, 0, 0, 0)
    return fat_tree_bom(nodes * node.nics, network.switch_radix)


def cooling_for(rack_w: float, defaults: FacilityDefaults) -> Cooling:
    if rack_w <= defaults.air_max_kw_per_rack * 1e3:
        return "air"
    if rack_w <= defaults.rear_door_max_kw_per_rack * 1e3:
        return "rear-door"
    return "direct-liquid"


def estimate_facility(
    node: NodeSpec,
    gpus: int,
    defaults: FacilityDefaults,
    network: NetworkSpec | None = None,
    *,
    mfu: float | None = None,
) -> FacilityEstimate:
    nodes = nodes_for(gpus, node)
    if not node.rack_scale and node.max_power_w > defaults.rack_w:
        raise InputError(
            f"one {node.id} node draws up to {node.max_power_w / 1e3:g} kW, more than a "
            f"{defaults.rack_kw:g} kW rack; raise the rack's power (`facility --rack-kw`, or facility_defaults "
            "rack_kw in a --catalog file)"
        )
    if not node.rack_scale and node.rack_units > defaults.rack_units_usable:
        raise InputError(f"a {node.id} node ({node.rack_units}U) does not fit the {defaults.rack_units_usable}U a "
                         "rack leaves for nodes (set facility_defaults rack_units_usable in a --catalog file)")
    fabric = scale_out_fabric(node, nodes, network)
    switch_w = defaults.switch_power_w
    if network is not None and network.switch_power_w is not None:
        switch_w = network.switch_power_w
    fabric_w = fabric.switches * switch_w
    storage_w = gpus * defaults.storage_tb_per_gpu * defaults.storage_w_per_tb
    node_typical = node_power_w(node, defaults, mfu)
    it_max = nodes * node.max_power_w + fabric_w + storage_w
    it_typical = nodes * node_typical + fabric_w + storage_w
    by_power = 1 if node.rack_scale else int(defaults.rack_w // node.max_power_w)
    by_units = 1 if node.rack_scale else defaults.rack_units_usable // node.rack_units
    per_rack = min(by_power, by_units)
    racks = math.ceil(nodes / per_rack)
    rack_w = min(per_rack, nodes) * node.max_power_w
    annual_kwh = it_typical * defaults.pue * HOURS_PER_YEAR / 1e3
    return FacilityEstimate(
        gpus=gpus,
        nodes=nodes,
        node_max_w=node.max_power_w,
        node_typical_w=node_typical,
        nodes_w_max=nodes * node.max_power_w,
        fabric_w=fabric_w,
        storage_w=storage_w,
        it_power_max_w=it_max,
        it_power_typical_w=it_typical,
        nodes_per_rack=per_rack,
        nodes_per_rack_by_power=by_power,
        nodes_per_rack_by_units=by_units,
        racks=racks,
        rack_w=rack_w,
        cooling=cooling_for(rack_w, defaults),
        pue=defaults.pue,
        facility_power_w=it_max * defaults.pue,
        annual_energy_kwh=annual_kwh,
        annual_energy_usd=annual_kwh * defaults.usd_per_kwh,
        fabric=fabric,
    )
