"""Layout: how a job is split over GPUs, and the one routine that checks it against model and cluster."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Literal

from gpufleet.catalog.records import ModelSpec
from gpufleet.errors import LayoutError

Sharding = Literal["none", "zero1", "zero2", "zero3", "fsdp", "hsdp"]
Recompute = Literal["none", "selective", "full"]
#: What selective recompute re-runs: "attention" = the attention core (Megatron-LM's --recompute-granularity
#: selective); "op" = torchtitan's op-level policy, which saves every matmul output except every second one
#: and the attention kernel's, and recomputes the rest (torchtitan parallelize_llama.py, Dec 2024: "Saves
#: output of all compute ops, except every second mm").
SelectivePolicy = Literal["attention", "op"]
SELECTIVE_POLICIES: tuple[SelectivePolicy, ...] = ("attention", "op")
SHARDINGS: tuple[Sharding, ...] = ("none", "zero1", "zero2", "zero3", "fsdp", "hsdp")
RECOMPUTES: tuple[Recompute, ...] = ("none", "selective", "full")
#: Megatron's rank order, fastest-varying first.
DEFAULT_ORDER = ("tp", "cp", "ep", "dp", "pp")


@dataclass(frozen=True, slots=True)
class Layout:
    """Parallel degrees and memory-saving choices of one plan (Megatron conventions).

    tp*cp*dp*pp == GPUs. ep is carved out of dp*cp (expert layers re-use those ranks), as in Megatron-Core.
    vpp is the number of virtual stages per pipeline rank (1 = plain 1F1B). `hsdp_group` is the
    FSDP shard-group size for hsdp (replicated across dp / hsdp_group).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    sequence_parallel: bool = False
    sharding: Sharding = "none"
    micro_batch: int = 1
    recompute: Recompute = "none"
    offload_optimizer: bool = False
    hsdp_group: int = 8
    order: tuple[str, ...] = DEFAULT_ORDER
    #: tensor parallelism inside the experts (Megatron-Core's --expert-tensor-parallel-size); None = the
    #: convention of `expert_parallel_degrees`
    expert_tp: int | None = None
    #: with recompute "full": how many layers of each pipeline chunk (virtual stage) are recomputed (Megatron's
    #: --recompute-method block --recompute-num-layers, which counts per virtual stage); None = all of them
    recompute_layers: int | None = None
    #: layers of each rank whose saved activations go to CPU memory during the forward and come back for the
    #: backward (Megatron-Core's --cpu-offloading-num-layers); None = none
    offload_activation_layers: int | None = None

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def with_(self, **changes: object) -> Layout:
        return replace(self, **changes)  # type: ignore[arg-type]

    def short(self) -> str:
        """Compact label such as 'tp8 pp4 vpp2 dp16 mb1 zero1 sel'."""
        parts = [f"tp{self.tp}"]
        if self.sequence_parallel and self.tp > 1:
            parts[-1] += "+sp"
        parts.append(f"pp{self.pp}")
        if self.vpp > 1:
            parts.append(f"vpp{self.vpp}")
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
            if self.expert_tp is not None and self.expert_tp != self.tp:
                parts.append(f"etp{self.expert_tp}")
        parts.append(f"dp{self.dp}")
        parts.append(f"mb{self.micro_batch}")
        if self.sharding != "none":
            parts.append(self.sharding)
        if self.recompute != "none":
            parts.append({"selective": "sel", "full": "full-rc"}[self.recompute])
            if self.recompute_layers is not None:
                parts[-1] += f"({self.recompute_layers})"
        if self.offload_optimizer:
            parts.append("offload")
        if self.offload_activation_layers:
            parts.append(f"act-offload({self.offload_activation_layers})")
        return " ".join(parts)


def expert_parallel_degrees(layout: Layout) -> tuple[int, int]:
    """(etp, edp): expert tensor- and data-parallel degrees. An explicit `expert_tp` wins; otherwise etp = tp
    when ep divides dp·cp (Megatron-Core's default --expert-tensor-parallel-size = tp), else etp = 1 (MoE
    parallel folding). edp = dp·cp·tp / (ep·etp) ranks hold the same experts. (Megatron-Core itself keeps
    etp = tp and refuses the second case; the fallback is gpufleet's, so the default can change with dp.)"""
    if layout.expert_tp is not None:
        etp = layout.expert_tp
    elif layout.ep == 1 or (layout.dp * layout.cp) % layout.ep == 0:
        etp = layout.tp
    else:
        etp = 1
    return etp, layout.dp * layout.cp * layout.tp // (layout.ep * etp)


def layers_per_chunk(model_layers: int, layout: Layout) -> int:
    """Layers of one pipeline chunk (a virtual stage; the whole rank's share at vpp 1), rounded up."""
    return math.ceil(model_layers / (layout.pp * layout.vpp))


def recomputed_fraction(layout: Layout, stage_layers: float) -> float:
    """Share of a pipeline rank's `stage_layers` layers whose forward is recomputed in full (0 without full
    recompute; block recompute of `recompute_layers` layers in each of the rank's vpp chunks, at most all)."""
    if layout.recompute != "full":
        return 0.0
    if layout.recompute_layers is None or stage_layers <= 0:
        return 1.0
    return min(1.0, layout.recompute_layers * layout.vpp / stage_layers)


def local_expert_tokens(layout: Layout, tokens: float) -> float:
    """Tokens a rank routes itself, out of the `tokens` its micro-batch holds: its own tokens/tp under sequence
    parallelism. These are what its all-to-all sends (Megatron-Core's alltoall dispatcher)."""
    return tokens / layout.tp if layout.sequence_parallel else tokens


def expert_routed_tokens(layout: Layout, tokens: float) -> float:
    """Tokens a rank's experts compute on: its own routed tokens, all-gathered over the etp ranks that share an
    expert after the all-to-all (etp = tp: the whole sequence on every rank of the TP group)."""
    etp, _ = expert_parallel_degrees(layout)
    return local_expert_tokens(layout, tokens) * (etp if layout.sequence_parallel else 1)


def micro_batches_per_step(layout: Layout, global_batch: int) -> int:
    """Micro-batches each pipeline runs per optimizer step (gradient accumulation steps)."""
    return global_batch // (layout.dp * layout.micro_batch)


def validate_layout(layout: Layout, model: ModelSpec, gpus: int, global_batch: int, seq_len: int) -> None:
    """Raise LayoutError naming the first broken constraint (every degree printed in the message)."""
    def broken(constraint: str, why: str) -> LayoutError:
        degrees = f"tp={layout.tp} pp={layout.pp} dp={layout.dp} cp={layout.cp} ep={layout.ep} vpp={layout.vpp}"
        return LayoutError(constraint, f"invalid layout ({degrees}, micro_batch={layout.micro_batch}): {why}")

    if min(layout.tp, layout.pp, layout.dp, layout.cp, layout.ep, layout.vpp, layout.micro_batch) < 1:
        name = next(name for name in ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch") if getattr(layout, name) < 1)
        raise broken("positive", f"{name} must be at least 1")
    if layout.sharding not in SHARDINGS:
        raise broken("sharding", f"sharding must be one of {', '.join(SHARDINGS)}")
    if layout.recompute not in RECOMPUTES:
        raise broken("recompute", f"recompute must be one of {', '.join(RECOMPUTES)}")
    if layout.offload_activation_layers is not None:
        k = layout.offload_activation_layers
        if k < 1 or k >= model.layers or layout.pp > 1 or layout.recompute != "none":
            raise broken("offload-activations", f"offload_activation_layers={k} needs 1..{model.layers - 1} layers "
                         "(Megatron-Core keeps the last on the GPU), pp=1 and no recompute")
    if layout.recompute_layers is not None:
        chunk = layers_per_chunk(model.layers, layout)
        if layout.recompute != "full" or not 1 <= layout.recompute_layers <= chunk:
            raise broken("recompute-layers", f"recompute_layers={layout.recompute_layers} needs recompute full and "
                         f"1..{chunk} (the layers of one pipeline chunk)")
    if layout.gpus != gpus:
        raise broken("product", f"tp*pp*cp*dp = {layout.gpus} but the cluster has {gpus} GPUs")
    if model.heads % layout.tp:
        raise broken("tp-heads", f"tp={layout.tp} must divide the {model.heads} attention heads")
    if model.kv_heads % layout.tp and layout.tp % model.kv_heads:
        raise broken("tp-kv-heads", f"tp={layout.tp} and kv_heads={model.kv_heads}: one must divide the other")
    if layout.pp * layout.vpp > max_virtual_stages(model):
        raise broken(
            "pp-layers",
            f"pp*vpp={layout.pp * layout.vpp} virtual stages exceed the model's {model.layers} layers "
            "plus the embedding and the output head",
        )
    if layout.vpp > 1 and layout.pp == 1:
        raise broken("vpp", "vpp > 1 needs pipeline parallelism (pp > 1)")
    if seq_len % layout.cp:
        raise broken("cp-seq", f"cp={layout.cp} must divide the sequence length {seq_len}")
    if layout.cp > 1 and (seq_len // layout.cp) % 2:
        raise broken("cp-seq", f"seq/cp = {seq_len // layout.cp} must be even (load-balanced causal CP)")
    if layout.sequence_parallel and seq_len % (layout.tp * layout.cp):
        raise broken("sp-seq", f"sequence parallel needs tp*cp={layout.tp * layout.cp} to divide {seq_len}")
    if layout.ep > 1:
        if model.moe is None:
            raise broken("ep-moe", f"ep={layout.ep} needs a mixture-of-experts model")
        if model.moe.experts % layout.ep:
            raise broken("ep-experts", f"ep={layout.ep} must divide the {model.moe.experts} experts")
        if (layout.dp * layout.cp * layout.tp) % layout.ep:
            raise broken("ep-ranks", f"ep={layout.ep} must divide dp*cp*tp={layout.dp * layout.cp * layout.tp}")
    if layout.expert_tp is not None:
        ranks = layout.dp * layout.cp * layout.tp
        if model.moe is None:
            raise broken("etp-moe", f"expert_tp={layout.expert_tp} needs a mixture-of-experts model")
        if layout.expert_tp < 1 or layout.tp % layout.expert_tp:
            raise broken("etp", f"expert_tp={layout.expert_tp} must divide tp={layout.tp}")
        if ranks % (layout.ep * layout.expert_tp):
            raise broken("etp-ranks", f"ep*expert_tp={layout.ep * layout.expert_tp} must divide dp*cp*tp={ranks}")
    if global_batch % layout.dp:
        raise broken("dp-batch", f"dp={layout.dp} must divide the global batch {global_batch}")
    if (global_batch // layout.dp) % layout.micro_batch:
        raise broken(
            "micro-batch",
            f"micro_batch={layout.micro_batch} must divide the per-replica batch {global_batch // layout.dp}",
        )
    if layout.vpp > 1 and micro_batches_per_step(layout, global_batch) % layout.pp:
        raise broken("vpp-microbatches", "interleaved schedules need micro-batches per step divisible by pp")
    if layout.sharding == "hsdp" and (layout.hsdp_group < 2 or layout.dp % layout.hsdp_group):
        raise broken("hsdp", f"hsdp shard group {layout.hsdp_group} must divide dp={layout.dp}")


def max_virtual_stages(model: ModelSpec) -> int:
    """Most pipeline chunks (pp·vpp) a model splits into: one per layer, plus a first and a last chunk that hold
    only the embedding and the output head (Megatron-Core's account_for_embedding/loss_in_pipeline_split;
    405B's 126 layers on pp16 × vpp8 = 128 chunks)."""
    return model.layers + 2


@lru_cache(maxsize=4096)
def chunk_layer_counts(layers: int, chunks: int) -> tuple[int, ...]:
    """Transformer layers in each of `chunks` contiguous model chunks (pp x vpp of them, first to last). When they
    do not divide evenly, the extra layers go to the middle chunks first: the first chunk also holds the embedding
    and the last the output head and loss (Megatron's uneven first/last stage convention)."""
    base, extra = divmod(layers, chunks)
    order = [*range(1, chunks - 1), 0, chunks - 1] if chunks > 2 else list(range(chunks))
    sizes = [base] * chunks
    for chunk in order[:extra]:
        sizes[chunk] += 1
    return tuple(sizes)


@lru_cache(maxsize=4096)
def stage_layer_indices(layers: int, pp: int, vpp: int, stage: int) -> tuple[int, ...]:
    """Transformer layers held by pipeline rank `stage` (0-based), interleaved over `vpp` chunks: the layers split
    into pp*vpp contiguous chunks (`chunk_layer_counts`) and chunk c goes to rank c % pp."""
    chunks = pp * vpp
    sizes = chunk_layer_counts(layers, chunks)
    starts = [0] * chunks
    for chunk in range(1, chunks):
        starts[chunk] = starts[chunk - 1] + sizes[chunk - 1]
    held: list[int] = []
    for chunk in range(stage, chunks, pp):
        held.extend(range(starts[chunk], starts[chunk] + sizes[chunk]))
    return tuple(held)


@lru_cache(maxsize=4096)
def stage_layer_split(layers: int, pp: int, vpp: int, first_moe_layer: int) -> tuple[tuple[int, int], ...]:
    """(dense layers, MoE layers) held by each pipeline rank; layers from `first_moe_layer` on are MoE."""
    split = []
    for stage in range(pp):
        held = stage_layer_indices(layers, pp, vpp, stage)
        moe = sum(1 for index in held if index >= first_moe_layer)
        split.append((len(held) - moe, moe))
    return tuple(split)
