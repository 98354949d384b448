"""Framework stacks as data: each stack's documented settings, one source per setting (`data/stacks.yaml`).

`gpufleet plan --stack ID`, `memory --stack ID` and `validate` (a run's `stack:` field) read the same records.
A setting a stack does not state keeps gpufleet's default, which is Megatron-LM's (the `megatron-lm` stack).
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.catalog.calibration import AttentionKernel
from gpufleet.catalog.records import Record

#: The stack a run without `stack:` gets, and `plan` without `--stack`: gpufleet's defaults are Megatron-LM's.
DEFAULT_STACK = "megatron-lm"

T = TypeVar("T")

_Strict = ConfigDict(frozen=True, extra="forbid")


class Sourced(BaseModel, Generic[T]):
    """One documented setting: its value and where it is written."""

    model_config = _Strict
    value: T
    source: str = Field(min_length=3)


# Named subclasses, one per value type: a parametrised generic (Sourced[bool]) has no importable name, so a catalog
# holding one could not be pickled into the on-disk cache (catalog/cache.py).
class SourcedBool(Sourced[bool]):
    pass


class SourcedFloat(Sourced[float]):
    pass


class SourcedInt(Sourced[int]):
    pass


class SourcedInts(Sourced[tuple[int, ...]]):
    pass


class SourcedKernel(Sourced[AttentionKernel]):
    pass


class SourcedGradDtype(Sourced[Literal["fp32", "bf16"]]):
    pass


class SourcedDispatch(Sourced[Literal["all-to-all", "dedup"]]):
    pass


class SourcedPolicy(Sourced[Literal["attention", "op"]]):
    pass


class SourcedSharding(Sourced[Literal["none", "zero1", "zero2", "zero3", "fsdp", "hsdp"]]):
    pass


class SourcedShardings(Sourced[tuple[Literal["none", "zero1", "zero2", "zero3", "fsdp", "hsdp"], ...]]):
    pass


class SourcedPrecisions(Sourced[tuple[Literal["fp32", "tf32", "bf16", "fp16", "fp8", "fp4"], ...]]):
    pass


#: The framework files gpufleet writes (`gpufleet launch --target`), one per stack that has a writer.
LaunchTarget = Literal["megatron", "deepspeed", "torchtitan"]


class SourcedTarget(Sourced[LaunchTarget]):
    pass


class StackSettings(BaseModel):
    """What a stack runs with where it differs from gpufleet's (Megatron-LM's) defaults; unset keeps the default.

    Step and memory behaviours apply to `plan --stack` and `validate` alike; the *layout defaults*
    (`sharding`, `sequence_parallel`, `expert_tp`, `micro_batches_per_pp_stage`) say what the stack does when a
    run leaves a field null, and fill only a run's null fields in `validate`; the *features* (`vpps`,
    `activation_offload`, `context_parallel`, `sequence_parallel: false`, `shardings`, `pp_shardings`,
    `expert_parallel`, `partial_recompute`) narrow the layouts both may choose; `precisions` bounds the job and
    `launch_target` names the framework files `gpufleet launch` writes for a plan of this stack."""

    model_config = _Strict
    attention_kernel: SourcedKernel | None = None
    grad_dtype: SourcedGradDtype | None = None
    tp_comm_overlap: SourcedBool | None = None
    tp_async_backward: SourcedBool | None = None
    tp_gathered_inputs: SourcedBool | None = None
    ep_imbalance: SourcedFloat | None = None
    moe_dropless: SourcedBool | None = None
    ep_comm_overlap: SourcedBool | None = None
    ep_dispatch: SourcedDispatch | None = None
    fp32_params: SourcedBool | None = None
    selective_policy: SourcedPolicy | None = None
    logits_bytes_per_element: SourcedFloat | None = None
    loss_bytes_per_logit: SourcedFloat | None = None
    fsdp2_copies: SourcedBool | None = None
    # layout defaults (fill a run's null field)
    sharding: SourcedSharding | None = None
    sequence_parallel: SourcedBool | None = None
    expert_tp: SourcedInt | None = None
    micro_batches_per_pp_stage: SourcedBool | None = None
    # features (narrow the search)
    vpps: SourcedInts | None = None
    activation_offload: SourcedBool | None = None
    context_parallel: SourcedBool | None = None
    #: the sharding kinds the framework can express, and those it can combine with pipeline parallelism
    shardings: SourcedShardings | None = None
    pp_shardings: SourcedShardings | None = None
    #: expert parallelism (MoE experts spread over ranks) from the framework's own configuration
    expert_parallel: SourcedBool | None = None
    #: full recompute of only some layers of each chunk (Megatron's block recompute)
    partial_recompute: SourcedBool | None = None
    #: the training precisions the framework runs
    precisions: SourcedPrecisions | None = None
    #: the files `gpufleet launch` writes for this stack (None: a published run's framework, no writer)
    launch_target: SourcedTarget | None = None


#: StackSettings fields that are StepOptions fields, and those that are MemoryAssumptions fields.
STEP_SETTINGS = ("tp_comm_overlap", "tp_async_backward", "ep_imbalance", "moe_dropless", "ep_comm_overlap",
                 "ep_dispatch", "loss_bytes_per_logit", "fsdp2_copies")
MEMORY_SETTINGS = ("grad_dtype", "fp32_params", "selective_policy", "tp_gathered_inputs", "logits_bytes_per_element")


class StackRecord(Record):
    """One framework stack (`stacks:` in the catalog)."""

    name: str
    #: runs of one family are left out together by `validate --cross-validate` (its versions share settings)
    family: str | None = None
    settings: StackSettings = Field(default_factory=StackSettings)

    def value(self, name: str) -> Any:
        """The stated value of setting `name`, or None where the stack keeps the default."""
        setting = getattr(self.settings, name)
        return None if setting is None else setting.value

    def stated(self) -> dict[str, Any]:
        """Every setting the stack states, by name."""
        return {name: self.value(name) for name in StackSettings.model_fields if self.value(name) is not None}

    @property
    def fold(self) -> str:
        """The cross-validation group of the stack's runs: its family, else its id."""
        return self.family or self.id
