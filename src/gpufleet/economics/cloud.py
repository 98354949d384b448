"""Cloud offers from the catalog and what a job costs on each."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from gpufleet.catalog.economics_records import CloudOffer
from gpufleet.catalog.registry import Catalog
from gpufleet.errors import CatalogError, InputError

#: Pricing kinds whose capacity the provider reclaims at short notice. gpufleet's goodput prices hardware failures and
#: checkpoint restarts, not reclaimed capacity, so a run's cheapest cloud price is taken among the others and these are
#: shown beside it.
INTERRUPTIBLE_PRICING = frozenset({"spot"})


@dataclass(frozen=True)
class OfferCost:
    """One offer's bill for a job: whole nodes for the whole wall time."""

    name: str
    provider: str
    sku: str
    pricing: str
    as_of: str
    usd_per_gpu_hour: float
    gpu_hours: float
    usd: float

    @property
    def interruptible(self) -> bool:
        """The provider may reclaim the nodes at short notice (spot): the run's goodput does not price that."""
        return self.pricing in INTERRUPTIBLE_PRICING


@dataclass(frozen=True)
class SkippedOffer:
    """An offer left out of a comparison because it does not sell a cluster of the size asked for."""

    name: str
    max_gpus: int
    beyond: str  # "ask": larger clusters are quoted; "none": not sold
    judgement: bool  # the size limit is a judgement call (catalog capacity.judgement)

    @property
    def reason(self) -> str:
        limit = f"sells at most {self.max_gpus:,} GPUs at its listed price"
        more = "; ask the provider for a quote above that" if self.beyond == "ask" else "; larger clusters not sold"
        return limit + more + (" (the limit is a judgement call)" if self.judgement else "")


def skipped_for_size(offer: CloudOffer, gpus: int) -> SkippedOffer | None:
    """Why `offer` cannot supply `gpus` GPUs in one cluster, or None when it can (or states no limit)."""
    capacity = offer.capacity
    if capacity is None or billed_gpus(gpus, offer) <= capacity.max_gpus:
        return None
    return SkippedOffer(offer.id, capacity.max_gpus, capacity.beyond, capacity.judgement)


def split_by_size(offers: Iterable[CloudOffer], gpus: int) -> tuple[list[CloudOffer], list[SkippedOffer]]:
    """(offers that sell `gpus` GPUs, the ones that do not and why), each in the order given."""
    selling: list[CloudOffer] = []
    skipped: list[SkippedOffer] = []
    for offer in offers:
        reason = skipped_for_size(offer, gpus)
        if reason is None:
            selling.append(offer)
        else:
            skipped.append(reason)
    return selling, skipped


def describe_skipped(skipped: list[SkippedOffer], gpus: int) -> str:
    """One line on the offers left out for a cluster of `gpus` GPUs, grouped by the most each sells."""
    groups: dict[tuple[int, str], list[str]] = {}
    for item in skipped:
        groups.setdefault((item.max_gpus, item.beyond), []).append(item.name)
    parts = []
    for (most, beyond), names in sorted(groups.items(), key=lambda group: -group[0][0]):
        who = ", ".join(names) if len(names) <= 2 else f"{len(names)} offers"
        parts.append(f"{who} at most {most:,}" + (" (quotes above)" if beyond == "ask" else ""))
    return (f"left out {len(skipped)} cloud offer{'s' if len(skipped) != 1 else ''} that do not sell {gpus:,} GPUs "
            f"at their listed price: {'; '.join(parts)} (--json: skipped_offers)")


def all_offers(catalog: Catalog) -> list[CloudOffer]:
    return [offer for offer in catalog.records("cloud_offers").values() if isinstance(offer, CloudOffer)]


def offers_for_gpu(catalog: Catalog, gpu_id: str, pricing: Iterable[str] | None = None) -> list[CloudOffer]:
    """Offers for one GPU, cheapest first; optionally only some pricing models."""
    wanted = set(pricing) if pricing is not None else None
    found = [o for o in all_offers(catalog) if o.gpu == gpu_id and (wanted is None or o.pricing in wanted)]
    return sorted(found, key=lambda offer: (offer.usd_per_gpu_hour, offer.id))


def offer(catalog: Catalog, name: str) -> CloudOffer:
    return catalog.get("cloud_offers", name, CloudOffer)


def reference_offer(catalog: Catalog, gpu_id: str) -> CloudOffer:
    """The default offer on-prem is compared against: the cheapest on-demand offer for that GPU."""
    candidates = offers_for_gpu(catalog, gpu_id, pricing=["on-demand"])
    if not candidates:
        raise CatalogError(f"no on-demand cloud offer for GPU {gpu_id!r}; add one under 'cloud_offers:'")
    return candidates[0]


def billed_gpus(gpus: int, offer: CloudOffer) -> int:
    """Clouds rent whole instances: round up to the offer's GPUs per node."""
    if gpus < 1:
        raise InputError(f"GPU count must be at least 1, got {gpus}")
    return math.ceil(gpus / offer.gpus_per_node) * offer.gpus_per_node


def cost_of_gpu_hours(offer: CloudOffer, gpu_hours: float) -> OfferCost:
    if gpu_hours < 0 or not math.isfinite(gpu_hours):
        raise InputError(f"GPU-hours must be a finite non-negative number, got {gpu_hours!r}")
    return OfferCost(
        name=offer.id,
        provider=offer.provider,
        sku=offer.sku,
        pricing=offer.pricing,
        as_of=offer.as_of,
        usd_per_gpu_hour=offer.usd_per_gpu_hour,
        gpu_hours=gpu_hours,
        usd=gpu_hours * offer.usd_per_gpu_hour,
    )


def cost_of_job(offer: CloudOffer, gpus: int, wall_time_s: float) -> OfferCost:
    """Bill for `gpus` GPUs (rounded up to whole instances) held for `wall_time_s`."""
    if wall_time_s < 0:
        raise InputError(f"wall time must not be negative, got {wall_time_s!r} s")
    return cost_of_gpu_hours(offer, billed_gpus(gpus, offer) * wall_time_s / 3600.0)
