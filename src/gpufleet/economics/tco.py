"""On-prem total cost of ownership and break-even against a cloud offer.

    capex          = servers + switches + optics + storage + facility upgrades
    annual(u)      = capex / amortization_years + staff + maintenance% x hardware capex + colocation
                     + energy(u),  energy(u) = (idle + (busy - idle) x u) x PUE x 8760 h x $/kWh
    $/GPU-hour(u)  = annual(u) / (GPUs x 8760 x u)          (u = fraction of hours doing useful work)
    break-even u   : annual(u) = cloud $/GPU-h x GPUs x 8760 x u
                     ->  u = fixed / (cloud x GPUs x 8760 - slope)
    break-even months at u: capex / (cloud monthly bill at u - on-prem monthly opex at u)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufleet.catalog.economics_records import FacilityDefaults, PurchasePrice
from gpufleet.catalog.records import NetworkSpec, NodeSpec
from gpufleet.catalog.registry import Catalog
from gpufleet.economics.facility import HOURS_PER_YEAR, estimate_facility, node_power_w
from gpufleet.errors import CatalogError, InputError

HOURS_PER_MONTH = HOURS_PER_YEAR / 12.0


@dataclass(frozen=True)
class Capex:
    servers_usd: float
    switches_usd: float
    optics_usd: float
    storage_usd: float
    facility_usd: float

    @property
    def hardware_usd(self) -> float:
        return self.servers_usd + self.switches_usd + self.optics_usd + self.storage_usd

    @property
    def total_usd(self) -> float:
        return self.hardware_usd + self.facility_usd


@dataclass(frozen=True)
class IdleCapacityCost:
    """Idle GPU-hours of an owned cluster priced at their electricity and at their share of the owning cost."""

    idle_gpu_hours: float
    electricity_usd: float
    owned_usd: float


@dataclass(frozen=True)
class OnPremTco:
    """Yearly cost of an owned cluster as a function of utilization u in (0, 1]."""

    gpus: int
    capex: Capex
    amortization_years: float
    staff_usd_per_year: float
    maintenance_usd_per_year: float
    colocation_usd_per_year: float
    energy_usd_per_year_idle: float
    energy_usd_per_year_busy: float

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise InputError(f"GPU count must be at least 1, got {self.gpus}")
        if self.amortization_years <= 0:
            raise InputError(f"amortization must be positive, got {self.amortization_years!r} years")

    @property
    def fixed_usd_per_year(self) -> float:
        """What does not depend on utilization: amortized capex, staff, upkeep, rent, idle power."""
        amortized = self.capex.total_usd / self.amortization_years
        upkeep = self.staff_usd_per_year + self.maintenance_usd_per_year + self.colocation_usd_per_year
        return amortized + upkeep + self.energy_usd_per_year_idle

    @property
    def busy_slope_usd_per_year(self) -> float:
        return self.energy_usd_per_year_busy - self.energy_usd_per_year_idle

    def annual_usd(self, utilization: float) -> float:
        _check_utilization(utilization)
        return self.fixed_usd_per_year + self.busy_slope_usd_per_year * utilization

    def opex_usd_per_month(self, utilization: float) -> float:
        return (self.annual_usd(utilization) - self.capex.total_usd / self.amortization_years) / 12.0

    def usd_per_gpu_hour(self, utilization: float) -> float:
        """Cost of one useful GPU-hour when the cluster works a fraction `utilization` of the time."""
        return self.annual_usd(utilization) / (self.gpus * HOURS_PER_YEAR * utilization)

    def usd_per_gpu_hour_owned(self, utilization: float) -> float:
        """Cost of one GPU-hour of the year, busy or idle: the annual cost over every hour (not only useful ones)."""
        return self.annual_usd(utilization) / (self.gpus * HOURS_PER_YEAR)

    @property
    def idle_energy_usd_per_gpu_hour(self) -> float:
        """Electricity of one idle GPU-hour (the node at its idle power, facility overhead included)."""
        return self.energy_usd_per_year_idle / (self.gpus * HOURS_PER_YEAR)

    def idle_capacity_usd(self, idle_gpu_hours: float, utilization: float) -> IdleCapacityCost:
        """What `idle_gpu_hours` of owned capacity cost, valued two ways (seed 000's "10 % idle" claim).

        `electricity_usd`: only the power the idle GPUs still draw (the hardware is paid for anyway). `owned_usd`:
        the idle hours' share of everything the cluster costs (amortized capex, staff, upkeep, rent and power), at
        the all-hours rate `usd_per_gpu_hour_owned`. Not the per-*useful*-hour rate `usd_per_gpu_hour`: that rate
        already spreads the idle hours' cost over the useful ones, so multiplying idle hours by it counts them twice.
        """
        if idle_gpu_hours < 0:
            raise InputError(f"idle GPU-hours must be at least 0, got {idle_gpu_hours!r}")
        return IdleCapacityCost(
            idle_gpu_hours=idle_gpu_hours,
            electricity_usd=idle_gpu_hours * self.idle_energy_usd_per_gpu_hour,
            owned_usd=idle_gpu_hours * self.usd_per_gpu_hour_owned(utilization),
        )

    def breakeven_utilization(self, cloud_usd_per_gpu_hour: float) -> float | None:
        """Utilization above which owning is cheaper than renting; None if never within (0, 1]."""
        _check_price(cloud_usd_per_gpu_hour)
        margin = cloud_usd_per_gpu_hour * self.gpus * HOURS_PER_YEAR - self.busy_slope_usd_per_year
        if margin <= 0:
            return None
        value = self.fixed_usd_per_year / margin
        return value if value <= 1.0 else None

    def breakeven_months(self, cloud_usd_per_gpu_hour: float, utilization: float) -> float | None:
        """Months until the capex is repaid by not paying the cloud; None if the cloud is cheaper to run."""
        _check_price(cloud_usd_per_gpu_hour)
        cloud_monthly = cloud_usd_per_gpu_hour * self.gpus * HOURS_PER_MONTH * utilization
        saving = cloud_monthly - self.opex_usd_per_month(utilization)
        if saving <= 0:
            return None
        return self.capex.total_usd / saving


def _check_utilization(utilization: float) -> None:
    if not 0 < utilization <= 1:
        raise InputError(f"utilization must be in (0, 1], got {utilization!r}")


def _check_price(usd_per_gpu_hour: float) -> None:
    if not (usd_per_gpu_hour > 0 and math.isfinite(usd_per_gpu_hour)):
        raise InputError(f"price must be positive, got {usd_per_gpu_hour!r} $/GPU-hour")


def purchase_price(
    catalog: Catalog, kind: str, *, node: str | None = None, network: str | None = None
) -> float:
    """The catalog's estimate for one kind of purchase (a server for a node, a switch for a network…)."""
    for record in catalog.records("purchase_prices").values():
        if (isinstance(record, PurchasePrice) and record.kind == kind
                and (node is None or record.node == node) and (network is None or record.network == network)):
            return record.usd
    target = f" for node {node!r}" if node else f" for network {network!r}" if network else ""
    raise CatalogError(
        f"no purchase price of kind {kind!r}{target}; add one under 'purchase_prices:' (--catalog FILE)"
    )


def onprem_tco(
    catalog: Catalog,
    node: NodeSpec,
    gpus: int,
    defaults: FacilityDefaults,
    network: NetworkSpec | None,
    *,
    mfu: float | None = None,
) -> OnPremTco:
    """TCO of a cluster of `gpus` GPUs in `node`s, priced from the catalog's purchase estimates."""
    facility = estimate_facility(node, gpus, defaults, network, mfu=mfu)
    server_usd = purchase_price(catalog, "server", node=node.id)
    switches_usd = optics_usd = 0.0
    if facility.fabric.switches and network is not None:
        switches_usd = facility.fabric.switches * purchase_price(catalog, "switch", network=network.id)
        optics_usd = facility.fabric.links * purchase_price(catalog, "optics_per_link", network=network.id)
    capex = Capex(
        servers_usd=facility.nodes * server_usd,
        switches_usd=switches_usd,
        optics_usd=optics_usd,
        storage_usd=gpus * defaults.storage_tb_per_gpu * purchase_price(catalog, "storage_per_tb"),
        facility_usd=facility.it_power_max_w / 1e3 * defaults.facility_upgrade_usd_per_kw,
    )
    always_on_w = facility.fabric_w + facility.storage_w
    idle_w = facility.nodes * defaults.node_idle_fraction * node.max_power_w + always_on_w
    busy_w = facility.nodes * node_power_w(node, defaults, mfu) + always_on_w
    usd_per_watt_year = defaults.pue * HOURS_PER_YEAR / 1e3 * defaults.usd_per_kwh
    return OnPremTco(
        gpus=gpus,
        capex=capex,
        amortization_years=defaults.amortization_years,
        staff_usd_per_year=math.ceil(gpus / defaults.gpus_per_engineer) * defaults.usd_per_engineer_year,
        maintenance_usd_per_year=defaults.maintenance_fraction_per_year * capex.hardware_usd,
        colocation_usd_per_year=facility.it_power_max_w / 1e3 * defaults.colocation_usd_per_kw_month * 12,
        energy_usd_per_year_idle=idle_w * usd_per_watt_year,
        energy_usd_per_year_busy=busy_w * usd_per_watt_year,
    )
