"""Framework stacks as data: each stack's documented settings, one source per setting (`data/stacks.yaml`).

`gpufleet plan --stack ID`, `memory --stack ID` and `validate` (a run's `stack:` field) read the same records.
A setting a stack does not state keeps gpufleet's default, which is Megatron-LM's (the `megatron-lm` stack).

Stacks are versioned: a record whose id reads `FAMILY@RANGE` (`nemo@24.x`) holds the settings of that framework's
releases `first`..`last`. A name resolves (`resolve_stack`) as an exact id, as `FAMILY@VERSION` (`nemo@24.12`: the
family's range that holds the release), or as a bare family name (`nemo`: the family's `conservative` range, and the
output says which range was assumed). A family's conservative record may be its own bare-named record (`nemo`: the
settings every release runs by default, before a release's performance configuration).
"""

from __future__ import annotations

import re
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


#: How an FP8 recipe scales a tensor (Megatron-Core's `fp8_recipe`): "delayed": a per-tensor scale from an amax
#: history that Transformer Engine all-reduces over the amax group; "current": a per-tensor scale from the tensor's own
#: amax (Transformer Engine's current scaling, torchao's tensorwise); "mx": a scale per 32-element block (MXFP8);
#: "blockwise": a scale per 1x128 / 128x128 tile (DeepSeek-V3's fine-grained quantisation). Only "delayed" reduces an
#: amax history across ranks.
Fp8Recipe = Literal["delayed", "current", "mx", "blockwise"]
#: The ranks a delayed-scaling amax history is all-reduced over: "tp-dp-cp" (Megatron-Core's default amax-reduction
#: group, Transformer Engine's default of the whole job) or "tp" (Megatron-Core's `tp_only_amax_red`).
Fp8AmaxGroup = Literal["tp-dp-cp", "tp"]


#: How a stack's full activation recompute ends (StepOptions.recompute_early_stop): "off": the whole layer's forward
#: runs again (Megatron's reentrant CheckpointFunction, PyTorch before 2.1); "aten": PyTorch's non-reentrant
#: checkpoint with early stop (torch >= 2.1, on by default) stops once the last tensor backward reads is rebuilt, so
#: the block's last GEMM, whose input autograd saves before the matmul runs, is not re-run; an FP8 GEMM inside a custom
#: autograd Function (torchao, Transformer Engine) saves its input only after it ran, and is re-run;
#: "aten-or-compiled": the same, and a torch.compile'd block's partitioner re-runs only what backward reads, in any
#: precision (docs/model.md, "Recompute that stops early").
RecomputeEarlyStop = Literal["off", "aten", "aten-or-compiled"]


#: How a MoE layer launches its local experts' GEMMs: "per-expert": one GEMM (and its casts) per local expert, as
#: Transformer Engine's GroupedLinear does (Megatron-Core's TEGroupedMLP); "grouped": one grouped-GEMM kernel for all
#: local experts (grouped_gemm's `gmm`, torch._grouped_mm). Sets how the MoE host launch cost grows with local experts.
MoeExpertKernels = Literal["per-expert", "grouped"]

#: Parts of a transformer layer Megatron-Core captures in per-layer CUDA graphs (`--cuda-graph-modules`, with
#: `--cuda-graph-impl transformer_engine`): "moe_router" up to the router, "moe_preprocess" the token dispatcher's
#: preprocessing (needs "moe_router"), "attn" the attention block. Graphed kernels are replayed by one launch.
CudaGraphModule = Literal["attn", "moe_router", "moe_preprocess"]


#: The gate a MoE run routes through (perf/moe_routing.py): "learned", the router as trained (group-limited where
#: the model's router says so); "round-robin", NeMo AutoModel's benchmark FakeBalancedGate (token i gets the k
#: consecutive experts from i·k), which keeps a token's experts on one or two GPUs.
EpRouting = Literal["learned", "round-robin"]


class SourcedMoeExpertKernels(Sourced[MoeExpertKernels]):
    pass


class SourcedFp8Recipe(Sourced[Fp8Recipe]):
    pass


class SourcedRecomputeEarlyStop(Sourced[RecomputeEarlyStop]):
    pass


class SourcedFp8AmaxGroup(Sourced[Fp8AmaxGroup]):
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
    moe_expert_kernels: SourcedMoeExpertKernels | None = None
    fp32_params: SourcedBool | None = None
    selective_policy: SourcedPolicy | None = None
    logits_bytes_per_element: SourcedFloat | None = None
    loss_bytes_per_logit: SourcedFloat | None = None
    fsdp2_copies: SourcedBool | None = None
    #: how the framework's full activation recompute ends (RecomputeEarlyStop)
    recompute_early_stop: SourcedRecomputeEarlyStop | None = None
    #: an interleaved pipeline's sends and receives overlap the next chunk's compute (StepOptions.pp_p2p_overlap)
    pp_p2p_overlap: SourcedBool | None = None
    #: the FP8 recipe of the stack's FP8 runs, and the ranks its amax history is reduced over (delayed scaling)
    fp8_recipe: SourcedFp8Recipe | None = None
    fp8_amax_group: SourcedFp8AmaxGroup | None = None
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
                 "ep_dispatch", "moe_expert_kernels", "loss_bytes_per_logit", "fsdp2_copies", "fp8_recipe",
                 "fp8_amax_group", "recompute_early_stop", "pp_p2p_overlap")
MEMORY_SETTINGS = ("grad_dtype", "fp32_params", "selective_policy", "tp_gathered_inputs", "logits_bytes_per_element")


#: A release number as the frameworks print them (`24.12`, `25.02`, `0.3.0`): dot-separated integers.
_RELEASE = r"^[0-9]+(\.[0-9]+)*$"


def release_key(release: str) -> tuple[int, ...]:
    """A release number as a tuple that orders like the releases (`24.12` < `25.02`)."""
    return tuple(int(part) for part in release.split("."))


class ReleaseRange(BaseModel):
    """The framework releases a stack record's settings hold for, first and last included."""

    model_config = _Strict
    first: str = Field(pattern=_RELEASE)
    last: str = Field(pattern=_RELEASE)
    source: str = Field(min_length=3)

    def holds(self, release: str) -> bool:
        """Whether `release` (dot-separated integers) is inside the range."""
        return release_key(self.first) <= release_key(release) <= release_key(self.last)

    def words(self) -> str:
        return self.first if self.first == self.last else f"{self.first}–{self.last}"


class StackRecord(Record):
    """One framework stack (`stacks:` in the catalog): a framework, or a framework at a release range."""

    #: a versioned stack's id is FAMILY@RANGE (`nemo@24.x`); others keep the plain record id
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*(@[a-z0-9][a-z0-9._-]*)?$")
    name: str
    #: runs of one family are left out together by `validate --cross-validate` (its versions share settings);
    #: a bare family name (`plan --stack nemo`) resolves to the family's `conservative` record
    family: str | None = None
    #: the releases the settings hold for (a versioned stack)
    releases: ReleaseRange | None = None
    #: the record a bare family name resolves to, whose settings promise least (one per family): a versioned range,
    #: or a record named by the bare family name itself that holds what every release runs by default
    conservative: bool = False
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


class StackChoice(BaseModel):
    """A stack name as given and the record it resolved to; `assumed` when the name carried no version and the
    family's conservative range was taken (the output says so)."""

    model_config = _Strict
    named: str
    record: StackRecord
    assumed: bool = False

    @property
    def why(self) -> str | None:
        """Why the name gave this record, when the name is not the record's id: its releases, and the range
        that holds the named release or the conservative range assumed for a bare family name."""
        if self.named == self.record.id and not self.assumed:
            return None
        releases = f"releases {self.record.releases.words()}; " if self.record.releases else ""
        return releases + (f"{self.named} named without a version: the conservative settings assumed" if self.assumed
                           else f"the range that holds {self.named}")

    @property
    def said(self) -> str:
        """How the choice reads in output: the record id, then `why` in brackets where there is one."""
        return self.record.id + (f" ({self.why})" if self.why else "")


def resolve_stack(name: str, stacks: dict[str, StackRecord]) -> StackChoice | None:
    """The record `name` names: an exact id, FAMILY@VERSION (the family's range holding that release), or a bare
    family name (its conservative range); None when none matches."""
    if name in stacks:  # a bare name that is the id of a conservative record still assumes its settings
        record = stacks[name]
        return StackChoice(named=name, record=record, assumed=record.conservative and "@" not in name)
    family, _, release = name.partition("@")
    members = [record for record in stacks.values() if record.family == family]
    if release:
        if re.match(_RELEASE, release) is None:
            return None
        held = [record for record in members if record.releases is not None and record.releases.holds(release)]
        held.sort(key=lambda record: record.conservative)  # a release's own range before the family's defaults
        return StackChoice(named=name, record=held[0]) if held else None
    conservative = [record for record in members if record.conservative]
    return StackChoice(named=name, record=conservative[0], assumed=True) if conservative else None
