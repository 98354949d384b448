"""What `gpufleet cost` and `gpufleet facility` ask, as typed requests, and their answers.

Each request owns the rules and defaults its command applies before the catalog is read (ranges, flags that go
together, the owned cluster's default size); the `*_report` functions resolve the hardware and the catalog's
facility defaults (a flag given overrides its field, and a bad value names the flag) and compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast, get_args

from pydantic import model_validator

from gpufleet.catalog.economics_records import FacilityDefaults, Pricing
from gpufleet.catalog.records import NodeSpec
from gpufleet.catalog.registry import DEFAULT_GPU, Catalog
from gpufleet.economics.compare import CostComparison, CostInputs, compare_costs
from gpufleet.economics.defaults import facility_defaults
from gpufleet.economics.facility import FacilityEstimate, estimate_facility
from gpufleet.errors import InputError
from gpufleet.fabric.requests import node_network, resolve_node
from gpufleet.request import Request
from gpufleet.units import parse_count

#: The facility flags that override a FacilityDefaults field, so that a bad value names the flag.
FACILITY_FLAGS = {"rack_kw": "--rack-kw", "pue": "--pue", "usd_per_kwh": "--usd-per-kwh",
                  "amortization_years": "--years", "fleet_utilization": "--utilization"}
#: The largest --rack-kw taken (judgement: 10x the ~1 MW racks announced for 2027; far above it the rack count
#: is meaningless and the power arithmetic overflows).
MAX_RACK_KW = 10_000
#: The owned cluster `cost` prices when neither --gpus nor --plan gives its size.
DEFAULT_ONPREM_GPUS = 512


class FacilityRequest(Request):
    """N GPUs in the node given (or the GPU's default node), with facility defaults overridden where given."""

    gpus: int
    node: str | None = None
    gpu: str | None = None
    rack_kw: float | None = None
    pue: float | None = None
    usd_per_kwh: float | None = None
    mfu: float | None = None

    @model_validator(mode="after")
    def _check(self) -> FacilityRequest:
        if self.gpus < 1:
            raise InputError(f"--gpus must be at least 1, got {self.gpus}")
        if self.rack_kw is not None and self.rack_kw > MAX_RACK_KW:
            raise InputError(f"--rack-kw {self.rack_kw:g} is more than {MAX_RACK_KW:,} kW, the most a rack is "
                             "taken to draw (the densest racks announced draw about 1 MW)")
        if self.mfu is not None and not 0 < self.mfu <= 1:
            raise InputError(f"--mfu must be in (0, 1], got {self.mfu:g}")
        return self


@dataclass(frozen=True)
class FacilityReport:
    node: NodeSpec
    defaults: FacilityDefaults
    estimate: FacilityEstimate
    data: dict[str, Any]


def facility_report(request: FacilityRequest, catalog: Catalog) -> FacilityReport:
    """IT power at maximum and typical load, racks, cooling, facility power and annual energy."""
    spec = resolve_node(catalog, request.node, request.gpu)
    defaults = facility_defaults(catalog, flags=FACILITY_FLAGS, rack_kw=request.rack_kw, pue=request.pue,
                                 usd_per_kwh=request.usd_per_kwh)
    est = estimate_facility(spec, request.gpus, defaults, node_network(catalog, spec), mfu=request.mfu)
    data: dict[str, Any] = {
        "gpus": est.gpus,
        "node": spec.id,
        "nodes": est.nodes,
        "it_power_max_w": est.it_power_max_w,
        "it_power_typical_w": est.it_power_typical_w,
        "nodes_power_max_w": est.nodes_w_max,
        "fabric_power_w": est.fabric_w,
        "storage_power_w": est.storage_w,
        "switches": est.fabric.switches,
        "racks": est.racks,
        "nodes_per_rack": est.nodes_per_rack,
        "rack_power_w": est.rack_w,
        "cooling": est.cooling,
        "pue": est.pue,
        "facility_power_w": est.facility_power_w,
        "annual_energy_kwh": est.annual_energy_kwh,
        "annual_energy_usd": est.annual_energy_usd,
        "usd_per_kwh": defaults.usd_per_kwh,
    }
    return FacilityReport(spec, defaults, est, data)


@dataclass(frozen=True)
class PlannedRun:
    """What `cost --plan` takes from a `gpufleet plan --json` file: its best plan's GPU-hours and its cluster."""

    gpu_hours: float
    gpu: str
    gpus: int
    node: str | None


SINGLE_PLAN_HINT = "run `gpufleet plan` with a single --gpus N (no --deadline) and --json to get one"


def read_plan(path: Path) -> PlannedRun:
    """The best plan of a single-count `gpufleet plan --json` file (a sweep over GPU counts is refused), read
    through the plan file's schema (gpufleet.planfile)."""
    from gpufleet.input_files import load_json
    from gpufleet.planfile import read_plan_file

    data = load_json(path, "plan file", f"--plan takes a `gpufleet plan --json` output: {SINGLE_PLAN_HINT}")
    saved = read_plan_file(data, str(path))
    if saved.sweep is not None:
        counts = ", ".join(str(row.gpus) for row in saved.sweep)
        raise InputError(f"{path} is a scaling sweep (`gpufleet plan` over several GPU counts or with --deadline: "
                         f"{counts}); --plan prices one plan: {SINGLE_PLAN_HINT}")
    if saved.cluster is None or not saved.plans:
        raise InputError(f"{path} holds no plan to price (the search found none): {SINGLE_PLAN_HINT}")
    cluster, seconds = saved.cluster, saved.plans[0].time_to_train_s
    return PlannedRun(cluster.gpus * seconds / 3600.0, cluster.gpu, cluster.gpus, cluster.node)


class CostRequest(Request):
    """GPU-hours to price (`gpu_hours`, e.g. '2.5M', or the best plan of a `plan --json` file), on every cloud
    offer for the GPU and on an owned cluster, with break-even against one offer."""

    gpu_hours: str | None = None
    plan: Path | None = None
    gpu: str | None = None
    node: str | None = None
    #: the owned cluster's size; None: the plan's, else DEFAULT_ONPREM_GPUS (then offers are not size-checked)
    gpus: int | None = None
    offer: str | None = None
    utilization: float | None = None
    years: float | None = None
    pue: float | None = None
    usd_per_kwh: float | None = None
    pricing: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> CostRequest:
        if (self.gpu_hours is None) == (self.plan is None):
            raise InputError("give exactly one of --gpu-hours H or --plan PLAN.json")
        if self.gpu_hours is not None:
            parse_count(self.gpu_hours, "--gpu-hours")  # refuses non-finite counts (units._positive_finite)
        if self.utilization is not None and not 0 < self.utilization <= 1:
            raise InputError(f"--utilization must be in (0, 1], got {self.utilization:g}")
        if self.plan is None and self.gpus is not None and self.gpus < 1:
            raise InputError(f"--gpus must be at least 1, got {self.gpus}")
        for model in self.pricing:
            if model not in get_args(Pricing):
                raise InputError(f"--pricing {model!r} is not one of {', '.join(get_args(Pricing))}")
        return self

    def planned(self, catalog: Catalog) -> tuple[float, str, int, str | None, bool]:
        """GPU-hours, GPU, owned-cluster size, node (None: the GPU's) and whether the size was given."""
        if self.gpu_hours is not None:
            gpu = self.gpu or (catalog.node(self.node).gpu if self.node else DEFAULT_GPU)
            size = DEFAULT_ONPREM_GPUS if self.gpus is None else self.gpus
            return parse_count(self.gpu_hours, "--gpu-hours"), gpu, size, self.node, self.gpus is not None
        path = cast(Path, self.plan)  # the validator's rule: --gpu-hours or --plan
        planned = read_plan(path)
        if self.gpu is not None and self.gpu != planned.gpu:
            raise InputError(f"--gpu {self.gpu} contradicts --plan {path}, which plans {planned.gpu} GPUs; "
                             "leave out --gpu (its GPU-hours are the plan's)")
        if self.gpus is not None and self.gpus != planned.gpus:
            raise InputError(f"--gpus {self.gpus} contradicts --plan {path}, which plans {planned.gpus} GPUs; "
                             f"leave out --gpus, or plan again with --gpus {self.gpus}")
        if self.node is not None and catalog.node(self.node).gpu != planned.gpu:
            raise InputError(f"--node {self.node} holds {catalog.node(self.node).gpu} GPUs, but --plan {path} plans "
                             f"{planned.gpu} GPUs; leave out --node (the plan's is {planned.node})")
        return planned.gpu_hours, planned.gpu, planned.gpus, self.node or planned.node, True


@dataclass(frozen=True)
class CostReport:
    gpu: str
    gpu_hours: float
    gpus: int
    comparison: CostComparison
    data: dict[str, Any]


def cost_report(request: CostRequest, catalog: Catalog) -> CostReport:
    """Every offer's bill for the GPU-hours, the offers too small for the cluster, and the owned cluster's TCO."""
    hours, gpu, gpus, node, size_known = request.planned(catalog)
    spec = resolve_node(catalog, node, gpu)
    defaults = facility_defaults(catalog, flags=FACILITY_FLAGS, pue=request.pue, usd_per_kwh=request.usd_per_kwh,
                                 amortization_years=request.years, fleet_utilization=request.utilization)
    compared = compare_costs(catalog, CostInputs(gpu, hours, spec, gpus, defaults, node_network(catalog, spec),
                                                 request.pricing, request.offer, size_known))
    data: dict[str, Any] = {
        "gpu": gpu,
        "gpu_hours": hours,
        "offers": [
            {"name": c.name, "provider": c.provider, "sku": c.sku, "pricing": c.pricing,
             "usd_per_gpu_hour": c.usd_per_gpu_hour, "usd": c.usd, "as_of": c.as_of}
            for c in compared.costs
        ],
        "skipped_offers": [{"name": o.name, "max_gpus": o.max_gpus, "beyond": o.beyond, "reason": o.reason}
                           for o in compared.skipped],
        "onprem": compared.onprem_dict(),
        "onprem_missing": compared.onprem_missing,
    }
    return CostReport(gpu, hours, gpus, compared, data)
