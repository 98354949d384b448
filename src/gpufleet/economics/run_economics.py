"""The planner's one call: a training run's time-to-train with failures, its cost per cloud offer and
on-prem, and the power and racks it needs.

    mtti        = 1 / (GPUs x per-GPU interruption rate)              (catalog failure_stats)
    write_s     = checkpoint_bytes / min(nodes x per-node GB/s, cap)  (reliability_defaults; the per-node GB/s
                  measured by bench disk when the GPU's calibration profile has checkpoint_write_gbytes_per_s)
    interval    = Daly's optimum for (write_s, mtti)
    goodput     = Daly's exponential model with the restart time      (reliability_defaults)
    wall_time_s = train_time_s / goodput
    cloud usd   = GPUs rounded up to whole instances x wall hours x $/GPU-hour, per offer for the GPU
    on-prem usd = GPUs x wall hours x on-prem $/GPU-hour at the facility's fleet utilization
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufleet.catalog.calibration_file import measured_write_bytes_per_s
from gpufleet.catalog.economics_records import FailureStats
from gpufleet.catalog.records import NetworkSpec, NodeSpec
from gpufleet.catalog.registry import Catalog
from gpufleet.economics.cloud import OfferCost, SkippedOffer, cost_of_job, offers_for_gpu, split_by_size
from gpufleet.economics.defaults import facility_defaults
from gpufleet.economics.facility import estimate_facility, nodes_for
from gpufleet.economics.tco import onprem_tco
from gpufleet.errors import GpufleetError, InputError
from gpufleet.reliability.checkpoint_interval import write_bandwidth_bytes_per_s
from gpufleet.reliability.defaults import reliability_defaults
from gpufleet.reliability.estimate import estimate_reliability
from gpufleet.reliability.failures import FailureModel


@dataclass(frozen=True)
class RunEconomics:
    gpus: int
    nodes: int
    train_time_s: float
    wall_time_s: float
    goodput: float
    interruptions_per_day: float
    mtti_s: float
    interruptions_expected: float
    lost_gpu_hours: float
    checkpoint_bytes: float
    checkpoint_write_s: float
    checkpoint_interval_s: float
    restart_s: float
    offers: list[OfferCost]  # the offers that sell a cluster of this size, cheapest first
    onprem_usd: float | None
    onprem_usd_per_gpu_hour: float | None
    onprem_utilization: float
    onprem_note: str | None
    it_power_max_w: float
    it_power_typical_w: float
    facility_power_w: float
    energy_kwh: float
    racks: int
    cooling: str
    failure_source: str
    #: offers for the GPU that do not sell a cluster of this size at their listed price (catalog `capacity:`)
    skipped_offers: tuple[SkippedOffer, ...] = ()

    @property
    def cheapest_offer(self) -> OfferCost | None:
        """The cheapest offer whose capacity is not reclaimed at short notice (the goodput prices no preemption),
        else the cheapest of all when only interruptible ones sell the cluster."""
        held = [offer for offer in self.offers if not offer.interruptible]
        return min(held or self.offers, key=lambda offer: offer.usd) if self.offers else None

    @property
    def cheapest_interruptible(self) -> OfferCost | None:
        """The cheapest spot-like offer, shown beside `cheapest_offer`: its price assumes no preemption."""
        spot = [offer for offer in self.offers if offer.interruptible]
        return min(spot, key=lambda offer: offer.usd) if spot else None


def run_economics(
    catalog: Catalog,
    *,
    node: NodeSpec,
    gpus: int,
    train_time_s: float,
    checkpoint_bytes: float,
    utilization_mfu: float | None = None,
) -> RunEconomics:
    """Time-to-train with failures, cost per cloud offer and on-prem, power and racks for one run."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise InputError(f"GPU count must be a positive integer, got {gpus!r}")
    if not (train_time_s > 0 and math.isfinite(train_time_s)):
        raise InputError(f"training time must be positive and finite, got {train_time_s!r} s")
    if not (checkpoint_bytes > 0 and math.isfinite(checkpoint_bytes)):
        raise InputError(f"checkpoint size must be positive, got {checkpoint_bytes!r} bytes")
    facility_cfg = facility_defaults(catalog)
    reliability_cfg = reliability_defaults(catalog)
    failures = FailureModel.from_stats(
        catalog.get("failure_stats", reliability_cfg.failure_stats, FailureStats)
    )
    nodes = nodes_for(gpus, node)
    per_node = measured_write_bytes_per_s(catalog, node.gpu) or reliability_cfg.write_bytes_per_s_per_node
    bandwidth = write_bandwidth_bytes_per_s(
        nodes,
        per_node_bytes_per_s=per_node,
        max_bytes_per_s=reliability_cfg.write_bytes_per_s_max,
    )
    reliability = estimate_reliability(
        failures, gpus=gpus, checkpoint_bytes=checkpoint_bytes, write_bytes_per_s=bandwidth,
        restart_s=reliability_cfg.restart_s, train_time_s=train_time_s,
    )
    wall_s = train_time_s / reliability.goodput
    network = _network(catalog, node)
    facility = estimate_facility(node, gpus, facility_cfg, network, mfu=utilization_mfu)
    selling, skipped = split_by_size(offers_for_gpu(catalog, node.gpu), gpus)
    offers = sorted((cost_of_job(offer, gpus, wall_s) for offer in selling), key=lambda cost: (cost.usd, cost.name))
    utilization = facility_cfg.fleet_utilization
    onprem_usd = onprem_rate = None
    onprem_note = None
    try:
        tco = onprem_tco(catalog, node, gpus, facility_cfg, network, mfu=utilization_mfu)
        onprem_rate = tco.usd_per_gpu_hour(utilization)
        onprem_usd = onprem_rate * nodes * node.gpus * wall_s / 3600.0
    except GpufleetError as error:  # a node without a purchase price: cloud figures still stand
        onprem_note = str(error)
    return RunEconomics(
        gpus=gpus,
        nodes=nodes,
        train_time_s=train_time_s,
        wall_time_s=wall_s,
        goodput=reliability.goodput,
        interruptions_per_day=reliability.interruptions_per_day,
        mtti_s=reliability.mtti_s,
        interruptions_expected=wall_s / reliability.mtti_s,
        lost_gpu_hours=gpus * (wall_s - train_time_s) / 3600.0,
        checkpoint_bytes=checkpoint_bytes,
        checkpoint_write_s=reliability.checkpoint_write_s,
        checkpoint_interval_s=reliability.checkpoint_interval_s,
        restart_s=reliability.restart_s,
        offers=offers,
        onprem_usd=onprem_usd,
        onprem_usd_per_gpu_hour=onprem_rate,
        onprem_utilization=utilization,
        onprem_note=onprem_note,
        it_power_max_w=facility.it_power_max_w,
        it_power_typical_w=facility.it_power_typical_w,
        facility_power_w=facility.facility_power_w,
        energy_kwh=facility.it_power_typical_w * facility.pue * wall_s / 3.6e6,
        racks=facility.racks,
        cooling=facility.cooling,
        failure_source=failures.source_id,
        skipped_offers=tuple(skipped),
    )


def _network(catalog: Catalog, node: NodeSpec) -> NetworkSpec | None:
    """The node's default scale-out network, if the catalog has it."""
    networks = catalog.records("networks")
    record = networks.get(node.default_network)
    return record if isinstance(record, NetworkSpec) else None
