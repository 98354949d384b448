"""Catalog records for money, facilities and failures: cloud offers, purchase prices, facility defaults,
published failure statistics and the run defaults the reliability model uses.

Every price carries `source:` and `as_of:`; purchase prices carry `estimate: true` (they are quotes and
analysts' estimates, never list prices). Defaults that are judgement calls say so in `source`/`note` and
are explained in docs/economics.md. YAML keys carry human units (`usd_per_kwh`, `rack_kw`, `gb_per_s`);
properties expose SI (`rack_w`, `bytes_per_s`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from gpufleet.catalog.records import RECORD_CONFIG, Record

Pricing = Literal[
    "on-demand", "spot", "reserved-1y", "reserved-3y", "committed", "capacity-block", "flex-start",
    "marketplace",
]


class OfferCapacity(BaseModel):
    """The largest cluster a provider sells under one offer at its listed price, and what happens above it."""

    model_config = RECORD_CONFIG

    max_gpus: int = Field(ge=1, description="the most GPUs one customer gets at this price, in one cluster")
    beyond: Literal["ask", "none"] = Field(
        description="above max_gpus: 'ask' (larger clusters by quote, at a price the catalog does not know) or "
        "'none' (not sold this way at all)")
    source: str = Field(min_length=3, description="where max_gpus comes from, or why it was chosen")
    judgement: bool = Field(default=False, description="true: no published figure was found; source says why")


class CloudOffer(Record):
    """One cloud provider's price for one GPU SKU under one pricing model, at one date."""

    provider: str = Field(min_length=1)
    sku: str = Field(min_length=1)
    gpu: str = Field(min_length=1, description="catalog GPU id (e.g. h100-sxm)")
    pricing: Pricing
    usd_per_gpu_hour: float = Field(gt=0)
    usd_per_node_hour: float | None = Field(default=None, gt=0)
    gpus_per_node: int = Field(default=8, ge=1)
    region: str | None = None
    as_of: str = Field(min_length=4)
    capacity: OfferCapacity | None = Field(
        default=None, description="the largest cluster sold at this price (absent: not stated, never checked)")

    @property
    def name(self) -> str:
        """One-line summary (used by `gpufleet catalog list`)."""
        return f"{self.provider} {self.sku} {self.pricing}: ${self.usd_per_gpu_hour:g}/GPU-h ({self.as_of})"

    @model_validator(mode="after")
    def _node_price_consistent(self) -> CloudOffer:
        if self.usd_per_node_hour is not None:
            implied = self.usd_per_node_hour / self.gpus_per_node
            if abs(implied - self.usd_per_gpu_hour) > 0.02 * self.usd_per_gpu_hour:
                raise ValueError(
                    f"usd_per_node_hour {self.usd_per_node_hour:g} / {self.gpus_per_node} GPUs = "
                    f"{implied:.3f} "
                    f"disagrees with usd_per_gpu_hour {self.usd_per_gpu_hour:g} by more than 2%"
                )
        return self


PurchaseKind = Literal["server", "switch", "optics_per_link", "storage_per_tb", "gpu", "rack_system"]


class PurchasePrice(Record):
    """An estimated purchase price: a server (by node id), a switch (by network id), optics, storage."""

    kind: PurchaseKind
    item: str = Field(min_length=1, description="what was priced, in words")
    usd: float = Field(gt=0, description="the point estimate gpufleet uses")
    usd_low: float | None = Field(default=None, gt=0)
    usd_high: float | None = Field(default=None, gt=0)
    node: str | None = Field(default=None, description="catalog node id, for kind=server")
    network: str | None = Field(default=None, description="catalog network id, for switch/optics")
    estimate: bool = Field(description="true for every analyst estimate or reseller quote")
    as_of: str = Field(min_length=4)

    @property
    def name(self) -> str:
        return f"{self.item}: ${self.usd:,.0f} (estimate, {self.as_of})"

    @model_validator(mode="after")
    def _range_holds_point(self) -> PurchasePrice:
        low = self.usd_low if self.usd_low is not None else self.usd
        high = self.usd_high if self.usd_high is not None else self.usd
        if not low <= self.usd <= high:
            raise ValueError(f"usd {self.usd:g} lies outside usd_low..usd_high {low:g}..{high:g}")
        if self.kind == "server" and self.node is None:
            raise ValueError("a server price needs `node:` (a catalog node id)")
        if self.kind in ("switch", "optics_per_link") and self.network is None:
            raise ValueError(f"a {self.kind} price needs `network:` (a catalog network id)")
        return self


#: The id of the facility_defaults and reliability_defaults entries the commands read.
DEFAULT_ID = "default"


class FacilityDefaults(Record):
    """Facility and operations assumptions for power, racks, cooling and on-prem TCO (judgement calls)."""

    pue: float = Field(ge=1.0, le=3.0)
    usd_per_kwh: float = Field(gt=0)
    rack_kw: float = Field(gt=0, description="power a rack may draw")
    rack_units_usable: int = Field(ge=1, description="U per rack left for nodes after PDUs, patch panels")
    air_max_kw_per_rack: float = Field(gt=0)
    rear_door_max_kw_per_rack: float = Field(gt=0)
    switch_power_w: float = Field(gt=0, description="per switch incl. optics, when the network lacks one")
    storage_tb_per_gpu: float = Field(ge=0)
    storage_w_per_tb: float = Field(ge=0)
    node_idle_fraction: float = Field(gt=0, lt=1, description="idle node power / max node power")
    typical_mfu: float = Field(gt=0, le=1, description="MFU at which a node draws typical_power_w")
    amortization_years: float = Field(gt=0)
    fleet_utilization: float = Field(gt=0, le=1, description="fraction of hours an owned cluster does work")
    gpus_per_engineer: float = Field(gt=0)
    usd_per_engineer_year: float = Field(ge=0)
    maintenance_fraction_per_year: float = Field(ge=0, le=1, description="of hardware capex")
    colocation_usd_per_kw_month: float = Field(ge=0, description="rack rent per kW of IT capacity")
    facility_upgrade_usd_per_kw: float = Field(ge=0, description="capex per kW of IT capacity")
    as_of: str = Field(min_length=4)

    @property
    def name(self) -> str:
        return f"PUE {self.pue:g}, ${self.usd_per_kwh:g}/kWh, {self.rack_kw:g} kW racks (judgement defaults)"

    @model_validator(mode="after")
    def _cooling_tiers_ordered(self) -> FacilityDefaults:
        if self.rear_door_max_kw_per_rack < self.air_max_kw_per_rack:
            raise ValueError("rear_door_max_kw_per_rack must be at least air_max_kw_per_rack")
        return self

    @property
    def rack_w(self) -> float:
        return self.rack_kw * 1e3

    @property
    def usd_per_joule(self) -> float:
        return self.usd_per_kwh / 3.6e6


class FailureStats(Record):
    """A published count of job interruptions on a known fleet over a known time."""

    gpu: str | None = Field(default=None, description="catalog GPU id, when one applies")
    gpus: int = Field(ge=1)
    days: float = Field(gt=0)
    unexpected_interruptions: int = Field(ge=0)
    planned_interruptions: int = Field(default=0, ge=0)
    effective_training_fraction: float | None = Field(default=None, gt=0, le=1)
    causes: dict[str, int] = Field(default_factory=dict)

    @property
    def name(self) -> str:
        return (f"{self.unexpected_interruptions} unexpected interruptions, "
                f"{self.gpus} GPUs, {self.days:g} days")

    @model_validator(mode="after")
    def _causes_add_up(self) -> FailureStats:
        if self.causes and sum(self.causes.values()) != self.unexpected_interruptions:
            raise ValueError(
                f"causes add up to {sum(self.causes.values())}, not unexpected_interruptions "
                f"{self.unexpected_interruptions}"
            )
        return self

    @property
    def gpu_seconds(self) -> float:
        return self.gpus * self.days * 86400.0

    @property
    def interruptions_per_gpu_s(self) -> float:
        """Unexpected interruptions per GPU-second (the Poisson rate one GPU contributes to a job)."""
        return self.unexpected_interruptions / self.gpu_seconds


class ReliabilityDefaults(Record):
    """Assumptions for checkpointing and restarts (judgement calls, see docs/economics.md)."""

    failure_stats: str = Field(description="id of the failure_stats record used by default")
    restart_min: float = Field(ge=0, description="detect + reschedule + reload, minutes")
    checkpoint_write_gb_per_s_per_node: float = Field(gt=0, description="GB/s each node writes")
    checkpoint_write_gb_per_s_max: float = Field(gt=0, description="aggregate cap of the storage system")
    optimizer_bytes_per_param: float = Field(ge=0, description="fp32 master + Adam m, v")
    weight_bytes_per_param: float = Field(gt=0)

    @property
    def name(self) -> str:
        return f"failures from {self.failure_stats}, restart {self.restart_min:g} min (judgement defaults)"

    @property
    def restart_s(self) -> float:
        return self.restart_min * 60.0

    @property
    def write_bytes_per_s_per_node(self) -> float:
        return self.checkpoint_write_gb_per_s_per_node * 1e9

    @property
    def write_bytes_per_s_max(self) -> float:
        return self.checkpoint_write_gb_per_s_max * 1e9


#: catalog kinds this module adds (registered in registry.KINDS)
ECONOMICS_KINDS: dict[str, type[Record]] = {
    "cloud_offers": CloudOffer,
    "purchase_prices": PurchasePrice,
    "facility_defaults": FacilityDefaults,
    "failure_stats": FailureStats,
    "reliability_defaults": ReliabilityDefaults,
}
