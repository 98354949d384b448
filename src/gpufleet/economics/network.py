"""Network bill of materials for a non-blocking (1:1) fat tree of radix-k switches.

Al-Fares et al. (SIGCOMM 2008): two tiers hold k^2/2 endpoints with 3k/2 switches, three tiers k^3/4
with 5k^2/4. For E endpoints: leaves = ceil(E / (k/2)); two tiers add ceil(E / k) spines; three tiers
add as many aggregation switches as leaves and ceil(E / k) core switches. NVIDIA's DGX SuperPOD H100 RA
agrees: 1,016 GPUs -> 32 leaf + 16 spine; 4,096 GPUs -> 128 leaf + 128 spine + 64 core (radix 64).
Each tier above the leaves carries as many links as there are endpoints (full bisection).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufleet.errors import InputError


@dataclass(frozen=True)
class FabricBom:
    endpoints: int
    radix: int
    tiers: int
    leaf_switches: int
    spine_switches: int
    core_switches: int
    links: int

    @property
    def switches(self) -> int:
        return self.leaf_switches + self.spine_switches + self.core_switches


def fat_tree_bom(endpoints: int, radix: int) -> FabricBom:
    """Switches and links of the smallest non-blocking fat tree that connects `endpoints` NIC ports."""
    if endpoints < 1:
        raise InputError(f"a fabric needs at least one endpoint, got {endpoints}")
    if radix < 2 or radix % 2:
        raise InputError(f"switch radix must be an even number >= 2, got {radix}")
    half = radix // 2
    if endpoints <= radix:
        return FabricBom(endpoints, radix, 1, 1, 0, 0, endpoints)
    leaves = math.ceil(endpoints / half)
    if endpoints <= radix * radix // 2:
        return FabricBom(endpoints, radix, 2, leaves, math.ceil(endpoints / radix), 0, 2 * endpoints)
    if endpoints <= radix**3 // 4:
        return FabricBom(endpoints, radix, 3, leaves, leaves, math.ceil(endpoints / radix), 3 * endpoints)
    raise InputError(
        f"{endpoints} network ports (one per compute NIC) exceed a three-tier fat tree of radix {radix} "
        f"(max {radix**3 // 4}); "
        "use higher-radix switches or split the job across fabrics"
    )
