"""The model's judgement constants and fixed fits, as catalog data: each value with why it was chosen.

Two catalog kinds feed one typed view, `Judgements`:

* `judgements:` (`data/judgements.yaml`): numbers chosen by reasoning about kernels and frameworks, or shared
  conventions with a cited source. A record whose value is a call says so: its `source` starts with "judgement".
* `constant_fits:` (`data/fits.yaml`): constants of the model chosen by looking at measured data that are not
  calibration fields (the memory allowance), each with the runs it was chosen on and its out-of-sample check.

A user catalog file (`--catalog`, `$GPUFLEET_CATALOG`) overrides one by id, like any other record:
`Catalog.judgements()` builds the view of that catalog. The model never looks the view up: it is a value passed in.
`StepOptions.judgements` and `MemoryAssumptions.judgements` carry it (None: the catalog that prices the request,
which `make_plan`, `validate` and `launch --check` pass down, else the shipped catalog's, `shipped_judgements()`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field, ValidationError, field_validator

from gpufleet.catalog.records import RECORD_CONFIG, Record
from gpufleet.errors import CatalogError, describe_validation_error

if TYPE_CHECKING:
    from gpufleet.catalog.registry import Catalog


class JudgementRecord(Record):
    """One judgement constant (`judgements:`): its value and why (`source`: "judgement: ..." or a citation)."""

    value: float


class ConstantFit(Record):
    """One constant of the model chosen by looking at measured data (`constant_fits:` in fits.yaml)."""

    value: float
    #: the measured data the value was chosen on (run or table-row ids)
    chosen_on: tuple[str, ...] = Field(min_length=1)
    #: what the error is on data the value was not chosen on (or why there is none)
    out_of_sample: str = Field(min_length=3)

    @field_validator("source")
    @classmethod
    def _says_fit(cls, source: str) -> str:
        if not source.startswith("fit"):
            raise ValueError("a constant fit's source must start with 'fit'")
        return source


class Judgements(BaseModel):
    """The judgement constants and constant fits the model uses, by name (the record id with '_' for '-'),
    each checked for range; `sources` keeps each one's reason."""

    model_config = RECORD_CONFIG

    # step model (perf/)
    router_gemm_fraction: float = Field(gt=0, le=1)
    cpu_adam_slowdown: float = Field(gt=0)
    backward_forward_ratio: float = Field(gt=0)
    ep_imbalance: float = Field(ge=1)
    step_overhead_s: float = Field(ge=0)
    moe_fixed_kernels_fwd: int = Field(ge=0)
    moe_kernels_per_local_expert_fwd: int = Field(ge=0)
    moe_backward_kernel_ratio: float = Field(gt=0)
    moe_router_kernels_fwd: int = Field(ge=0)
    moe_preprocess_kernels_fwd: int = Field(ge=0)
    elementwise_hidden_passes: int = Field(gt=0)
    mla_alternate_matmul_share: float = Field(ge=0, le=1)
    moe_alternate_matmul_share: float = Field(ge=0, le=1)
    host_link_fraction: float = Field(gt=0, le=1)
    # fabric
    scale_up_step_latency_s: float = Field(ge=0)
    # memory model (parallel/) and host memory (planner/)
    optimizer_bytes_per_param: float = Field(ge=0)
    dp_bucket_elements: float = Field(gt=0)
    logits_bytes_per_element: float = Field(gt=0)
    host_ram_usable_fraction: float = Field(gt=0, le=1)
    # constant fits (fits.yaml constant_fits:)
    memory_overhead_fixed_gib: float = Field(ge=0)
    memory_overhead_fraction: float = Field(ge=0, lt=1)
    fp8_amax_sync_sigma: float = Field(ge=0, le=0.2)

    sources: Mapping[str, str] = Field(default_factory=dict, repr=False)

    @property
    def memory_overhead_fixed_bytes(self) -> float:
        return self.memory_overhead_fixed_gib * 2**30

    @cached_property
    def key(self) -> tuple[float, ...]:
        """The values, in field order: what a cache of the model's answers keys on (two catalogs that judge
        alike share entries; `sources` does not change a number)."""
        return tuple(float(getattr(self, name)) for name in type(self).model_fields if name != "sources")


def field_name(record_id: str) -> str:
    return record_id.replace("-", "_")


def build_judgements(records: Mapping[str, JudgementRecord | ConstantFit], origin: str,
                     origins: Mapping[str, object] | None = None) -> Judgements:
    """The typed view of `records` (by id); an id the model does not know, a missing one or a value out of range
    is one CatalogError line naming it (and the file it came from, given `origins` by id)."""
    known = set(Judgements.model_fields) - {"sources"}
    values: dict[str, object] = {}
    for record_id, record in records.items():
        name = field_name(record_id)
        if name not in known:
            where = (origins or {}).get(record_id, origin)
            raise CatalogError(f"{where}: judgement {record_id!r} is not one the model uses; known: "
                               f"{', '.join(sorted(n.replace('_', '-') for n in known))}")
        values[name] = record.value
    missing = sorted(known - set(values))
    if missing:
        raise CatalogError(f"{origin}: judgement(s) {', '.join(m.replace('_', '-') for m in missing)} missing")
    try:
        return Judgements.model_validate({**values, "sources": {field_name(i): r.source for i, r in records.items()}})
    except ValidationError as error:
        raise CatalogError(f"{origin}: judgement {describe_validation_error(error)}") from error


def catalog_judgements(catalog: Catalog) -> Judgements:
    """`catalog`'s judgements: its `judgements:` and `constant_fits:` records (a user record overrides by id)."""
    records: dict[str, JudgementRecord | ConstantFit] = {}
    origins: dict[str, object] = {}
    for kind in ("judgements", "constant_fits"):
        for record_id, record in catalog.records(kind).items():
            if isinstance(record, JudgementRecord | ConstantFit):
                records[record_id] = record
                origins[record_id] = f"catalog file {catalog.origin(kind, record_id)}"
    return build_judgements(records, "catalog judgements", origins)


@lru_cache(maxsize=1)
def shipped_judgements() -> Judgements:
    """The built-in catalog's judgements (no user files)."""
    from gpufleet.catalog.registry import Catalog

    return catalog_judgements(Catalog(()))
