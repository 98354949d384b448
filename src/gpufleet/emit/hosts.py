"""Operating-system hosts of a plan's cluster, as a scheduler (Slurm, Kubernetes) counts them.

The model counts a scale-up domain as one node: an 8-GPU HGX server, or a whole GB200 NVL72 rack. A scheduler
counts hosts. For a server the two agree; a rack-scale node (`NodeSpec.rack_scale`) is a rack of compute trays,
each its own host with `GPUS_PER_COMPUTE_TRAY` GPUs and an equal share of the rack's NICs.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.emit.spec import TargetCannotExpress
from gpufleet.fabric.topology import Cluster

#: GPUs per compute tray of a rack-scale NVLink system: a GB200 NVL72 rack is 18 compute trays of two GB200
#: superchips (2 Blackwell GPUs + 1 Grace each), 4 GPUs per tray (source: NVIDIA GB200 NVL72 product page and
#: DGX GB200 user guide, recalled; the catalog has no tray field yet).
GPUS_PER_COMPUTE_TRAY = 4


@dataclass(frozen=True)
class HostShape:
    """How the job's GPUs sit on hosts: `hosts` hosts of `gpus_per_host` GPUs and `nics_per_host` NICs, grouped
    `hosts_per_domain` to a scale-up (NVLink) domain."""

    hosts: int
    gpus_per_host: int
    nics_per_host: int
    hosts_per_domain: int

    @property
    def domains(self) -> int:
        return self.hosts // self.hosts_per_domain


def host_shape(cluster: Cluster, target: str) -> HostShape:
    """The hosts a scheduler sees for `cluster`; `target` names the emitter in the refusal when a rack-scale node's
    GPUs do not fill whole compute trays."""
    node = cluster.node
    gpus = cluster.gpus_per_node
    if not node.rack_scale or gpus <= GPUS_PER_COMPUTE_TRAY:
        return HostShape(cluster.num_nodes, gpus, node.nics, 1)
    if gpus % GPUS_PER_COMPUTE_TRAY:
        raise TargetCannotExpress(
            target, f"way to run {gpus} GPUs per {node.id} rack on compute trays of {GPUS_PER_COMPUTE_TRAY} GPUs "
            f"(choose a GPU count whose share per rack is a multiple of {GPUS_PER_COMPUTE_TRAY})", [])
    trays = gpus // GPUS_PER_COMPUTE_TRAY
    return HostShape(cluster.num_nodes * trays, GPUS_PER_COMPUTE_TRAY, max(1, node.nics // trays), trays)


def hostlist(prefix: str, numbers: list[int]) -> str:
    """Slurm's compressed host list: hostlist('node', [1, 2, 3, 7]) == 'node[1-3,7]' (one host: 'node7')."""
    ordered = sorted(set(numbers))
    if len(ordered) == 1:
        return f"{prefix}{ordered[0]}"
    ranges: list[str] = []
    start = previous = ordered[0]
    for number in [*ordered[1:], None]:
        if number is not None and number == previous + 1:
            previous = number
            continue
        ranges.append(str(start) if start == previous else f"{start}-{previous}")
        if number is not None:
            start = previous = number
    return f"{prefix}[{','.join(ranges)}]"
