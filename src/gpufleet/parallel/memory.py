"""Memory per GPU by pipeline stage: weights, gradients, optimizer, activations, buffers, overhead.

Pure closed forms over (ModelSpec, Layout); no per-layer loops for dense models. The planner calls
`peak_stage_memory` for every candidate layout, so the per-model constants (parameters by kind, per-token
activation terms) are cached per (model, tp, flash, dropout).

Conventions (docs/memory.md has the full list with sources):

* Mixed precision: weights 2 bytes/param (bf16/fp16); gradients fp32 (4 bytes), because Megatron-LM
  accumulates into an fp32 `main_grad` buffer (set `grad_dtype="bf16"` for DeepSpeed-style 16-bit grads);
  Adam states fp32 master + m + v = 12 bytes/param (K = 12 in the ZeRO paper). fp8 training keeps all of
  that and adds 2 bytes per transformer-layer parameter for Transformer Engine's cached fp8 weight and its
  transpose. `optimizer offload` moves the 12 bytes to CPU (ZeRO-Offload); gradients stay on the GPU.
* Sharding over the data-parallel group dp·cp (Megatron shards its distributed optimizer over dp×cp, and
  torchtitan folds cp into the FSDP mesh): zero1 optimizer; zero2 + gradients; zero3/fsdp + weights;
  hsdp shards like fsdp over `hsdp_group`·cp and replicates across dp/hsdp_group.
* Pipeline: rank r owns layers of chunks r, r+pp, …; the first rank adds the (vocab-parallel) embedding,
  the last adds the final norm and the output head. Tied embeddings still live on both ends when pp > 1
  (Megatron keeps a copy of the word embeddings on the last stage and all-reduces their gradients).
* TP shards attention, dense-MLP and shared-expert matrices and the vocabulary; norms and router are
  replicated.
* Experts: EP splits the routed experts over ep ranks. Expert tensor parallelism etp is the layout's
  `expert_tp` when set; otherwise etp = tp when ep divides dp·cp (Megatron-Core's default
  `--expert-tensor-parallel-size` = tp), else etp = 1 (MoE parallel folding, which `validate_layout` allows
  because it only asks that ep divide dp·cp·tp). Expert data parallelism is then edp = dp·cp·tp/(ep·etp),
  and ZeRO/FSDP shard expert states over edp.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from operator import attrgetter
from typing import Literal

from gpufleet.catalog.judgements import Judgements, shipped_judgements
from gpufleet.catalog.records import ModelSpec
from gpufleet.errors import InputError
from gpufleet.parallel.activations import (
    ACT_BYTES,
    LayerActivationTerms,
    embedding_activation_bytes,
    inflight_microbatches,
    layer_bytes,
    layer_terms,
    output_activation_bytes,
)
from gpufleet.parallel.layout import (
    Layout,
    SelectivePolicy,
    expert_parallel_degrees,
    expert_routed_tokens,
    micro_batches_per_step,
    recomputed_fraction,
    stage_layer_indices,
    stage_layer_split,
    validate_layout,
)
from gpufleet.workload.params import embedding_params, layer_params, output_params

GradDtype = Literal["fp32", "bf16"]
TRAINING_PRECISIONS = ("bf16", "fp16", "fp8")
GIB = 2**30


#: MemoryAssumptions' numeric fields and the range each may take (judgement: well beyond any framework's figure,
#: which are 6-12 bytes per logit, 12-16 per parameter, 1e7-1e9 bucket elements and a few GiB fixed, so that only a
#: value no framework has is refused)
_NUMBER_BOUNDS = (("optimizer_bytes_per_param", 0.0, 64.0), ("logits_bytes_per_element", 1.0, 64.0),
                  ("dp_bucket_elements", 1.0, 1e12), ("overhead_fixed_bytes", 0.0, 2.0**40),
                  ("overhead_fraction", 0.0, 0.99))


@dataclass(frozen=True, slots=True)
class MemoryAssumptions:
    """Judgement calls of the memory model, gathered so that callers and tests can vary them.

    The numeric defaults are catalog data (catalog/judgements.py: `data/judgements.yaml`, and the overhead
    allowance, a recorded fit on torchtitan's published peak memory, in `data/fits.yaml` `constant_fits:`): a
    fixed part for the CUDA context, cuBLAS/cuDNN workspaces and NCCL's internal buffers, and a fraction of
    everything else for caching-allocator fragmentation. A numeric field left None takes its value from
    `judgements` (None: the shipped catalog's; `StepOptions` passes its own down, and a `--catalog` file may
    override them); its `resolved_*` property is the number the memory model uses.
    """

    #: the judgement constants the None fields below take (catalog/judgements.py); None: the shipped catalog's
    judgements: Judgements | None = field(default=None, repr=False)

    grad_dtype: GradDtype = "fp32"
    #: fp32 master + Adam m + v (catalog judgement optimizer-bytes-per-param)
    optimizer_bytes_per_param: float | None = None
    #: PyTorch FSDP2 (torchtitan, NeMo AutoModel): the sharded fp32 parameter *is* the master copy and the bf16
    #: weights exist only while a layer is gathered, so a parameter costs 4 + grads + 8 (Adam m, v) at rest
    fp32_params: bool = False
    #: what selective recompute keeps: Megatron's everything-but-the-attention-core, or torchtitan's op-level
    #: policy (SelectivePolicy); the step model re-runs what this leaves out
    selective_policy: SelectivePolicy = "attention"
    #: under sequence parallelism, keep each column-parallel GEMM's input all-gathered for its backward (PyTorch
    #: DTensor TP) instead of Megatron's shard that the backward re-gathers
    tp_gathered_inputs: bool = False
    flash_attention: bool = True
    dropout: bool = False
    #: 6 fused (Megatron); ~12 unfused fp32 upcast (catalog judgement logits-bytes-per-element)
    logits_bytes_per_element: float | None = None
    #: Megatron DDP's bucket size (elements) for grad reduce-scatter/all-reduce; the step model prices one
    #: collective per bucket of the same size (catalog judgement dp-bucket-elements)
    dp_bucket_elements: float | None = None
    #: the overhead allowance (catalog constant fits memory-overhead-fixed-gib and memory-overhead-fraction)
    overhead_fixed_bytes: float | None = None
    overhead_fraction: float | None = None

    def __post_init__(self) -> None:
        for name, low, high in _NUMBER_BOUNDS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not low <= value <= high):
                raise InputError(f"options.memory.{name} must be a number from {low:g} to {high:g}, got {value!r}")

    @property
    def judged(self) -> Judgements:
        return self.judgements if self.judgements is not None else shipped_judgements()

    def stated(self) -> MemoryAssumptions:
        """These assumptions with every judged value written out and no judgements attached."""
        return replace(self, judgements=None, optimizer_bytes_per_param=self.resolved_optimizer_bytes_per_param,
                       logits_bytes_per_element=self.resolved_logits_bytes_per_element,
                       dp_bucket_elements=self.resolved_dp_bucket_elements,
                       overhead_fixed_bytes=self.resolved_overhead_fixed_bytes,
                       overhead_fraction=self.resolved_overhead_fraction)

    @property
    def resolved_optimizer_bytes_per_param(self) -> float:
        given = self.optimizer_bytes_per_param
        return given if given is not None else self.judged.optimizer_bytes_per_param

    @property
    def resolved_logits_bytes_per_element(self) -> float:
        given = self.logits_bytes_per_element
        return given if given is not None else self.judged.logits_bytes_per_element

    @property
    def resolved_dp_bucket_elements(self) -> float:
        given = self.dp_bucket_elements
        return given if given is not None else self.judged.dp_bucket_elements

    @property
    def resolved_overhead_fixed_bytes(self) -> float:
        given = self.overhead_fixed_bytes
        return given if given is not None else self.judged.memory_overhead_fixed_bytes

    @property
    def resolved_overhead_fraction(self) -> float:
        given = self.overhead_fraction
        return given if given is not None else self.judged.memory_overhead_fraction

    @property
    def grad_bytes(self) -> float:
        return 4.0 if self.grad_dtype == "fp32" else 2.0

    def reduced_grad_bytes(self, precision: str) -> float:
        """Bytes per gradient element the data-parallel reduction moves: the gradient buffer's dtype (Megatron-LM
        forces fp32 for bf16 training: arguments.py, "bfloat16 requires gradient accumulation and all-reduce to be
        done in fp32"), except that fp16 training reduces its fp16 gradients before the optimizer copies them
        into fp32 master gradients (which `grad_bytes` counts)."""
        return 2.0 if precision == "fp16" else self.grad_bytes


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes per GPU of one pipeline stage, by kind."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    buffers_bytes: float
    overhead_bytes: float
    #: pinned CPU memory this GPU's rank holds (offloaded activations, ZeRO-Offload optimizer state); not HBM,
    #: so not in `total_bytes` — the node's RAM must hold it for all of the node's GPUs
    host_bytes: float = 0.0

    @property
    def total_bytes(self) -> float:
        return (
            self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.buffers_bytes
            + self.overhead_bytes
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "weights": self.weights_bytes,
            "gradients": self.gradients_bytes,
            "optimizer": self.optimizer_bytes,
            "activations": self.activations_bytes,
            "buffers": self.buffers_bytes,
            "overhead": self.overhead_bytes,
        }


@dataclass(frozen=True, slots=True)
class _ModelConstants:
    """Per-model numbers that do not depend on the layout (cached)."""

    attention: int
    norms: int
    dense_mlp: int
    routed_experts: int
    shared_experts: int
    router: int
    vocab_embedding: int  # vocab × hidden
    position_embedding: int
    output_norm: int
    dense_layers: int  # leading dense layers (all layers for a dense model)


@lru_cache(maxsize=256)
def _constants(model: ModelSpec) -> _ModelConstants:
    dense = layer_params(model, 0)
    moe_layer = layer_params(model, model.layers - 1) if model.moe is not None else dense
    head = output_params(model) - (0 if model.tied_embeddings else model.vocab * model.hidden)
    return _ModelConstants(
        attention=dense.attention,
        norms=dense.norms,
        dense_mlp=dense.dense_mlp,
        routed_experts=moe_layer.routed_experts,
        shared_experts=moe_layer.shared_experts,
        router=moe_layer.router,
        vocab_embedding=model.vocab * model.hidden,
        position_embedding=embedding_params(model) - model.vocab * model.hidden,
        output_norm=head,
        dense_layers=model.moe.dense_layers if model.moe is not None else model.layers,
    )


@lru_cache(maxsize=1024)
def _terms(model: ModelSpec, tp: int, moe_layer: bool, flash: bool, dropout: bool, fp8: bool) -> LayerActivationTerms:
    return layer_terms(model, tp, moe_layer=moe_layer, flash_attention=flash, dropout=dropout, fp8=fp8)


def _dense_layers_on_stage(model: ModelSpec, layout: Layout, stage: int, dense_layers: int) -> int:
    """How many of the stage's layers are dense (leading dense layers of an MoE model)."""
    held = stage_layer_indices(model.layers, layout.pp, layout.vpp, stage)
    if dense_layers >= model.layers:
        return len(held)
    return sum(1 for index in held if index < dense_layers)


def _shard_degrees(layout: Layout, edp: int) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """((weights, grads, optimizer) divisor for dense params, same for expert params)."""
    sharding = layout.sharding
    if sharding == "none":
        return (1, 1, 1), (1, 1, 1)
    if sharding == "hsdp":
        group = layout.hsdp_group * layout.cp
        egroup = max(1.0, edp * layout.hsdp_group / layout.dp)
        return (group, group, group), (egroup, egroup, egroup)
    group = layout.dp * layout.cp
    if sharding == "zero1":
        return (1, 1, group), (1, 1, edp)
    if sharding == "zero2":
        return (1, group, group), (1, edp, edp)
    return (group, group, group), (edp, edp, edp)  # zero3, fsdp


def _check_inputs(seq_len: int, global_batch: int, precision: str) -> None:
    if seq_len < 1:
        raise InputError(f"sequence length must be at least 1, got {seq_len}")
    if global_batch < 1:
        raise InputError(f"global batch must be at least 1 sequence, got {global_batch}")
    if precision not in TRAINING_PRECISIONS:
        raise InputError(
            f"precision {precision!r} is not a training precision; use {', '.join(TRAINING_PRECISIONS)}"
        )


@dataclass(frozen=True, slots=True)
class _StageParameters:
    """The bytes of one stage that follow from its parameters alone (every micro-batch shape shares them)."""

    weights: float
    gradients: float
    optimizer: float
    host: float  # ZeRO-Offload optimizer state
    bucket: float | None  # ZeRO-2/3, FSDP: the gradient bucket being reduce-scattered (None: no such buffer)
    gathered: float | None  # ZeRO-3, FSDP: the current and the prefetched layer all-gathered (None: none)


#: A MemoryBreakdown's fields in order (weights, gradients, optimizer, activations, buffers, overhead, host bytes)
MemoryParts = tuple[float, float, float, float, float, float, float]


#: What one layout's stages look up (JobMemory._shared): its parameter bytes by stage, its activation bytes (on the
#: GPU, offloaded) by stage, its activation-sized buffers, etp, edp and micro-batches per step.
_Shared = tuple[dict[int, _StageParameters], dict[int, tuple[float, float]], float, int, int, int]


#: Every field of a layout but its sharding and its recompute mode (a tuple built in C): the layouts of a search
#: that share it differ only in the two innermost choices, so their stages, parameter bytes by sharding and
#: activation bytes by recompute mode are looked up once per key (JobMemory.peak_parts).
degrees_key = attrgetter(*(f.name for f in fields(Layout) if f.name not in ("sharding", "recompute")))

#: One stage's bytes that follow from the layout's degrees and sharding: (weights, gradients, optimizer,
#: weights + gradients + optimizer, buffers, host) — buffers with the ZeRO bucket and gathered layers added.
_StageByParams = tuple[float, float, float, float, float, float]
#: JobMemory.by_degrees: candidate stages; by sharding, each stage's _StageByParams; by recompute mode, each stage's
#: (activation bytes, offloaded activation bytes)
_ByDegrees = tuple[tuple[int, ...], dict[str, list[_StageByParams]], dict[str, list[tuple[float, float]]]]


def memory_parts_total(parts: MemoryParts) -> float:
    """MemoryBreakdown(*parts).total_bytes, summed in the same order."""
    return parts[0] + parts[1] + parts[2] + parts[3] + parts[4] + parts[5]


class JobMemory:
    """The memory model of one job (model, sequence, batch, precision, assumptions) for any number of layouts.

    `stage_memory` and `peak_stage_memory` are this object used once. A search keeps one and asks it about
    every layout: the three parts of a stage's bytes (what its parameters need, what its activations need, the
    activation-sized communication buffers) each depend on a few of the layout's fields, so each is computed
    once per distinct value of those fields and the stage's total is summed from them in the order the closed
    form adds them (the same floating-point numbers). Keys are tuples of plain values, never the model.
    """

    def __init__(self, model: ModelSpec, *, seq_len: int, global_batch: int, precision: str,
                 assumptions: MemoryAssumptions | None = None) -> None:
        self.model = model
        self.seq_len = seq_len
        self.global_batch = global_batch
        self.precision = precision
        self.assumptions = assumptions or MemoryAssumptions()  # judged numbers: its `judgements`
        #: the overhead allowance, read once (every layout's peak adds it)
        self._overhead = (self.assumptions.resolved_overhead_fixed_bytes, self.assumptions.resolved_overhead_fraction)
        self._c = _constants(model)
        self._params: dict[tuple[object, ...], dict[int, _StageParameters]] = {}
        self._activations: dict[tuple[object, ...], tuple[dict[int, tuple[float, float]], float]] = {}
        self._layers: dict[tuple[object, ...], tuple[float, float]] = {}
        self._held: dict[tuple[int, int, int], tuple[int, int]] = {}
        self._candidates: dict[tuple[int, int], tuple[int, ...]] = {}
        #: degrees_key -> (candidate stages, by sharding: per-stage _StageByParams, by recompute: per-stage
        #: (activations, host activations))
        self._by_degrees: dict[tuple[object, ...], _ByDegrees] = {}

    def stage(self, layout: Layout, stage: int) -> MemoryBreakdown:
        """Bytes per GPU on pipeline rank `stage` (0-based). Does not validate the layout."""
        if not 0 <= stage < layout.pp:
            raise InputError(f"stage {stage} is outside 0..{layout.pp - 1}")
        return MemoryBreakdown(*self._stage_parts(self._shared(layout), layout, stage))

    def peak(self, layout: Layout) -> tuple[int, MemoryBreakdown]:
        """(stage, breakdown) of the stage that needs the most memory per GPU (the first such stage on a tie).
        Does not validate the layout (`peak_stage_memory` does)."""
        stage, parts = self.peak_parts(layout)
        return stage, MemoryBreakdown(*parts)

    def peak_parts(self, layout: Layout) -> tuple[int, MemoryParts]:
        """`peak` with the breakdown's fields as a tuple (a search builds the breakdown only for the layouts it
        ranks); `memory_parts_total` is its `total_bytes`.

        The parts are `_stage_parts`' numbers added in its order; what depends only on the layout's degrees and
        sharding, or only on its degrees and recompute mode, is looked up once per degrees_key."""
        return self.peak_parts_by_degrees(self.by_degrees(layout, degrees_key(layout)), layout)

    def by_degrees(self, layout: Layout, key: tuple[object, ...]) -> _ByDegrees:
        """What every layout with this degrees_key (`key`) shares: its candidate stages and its stages' bytes by
        sharding and by recompute mode (filled as peak_parts_by_degrees meets them)."""
        found = self._by_degrees.get(key)
        if found is None:
            found = self._by_degrees[key] = (self._candidate_stages(layout.pp, layout.vpp), {}, {})
        return found

    def peak_parts_by_degrees(self, found: _ByDegrees, layout: Layout) -> tuple[int, MemoryParts]:
        """peak_parts of a layout whose degrees' shared numbers (`by_degrees`) are `found`."""
        stages, by_sharding, by_recompute = found
        params = by_sharding.get(layout.sharding)
        activations = by_recompute.get(layout.recompute)
        if params is None or activations is None:
            shared = self._shared(layout)
            if params is None:
                params = by_sharding[layout.sharding] = [self._stage_by_params(shared, layout, stage)
                                                         for stage in stages]
            if activations is None:
                activations = by_recompute[layout.recompute] = [self._stage_activation_bytes(shared, layout, stage)
                                                                for stage in stages]
        fixed, fraction = self._overhead
        best_index, best_total = -1, 0.0
        pairs = enumerate(zip(params, activations, strict=True))
        for index, ((_, _, _, held, buffers, _), (activation_bytes, _)) in pairs:
            subtotal = held + activation_bytes + buffers
            total = subtotal + (fixed + fraction * subtotal)
            if best_index < 0 or total > best_total:
                best_index, best_total = index, total
        weights, gradients, optimizer, held, buffers, host = params[best_index]
        activation_bytes, host_activations = activations[best_index]
        subtotal = held + activation_bytes + buffers
        return stages[best_index], (weights, gradients, optimizer, activation_bytes, buffers,
                                    fixed + fraction * subtotal, host + host_activations)

    def _stage_by_params(self, shared: _Shared, layout: Layout, stage: int) -> _StageByParams:
        """`_stage_parts`' numbers that follow from the stage's parameters (and the activation-sized buffers)."""
        by_stage, _, buffers, etp, edp, _ = shared
        params = by_stage.get(stage)
        if params is None:
            params = by_stage[stage] = self._stage_parameters(layout, stage, etp, edp)
        if params.bucket is not None:
            buffers += params.bucket
        if params.gathered is not None:
            buffers += params.gathered
        return (params.weights, params.gradients, params.optimizer, params.weights + params.gradients
                + params.optimizer, buffers, params.host)

    def _stage_activation_bytes(self, shared: _Shared, layout: Layout, stage: int) -> tuple[float, float]:
        """(activation bytes on the GPU, offloaded) of one stage: `_stage_parts`' activation numbers."""
        activations_by_stage, m = shared[1], shared[5]
        found = activations_by_stage.get(stage)
        if found is None:
            found = activations_by_stage[stage] = self._stage_activations(layout, stage, m)
        return found

    def _shared(self, layout: Layout) -> _Shared:
        """The tables of the parts this layout shares with others: parameters by stage (shared by every layout
        with its degrees and sharding), activations by stage and the activation-sized buffers (by every layout
        with its micro-batch shape and recompute)."""
        tp, cp, pp, sp, mb = layout.tp, layout.cp, layout.pp, layout.sequence_parallel, layout.micro_batch
        etp, edp = expert_parallel_degrees(layout)
        m = micro_batches_per_step(layout, self.global_batch)
        params_key = (tp, pp, layout.vpp, layout.ep, etp, edp, layout.dp, cp, layout.sharding, layout.hsdp_group,
                      layout.offload_optimizer)
        params = self._params.get(params_key)
        if params is None:
            params = self._params[params_key] = {}
        activations_key = (tp, cp, sp, etp, mb, m, pp, layout.vpp, layout.recompute, layout.recompute_layers,
                           layout.offload_activation_layers, layout.ep > 1)
        activations = self._activations.get(activations_key)
        if activations is None:
            activations = self._activations[activations_key] = ({}, self._activation_buffers(layout))
        return params, activations[0], activations[1], etp, edp, m

    def _stage_parts(self, shared: _Shared, layout: Layout, stage: int) -> MemoryParts:
        """(weights, gradients, optimizer, activations, buffers, overhead, host) bytes of one stage."""
        a = self.assumptions
        by_stage, activations_by_stage, buffers, etp, edp, m = shared
        params = by_stage.get(stage)
        if params is None:
            params = by_stage[stage] = self._stage_parameters(layout, stage, etp, edp)
        found = activations_by_stage.get(stage)
        if found is None:
            found = activations_by_stage[stage] = self._stage_activations(layout, stage, m)
        activations, host_activations = found
        if params.bucket is not None:
            buffers += params.bucket
        if params.gathered is not None:
            buffers += params.gathered
        subtotal = params.weights + params.gradients + params.optimizer + activations + buffers
        overhead = a.resolved_overhead_fixed_bytes + a.resolved_overhead_fraction * subtotal
        return (params.weights, params.gradients, params.optimizer, activations, buffers, overhead,
                params.host + host_activations)

    def _held_layers(self, pp: int, vpp: int, stage: int) -> tuple[int, int]:
        """(layers, dense layers) held by pipeline rank `stage`."""
        key = (pp, vpp, stage)
        found = self._held.get(key)
        if found is None:
            held = stage_layer_indices(self.model.layers, pp, vpp, stage)
            dense_layers = self._c.dense_layers
            dense = len(held) if dense_layers >= self.model.layers else sum(1 for i in held if i < dense_layers)
            found = self._held[key] = (len(held), dense)
        return found

    def _candidate_stages(self, pp: int, vpp: int) -> tuple[int, ...]:
        """Stages that can hold the peak: the first and the last (embedding, head) and, for every distinct split of
        (dense, MoE) layers a stage holds, the earliest stage with that split. Stages with equal parameters hold
        fewer micro-batches the later they are, so the earliest of them is the fullest; but an uneven split gives
        the middle stages the extra layers (stage_layer_indices), so a middle stage can outweigh the first."""
        found = self._candidates.get((pp, vpp))
        if found is None:
            dense_layers = min(self._c.dense_layers, self.model.layers)
            split = stage_layer_split(self.model.layers, pp, vpp, dense_layers)
            candidates = {0, pp - 1}
            seen: set[tuple[int, int]] = set()
            for stage, held in enumerate(split):
                if held not in seen:
                    seen.add(held)
                    candidates.add(stage)
            found = self._candidates[(pp, vpp)] = tuple(sorted(candidates))
        return found

    def _stage_parameters(self, layout: Layout, stage: int, etp: int, edp: int) -> _StageParameters:
        """Weights, gradients and optimizer state one GPU of the stage holds, and the ZeRO buffers they size."""
        model, a, c = self.model, self.assumptions, self._c
        tp = layout.tp
        first, last = stage == 0, stage == layout.pp - 1
        n_layers, n_dense = self._held_layers(layout.pp, layout.vpp, stage)
        n_moe = n_layers - n_dense
        layer_dense_params = n_layers * (c.attention / tp + c.norms) + n_dense * c.dense_mlp / tp
        layer_dense_params += n_moe * (c.shared_experts / tp + c.router)
        expert_params = n_moe * c.routed_experts / (layout.ep * etp)
        dense_params = layer_dense_params
        if first:
            dense_params += c.vocab_embedding / tp + c.position_embedding
        if last:
            dense_params += c.output_norm
            if model.tied_embeddings and layout.pp > 1:
                dense_params += c.vocab_embedding / tp  # Megatron's copy of the tied embedding on the last stage
            elif not model.tied_embeddings:
                dense_params += c.vocab_embedding / tp  # untied output head (output_norm holds only the norm)

        (wd, gd, od), (we, ge, oe) = _shard_degrees(layout, edp)
        weight_bytes_per_param = 2.0  # what a gathered (bf16) layer costs
        resident_weight_bytes = 4.0 if a.fp32_params else weight_bytes_per_param
        weights = resident_weight_bytes * (dense_params / wd + expert_params / we)
        if self.precision == "fp8":
            weights += 2.0 * (layer_dense_params / wd + expert_params / we)  # fp8 weight + transpose caches
        gradients = a.grad_bytes * (dense_params / gd + expert_params / ge)
        optimizer = host = 0.0
        # FSDP2's fp32 parameter is the master copy
        optimizer_bytes = a.resolved_optimizer_bytes_per_param - (4.0 if a.fp32_params else 0.0)
        if layout.offload_optimizer:
            host += optimizer_bytes * (dense_params / od + expert_params / oe)
        else:
            optimizer = optimizer_bytes * (dense_params / od + expert_params / oe)

        bucket = gathered = None
        if gd > 1 or ge > 1:
            # ZeRO-2/3, FSDP: unsharded gradients of the bucket being reduce-scattered. Capped by the part of
            # the gradients the rank does not own (a bucket larger than that degenerates to ZeRO-1), so that
            # sharding never costs more than not sharding. ZeRO-1/none reduce in place in Megatron's contiguous
            # fp32 grad buffer (already counted under gradients).
            remote_grads = dense_params * (1 - 1 / gd) + expert_params * (1 - 1 / ge)
            bucket = a.grad_bytes * min(a.resolved_dp_bucket_elements, remote_grads)
        if wd > 1 or we > 1:
            # ZeRO-3/FSDP: the current and the prefetched layer all-gathered (capped like the bucket: a stage of
            # one or two layers simply stays unsharded in effect)
            layer_local = c.attention / tp + c.norms + max(c.dense_mlp / tp, c.shared_experts / tp + c.router)
            if model.moe is not None:
                layer_local += c.routed_experts / (layout.ep * etp)
            remote_weights = dense_params * (1 - 1 / wd) + expert_params * (1 - 1 / we)
            gathered = weight_bytes_per_param * min(2 * layer_local, remote_weights)
        return _StageParameters(weights, gradients, optimizer, host, bucket, gathered)

    def _layer_bytes(self, layout: Layout, moe_layer: bool) -> tuple[float, float]:
        """(saved under the layout's recompute, saved without recompute) bytes of one layer and micro-batch."""
        a = self.assumptions
        etp, _ = expert_parallel_degrees(layout)
        key = (layout.tp, layout.cp, layout.sequence_parallel, etp, layout.micro_batch, layout.recompute, moe_layer)
        found = self._layers.get(key)
        if found is None:
            terms = _terms(self.model, layout.tp, moe_layer, a.flash_attention, a.dropout, self.precision == "fp8")
            saved = layer_bytes(terms, self.model, layout, seq_len=self.seq_len, micro_batch=layout.micro_batch,
                                recompute=layout.recompute, selective_policy=a.selective_policy,
                                gathered_column_inputs=a.tp_gathered_inputs)
            whole = layer_bytes(terms, self.model, layout, seq_len=self.seq_len, micro_batch=layout.micro_batch,
                                recompute="none", gathered_column_inputs=a.tp_gathered_inputs)
            found = self._layers[key] = (saved, whole)
        return found

    def _stage_activations(self, layout: Layout, stage: int, m: int) -> tuple[float, float]:
        """(activation bytes on the GPU, activation bytes offloaded to the host) of the stage at its peak."""
        model, a = self.model, self.assumptions
        first, last = stage == 0, stage == layout.pp - 1
        n_layers, n_dense = self._held_layers(layout.pp, layout.vpp, stage)
        n_moe = n_layers - n_dense
        mb = layout.micro_batch
        inflight = inflight_microbatches(layout, stage, m)
        per_mb = 0.0
        offloaded_per_mb = 0.0
        worst_layer = 0.0
        recomputed = recomputed_fraction(layout, n_layers)  # block recompute: that share keeps only its input
        # CPU offloading: that share of the layers keeps nothing on the GPU, but one layer's tensors are in transit
        offloaded = min(1.0, (layout.offload_activation_layers or 0) / n_layers) if n_layers else 0.0
        for count, moe_layer in ((n_dense, False), (n_moe, True)):
            if not count:
                continue
            saved, whole = self._layer_bytes(layout, moe_layer)
            if layout.recompute == "selective" and a.selective_policy == "op":
                # the layer being recomputed holds what the policy dropped while its backward runs
                worst_layer = max(worst_layer, whole - saved)
            if layout.recompute == "full":
                if recomputed >= 1.0:  # the layer being recomputed holds its full activations
                    worst_layer = max(worst_layer, whole)
                # (block recompute re-materialises its first layers after backward has freed the stored ones)
                saved = recomputed * saved + (1 - recomputed) * whole
            if offloaded:
                worst_layer = max(worst_layer, saved)  # the layer whose copy to or from the host is in flight
                offloaded_per_mb += count * saved * offloaded
                saved *= 1 - offloaded
            per_mb += count * saved
        activations = inflight * per_mb + worst_layer  # full recompute re-materialises one layer in backward
        host = inflight * offloaded_per_mb
        if first:
            held = min(layout.pp, m) if layout.pp > 1 else 1
            activations += held * embedding_activation_bytes(
                model, layout, seq_len=self.seq_len, micro_batch=mb, dropout=a.dropout
            )
        if last:
            activations += output_activation_bytes(
                model, layout, seq_len=self.seq_len, micro_batch=mb,
                logits_bytes_per_element=a.resolved_logits_bytes_per_element,
            )
        return activations, host

    def _activation_buffers(self, layout: Layout) -> float:
        """Communication buffers sized by the activations: SP's gathered input, p2p, ring-attention K/V, all-to-all."""
        model = self.model
        tp = layout.tp
        tokens = self.seq_len * layout.micro_batch / layout.cp
        h = model.hidden
        sp = layout.sequence_parallel and tp > 1
        buffers = 0.0
        if sp:
            buffers += ACT_BYTES * tokens * h  # all-gathered layer input of the column-parallel GEMMs
        if layout.pp > 1:
            buffers += 2 * ACT_BYTES * tokens * h / (tp if sp else 1)  # p2p send + receive
        if layout.cp > 1:
            kv_width = 2 * model.kv_heads * model.head_dim_ / min(tp, model.kv_heads)
            buffers += 2 * ACT_BYTES * tokens * kv_width  # ring attention K/V in flight (send + receive)
        if layout.ep > 1 and model.moe is not None:
            buffers += 2 * ACT_BYTES * expert_routed_tokens(layout, tokens) * model.moe.top_k * h  # all-to-all in/out
        return buffers


def stage_memory(
    model: ModelSpec,
    layout: Layout,
    *,
    seq_len: int,
    global_batch: int,
    precision: str,
    stage: int,
    assumptions: MemoryAssumptions | None = None,
) -> MemoryBreakdown:
    """Bytes per GPU on pipeline rank `stage` (0-based). Does not validate the layout (the callers do)."""
    return JobMemory(model, seq_len=seq_len, global_batch=global_batch, precision=precision,
                     assumptions=assumptions).stage(layout, stage)


def _validated(model: ModelSpec, layout: Layout, seq_len: int, global_batch: int, precision: str) -> None:
    _check_inputs(seq_len, global_batch, precision)
    validate_layout(layout, model, layout.gpus, global_batch, seq_len)


def memory_per_stage(
    model: ModelSpec,
    layout: Layout,
    *,
    seq_len: int,
    global_batch: int,
    precision: str,
    assumptions: MemoryAssumptions | None = None,
) -> list[MemoryBreakdown]:
    """The breakdown of every pipeline stage (validates the layout first; raises LayoutError/InputError)."""
    _validated(model, layout, seq_len, global_batch, precision)
    return [
        stage_memory(
            model,
            layout,
            seq_len=seq_len,
            global_batch=global_batch,
            precision=precision,
            stage=i,
            assumptions=assumptions,
        )
        for i in range(layout.pp)
    ]


def peak_stage_memory(
    model: ModelSpec,
    layout: Layout,
    *,
    seq_len: int,
    global_batch: int,
    precision: str,
    assumptions: MemoryAssumptions | None = None,
) -> tuple[int, MemoryBreakdown]:
    """(stage, breakdown) of the stage that needs the most memory per GPU: the one that decides fit."""
    _validated(model, layout, seq_len, global_batch, precision)
    return JobMemory(model, seq_len=seq_len, global_batch=global_batch, precision=precision,
                     assumptions=assumptions).peak(layout)
