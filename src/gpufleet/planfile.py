"""The plan file: what `gpufleet plan --json` writes and `launch --plan`, `report`, `cost --plan` and the
monitor's `--plan` read. One versioned schema owns it (a low module: pydantic only, no planner import, so the
runtime's monitor reads it too).

The schema types the keys a reader relies on and keeps every other key the writer adds (`extra="allow"`), so
scripts get the whole document and readers get a checked one. `SCHEMA_VERSION` changes whenever a key a reader
relies on changes; a file of another schema, or not a plan file at all, gets one line saying what to do.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpufleet.errors import InputError, describe_validation_error

#: `"kind"` of a plan file.
PLAN_KIND = "gpufleet-plan"
#: The plan-file schema this gpufleet writes and reads (1: the unversioned files before it).
SCHEMA_VERSION = 2

_Open = ConfigDict(extra="allow", frozen=True)


class PlannedLayout(BaseModel):
    """A plan's layout as the file records it (degrees, sharding, recompute, and the label `plan` prints)."""

    model_config = _Open
    label: str = Field(min_length=1)
    tp: int = Field(ge=1)
    pp: int = Field(ge=1)
    dp: int = Field(ge=1)
    cp: int = Field(ge=1)
    ep: int = Field(ge=1)
    vpp: int = Field(ge=1)
    micro_batch: int = Field(ge=1)


class PlannedStep(BaseModel):
    """One ranked plan: its layout and the predictions the readers use."""

    model_config = _Open
    rank: int = Field(ge=1)
    layout: PlannedLayout
    step_s: float = Field(gt=0)
    tokens_per_s_per_gpu: float = Field(gt=0)
    mfu: float = Field(gt=0, le=1)
    time_to_train_s: float = Field(gt=0)

    @field_validator("step_s", "tokens_per_s_per_gpu", "time_to_train_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class PlannedJob(BaseModel):
    model_config = _Open
    model: str
    tokens: float = Field(gt=0)
    seq_len: int = Field(ge=1)
    global_batch: int = Field(ge=1)
    precision: str


class PlannedCluster(BaseModel):
    model_config = _Open
    gpu: str
    gpus: int = Field(ge=1)
    node: str
    network: str
    topology: str
    oversubscription: float = Field(ge=1)


class SweepRow(BaseModel):
    """One GPU count of a sweep: whether it has a plan, and the best one's layout and step where it does."""

    model_config = _Open
    gpus: int = Field(ge=1)
    fits: bool
    layout: PlannedLayout | None = None
    step_s: float | None = None


class PlannedFramework(BaseModel):
    """The framework behaviours a plan assumed (its `--stack` and the overlap, recompute and model-term flags), as
    the step model priced them: what `launch --plan` rebuilds the request from and compares with its own. The
    writer builds this record (planner/plan_json.py framework_record); readers get it typed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    stack: str | None
    stack_record: str | None
    stack_resolution: str | None
    stack_version_assumed: bool
    attention_kernel: str | None
    tp_comm_overlap: bool
    tp_async_backward: bool
    tp_gathered_inputs: bool
    ep_comm_overlap: bool
    ep_dispatch: str
    ep_routing: str
    moe_expert_kernels: str
    fused_elementwise: bool
    dp_overlap: bool
    grad_dtype: str
    fp32_params: bool
    selective_policy: str
    ep_imbalance: float
    moe_dropless: bool
    loss_bytes_per_logit: float
    straggler_sigma: float
    straggler_scope: str
    overlap_slowdown: float
    fsdp2_copies: bool | None
    fp8_amax_sync_sigma: float
    dp_overlap_window: str
    fp8_recipe: str
    fp8_amax_group: str
    pp_p2p_overlap: bool
    logits_bytes_per_element: float
    activation_offload: bool
    sequence_parallel: bool
    context_parallel: bool


class PlanFile(BaseModel):
    """A whole `plan --json` document: one GPU count (`plans`) or a sweep over counts (`sweep`)."""

    model_config = _Open
    kind: Literal["gpufleet-plan"]
    schema_version: int
    gpufleet_version: str
    #: every field of the PlanRequest (report re-runs it; planner.plan.PlanRequest reads it back)
    request: dict[str, Any]
    framework: PlannedFramework
    job: PlannedJob | None = None
    cluster: PlannedCluster | None = None
    ranking: dict[str, Any] = Field(default_factory=dict)
    plans: list[PlannedStep] | None = None
    sweep: list[SweepRow] | None = None
    deadline_s: float | None = None

    @property
    def is_sweep(self) -> bool:
        return self.sweep is not None

    def plan(self, rank: int, where: str) -> PlannedStep:
        """Plan #`rank` (1 = best) of a single-count file; InputError when there is none."""
        if self.plans is None:
            raise InputError(f"{where} is a sweep over GPU counts; it holds no ranked plans of one count")
        if not 1 <= rank <= len(self.plans):
            raise InputError(f"{where} holds {len(self.plans)} plan(s); choose a rank from 1 to {len(self.plans)}, "
                             f"got {rank}" if self.plans else f"{where} holds no plan (the search found none)")
        return self.plans[rank - 1]


def header(request: dict[str, Any], version: str) -> dict[str, Any]:
    """The keys that make a document a plan file of this schema (the writer adds the rest)."""
    return {"kind": PLAN_KIND, "schema_version": SCHEMA_VERSION, "gpufleet_version": version, "request": request}


def read_plan_file(data: Any, where: str) -> PlanFile:
    """The plan file in `data` (parsed JSON), checked; one InputError line for anything else."""
    if not isinstance(data, dict) or data.get("kind") != PLAN_KIND:
        raise InputError(f"{where} is not a gpufleet plan file (write one with: gpufleet plan ... --json > plan.json)")
    schema = data.get("schema_version", 1)
    if schema != SCHEMA_VERSION:
        raise InputError(f"{where} is a plan file of schema {schema!r} (gpufleet {data.get('gpufleet_version')}); "
                         f"this gpufleet reads schema {SCHEMA_VERSION}: plan it again with `gpufleet plan ... --json`")
    try:
        return PlanFile.model_validate(data)
    except ValidationError as error:
        raise InputError(f"{where}: plan file is incomplete or malformed: {describe_validation_error(error)}") \
            from None
