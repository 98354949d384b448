"""GPU-hours priced on every cloud offer for a GPU and on an owned cluster, with break-even against one offer
(`gpufleet cost`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.catalog.economics_records import CloudOffer, FacilityDefaults
from gpufleet.catalog.records import NetworkSpec, NodeSpec
from gpufleet.catalog.registry import Catalog
from gpufleet.economics.cloud import (
    OfferCost,
    SkippedOffer,
    cost_of_gpu_hours,
    offer,
    offers_for_gpu,
    reference_offer,
    split_by_size,
)
from gpufleet.economics.tco import OnPremTco, onprem_tco
from gpufleet.errors import CatalogError, InputError


@dataclass(frozen=True)
class CostInputs:
    """What to price: GPU-hours of a GPU, the owned cluster to compare (node, size, facility) and the offers."""

    gpu: str
    gpu_hours: float
    node: NodeSpec
    gpus: int  # the owned cluster's size (and the cluster the offers must supply when `size_known`)
    defaults: FacilityDefaults
    network: NetworkSpec | None = None  # the owned cluster's scale-out network (None: the node's has none)
    pricing: tuple[str, ...] = ()  # only these pricing models (empty: all)
    against: str | None = None  # the offer for break-even (None: the GPU's reference on-demand offer)
    size_known: bool = False  # the user gave the cluster size: skip offers that cannot supply it


@dataclass(frozen=True)
class CostComparison:
    """Every offer's bill (cheapest first), the offers too small for the cluster, and the owned cluster's (None,
    with `onprem_missing` saying why, when the catalog cannot price it: no purchase price for its node)."""

    request: CostInputs
    costs: tuple[OfferCost, ...]
    skipped: tuple[SkippedOffer, ...]
    tco: OnPremTco | None
    against: CloudOffer
    onprem_missing: str | None = None

    @property
    def utilization(self) -> float:
        return self.request.defaults.fleet_utilization

    @property
    def onprem_usd_per_gpu_hour(self) -> float | None:
        return None if self.tco is None else self.tco.usd_per_gpu_hour(self.utilization)

    @property
    def breakeven_utilization(self) -> float | None:
        return None if self.tco is None else self.tco.breakeven_utilization(self.against.usd_per_gpu_hour)

    @property
    def breakeven_months(self) -> float | None:
        if self.tco is None:
            return None
        return self.tco.breakeven_months(self.against.usd_per_gpu_hour, self.utilization)

    def onprem_line(self) -> str:
        """One sentence on the owned cluster: its capex, yearly cost and break-even, or what it lacks."""
        tco, u, gpus = self.tco, self.utilization, self.request.gpus
        if tco is None:
            return f"On-prem {gpus} GPUs not priced: {self.onprem_missing}. The cloud offers above stand alone."
        months, breakeven = self.breakeven_months, self.breakeven_utilization
        return (f"On-prem {gpus} GPUs: capex ${tco.capex.total_usd:,.0f}, ${tco.annual_usd(u):,.0f}/year at "
                f"{u:.0%}. Against {self.against.id} (${self.against.usd_per_gpu_hour:g}/GPU-h): break-even at "
                + (f"{breakeven:.0%} utilization" if breakeven is not None else "no utilization <= 100%")
                + (f", capex repaid in {months:.1f} months at {u:.0%}." if months is not None
                   else "; the cloud is cheaper to run."))

    def onprem_dict(self) -> dict[str, Any] | None:
        """The owned cluster's figures as `cost --json` writes them ("onprem"; null when it is not priced)."""
        tco, u, rate = self.tco, self.utilization, self.onprem_usd_per_gpu_hour
        if tco is None or rate is None:
            return None
        return {
            "gpus": self.request.gpus,
            "node": self.request.node.id,
            "utilization": u,
            "amortization_years": self.request.defaults.amortization_years,
            "usd_per_gpu_hour": rate,
            "usd": rate * self.request.gpu_hours,
            # every hour of the year, busy or idle (usd_per_gpu_hour is per *useful* hour), and an idle hour's power
            "usd_per_gpu_hour_owned": tco.usd_per_gpu_hour_owned(u),
            "idle_energy_usd_per_gpu_hour": tco.idle_energy_usd_per_gpu_hour,
            "capex_usd": tco.capex.total_usd,
            "capex": {
                "servers_usd": tco.capex.servers_usd,
                "switches_usd": tco.capex.switches_usd,
                "optics_usd": tco.capex.optics_usd,
                "storage_usd": tco.capex.storage_usd,
                "facility_usd": tco.capex.facility_usd,
            },
            "annual_usd": tco.annual_usd(u),
            "opex_usd_per_month": tco.opex_usd_per_month(u),
            "against_offer": self.against.id,
            "against_usd_per_gpu_hour": self.against.usd_per_gpu_hour,
            "breakeven_utilization": self.breakeven_utilization,
            "breakeven_months": self.breakeven_months,
        }


def _offers(catalog: Catalog, gpu: str, pricing: Sequence[str]) -> list[CloudOffer]:
    """The GPU's offers of the given pricing models; none is a catalog error naming what there is."""
    offers = offers_for_gpu(catalog, gpu, pricing or None)
    if not offers:
        sold = sorted({o.pricing for o in offers_for_gpu(catalog, gpu)})
        raise CatalogError(
            f"no cloud offer for GPU {gpu!r}" + (f" with --pricing {', '.join(pricing)}" if pricing else "")
            + (f"; its offers are {', '.join(sold)}" if sold and pricing else "")
            + ("" if sold else "; add one under 'cloud_offers:' (--catalog FILE)")
        )
    return offers


def compare_costs(catalog: Catalog, request: CostInputs) -> CostComparison:
    """Price the GPU-hours on every offer (those that can supply the cluster, when its size is known) and on the
    owned cluster, against the break-even offer."""
    offers = _offers(catalog, request.gpu, request.pricing)
    offers, skipped = split_by_size(offers, request.gpus) if request.size_known else (offers, [])
    costs = sorted((cost_of_gpu_hours(o, request.gpu_hours) for o in offers), key=lambda c: (c.usd, c.name))
    against = offer(catalog, request.against) if request.against else reference_offer(catalog, request.gpu)
    if against.gpu != request.gpu:
        raise InputError(f"--offer {against.id} rents {against.gpu}, not {request.gpu}")
    try:
        tco: OnPremTco | None = onprem_tco(catalog, request.node, request.gpus, request.defaults, request.network)
        missing = None
    except CatalogError as error:  # no purchase price for the node (or its switches): price the offers alone
        tco, missing = None, str(error).split(";")[0]
    return CostComparison(request, tuple(costs), tuple(skipped), tco, against, missing)
