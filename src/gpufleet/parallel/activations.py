"""Activation memory per GPU: Korthikanti et al. 2022 generalised to GQA/MLA, gated MLPs and MoE.

Reference: V. Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(MLSys 2023, arXiv:2205.05198), section 4 and Table 2. For a GPT layer with 16-bit activations,
dropout and an eager attention kernel they count, per layer and micro-batch (bytes)::

    no parallelism          s·b·h·(34 + 5·a·s/h)
    tensor parallel (t)     s·b·h·(10 + 24/t + 5·a·s/(h·t))
    TP + sequence parallel  s·b·h·(34/t + 5·a·s/(h·t))
    + selective recompute   the 5·a·s/h score term disappears
    full recompute          2·s·b·h  (the layer input only)

This module splits those bytes into three classes and generalises each:

* *sequence terms* (bytes per token, width h): norm inputs, GEMM inputs of the QKV projection and of the
  MLP, dropout masks, MoE router probabilities and the dispatched expert inputs/outputs. Replicated
  across TP ranks unless sequence parallelism splits them (/t) — except that PyTorch's DTensor TP keeps the
  column-parallel GEMM inputs all-gathered (`column_inputs`, `gathered_column_inputs`).
* *TP terms* (bytes per token, split /t by TP): Q, K, V, the attention output (= output-projection input),
  the MLP intermediates (plain: GeLU in + out = 2 tensors of width f; gated SwiGLU: fc1 output of width 2f
  + fc2 input of width f = 3 tensors of width f), shared-expert and routed-expert intermediates.
* *score term* (bytes per head·query·key): the softmax output (2), dropout mask (1) and dropout output (2)
  of an eager kernel. Flash attention never materialises it; it saves only a fp32 log-sum-exp per head
  and token (a TP term). Flash attention is the default because Megatron-Core/TE, torchtitan and
  DeepSpeed all use it today.

FP8 training (Transformer Engine): every GEMM saves the fp8 copy of its input that it already made for the
forward GEMM, for the weight-gradient GEMM in backward (TE's `LayerNormLinear`/`LayerNormMLP`/`Linear` keep
`ln_out` and the activation output in fp8, `save_for_backward` in module/layernorm_mlp.py). So the two norm
outputs and the MLP's fc2 input take 1 byte per element instead of 2, while the attention output is kept
twice: bf16 for the attention kernel's backward and fp8 for the output projection.

Assumptions (also in docs/memory.md): activations are 16-bit except the fp8 GEMM inputs above; no dropout
by default (Llama-style models train without it); RoPE adds
nothing (the rotated q/k are what flash attention saves); GQA stores K and V at kv_heads·head_dim wide,
and when tp > kv_heads each rank keeps one whole KV head; MoE routing is perfectly balanced and dropless
(each GPU sees local tokens × top_k expert inputs on average); CP divides the sequence for everything, and
an eager kernel's score matrix becomes (s/cp)·s per rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.catalog.records import ModelSpec
from gpufleet.parallel.layout import Layout, Recompute, SelectivePolicy, expert_routed_tokens

#: bytes per element of a saved activation (bf16/fp16)
ACT_BYTES = 2.0
#: bytes per fp32 element (flash-attention log-sum-exp, router probabilities, fp32 softmax of the logits)
FP32_BYTES = 4.0
#: bytes per token id kept for the embedding backward (int64)
TOKEN_ID_BYTES = 8.0
#: bytes per element of a GEMM input saved in fp8 for the weight-gradient GEMM (Transformer Engine)
FP8_BYTES = 1.0


@dataclass(frozen=True, slots=True)
class LayerActivationTerms:
    """Saved bytes of one layer and one token (or one head·query·key for `score`), before parallelism."""

    seq: float  # replicated across TP unless sequence parallel
    tp: float  # divided by TP
    routed: float  # per token this rank routes to the experts (the dispatched copies; see expert_routed_tokens)
    score: float  # eager-attention score bytes per head·query·key (0 with flash attention)
    heads_per_gpu: float  # attention heads on one TP rank (for the score term)
    #: torchtitan's op-level selective checkpointing keeps only these (sequence / per-GPU TP bytes per token)
    op_seq: float = 0.0
    op_tp: float = 0.0
    #: the part of `seq` that is column-parallel GEMM inputs (QKV's; a dense MLP's up-projection's): Megatron keeps
    #: them as the sequence-parallel shard, PyTorch's DTensor TP keeps them all-gathered
    column_inputs: float = 0.0


def _attention_terms(model: ModelSpec, tp: int, flash_attention: bool, dropout: bool,
                     gemm_input_bytes: float) -> tuple[float, float]:
    """(seq bytes, per-GPU tp bytes) of the attention half of one layer, per token."""
    h = model.hidden
    seq = (ACT_BYTES + gemm_input_bytes) * h  # norm input + QKV GEMM input (the norm output)
    if dropout:
        seq += 1.0 * h  # dropout mask after the output projection (1 byte)
    if model.mla is not None:
        mla = model.mla
        qk = model.heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
        v = model.heads * mla.v_head_dim
        # q/k/v up-projections' outputs (sharded) and the attention output
        tp_bytes = ACT_BYTES * (2 * qk + 2 * v) / tp
        output_width = v / tp
        # latent paths (replicated across TP here): q down out + its norm out, kv down out + its norm out
        seq += ACT_BYTES * (2 * mla.q_lora_rank + 2 * mla.kv_lora_rank + mla.qk_rope_head_dim)
    else:
        d = model.head_dim_
        q_local = model.heads * d / tp
        kv_local = d * model.kv_heads / min(tp, model.kv_heads)  # one whole KV head when tp > kv_heads
        tp_bytes = ACT_BYTES * (2 * q_local + 2 * kv_local)  # Q, attention output; K, V
        output_width = q_local
    if gemm_input_bytes != ACT_BYTES:
        tp_bytes += gemm_input_bytes * output_width  # the output projection's own fp8 copy of its input
    if flash_attention:
        tp_bytes += FP32_BYTES * model.heads / tp  # log-sum-exp per head and token
    return seq, tp_bytes


def _mlp_tp_bytes(model: ModelSpec, width: float, gemm_input_bytes: float) -> float:
    """Intermediate bytes per token of one MLP of width `width` (before TP): the fc1 output (2 tensors of
    width f when gated) in 16 bits, and the fc2 input (the activation output) at the GEMM-input width."""
    return ACT_BYTES * (2 if model.gated_mlp else 1) * width + gemm_input_bytes * width


def layer_terms(
    model: ModelSpec, tp: int, *, moe_layer: bool, flash_attention: bool = True, dropout: bool = False,
    fp8: bool = False,
) -> LayerActivationTerms:
    """Saved bytes per token of one layer (no recompute), split into sequence / TP / score terms.

    `fp8`: GEMM inputs are saved as the 1-byte copies Transformer Engine casts them to (module docstring).
    """
    h = model.hidden
    gemm_input = FP8_BYTES if fp8 else ACT_BYTES
    seq, tp_bytes = _attention_terms(model, tp, flash_attention, dropout, gemm_input)
    moe = model.moe
    is_moe = moe_layer and moe is not None
    routed = 0.0
    # second norm input + MLP input (a MoE layer's router is a 16-bit GEMM: its input stays bf16)
    seq += (ACT_BYTES + (ACT_BYTES if is_moe else gemm_input)) * h
    if dropout:
        seq += 1.0 * h  # dropout mask after the MLP
    if is_moe and moe is not None:
        seq += FP32_BYTES * moe.experts  # router probabilities (fp32)
        # dispatched copies of each routed token (the experts' fc1 input). The expert outputs are not kept: since
        # Megatron-Core 0.13 the routing weights multiply inside the experts' activation function instead of
        # the un-permute, so the combine needs no saved outputs (MoE README, "memory efficient token permutation").
        routed = moe.top_k * gemm_input * h
        tp_bytes += _mlp_tp_bytes(model, moe.top_k * moe.expert_ffn_hidden, gemm_input) / tp
        tp_bytes += _mlp_tp_bytes(model, moe.shared_experts * moe.expert_ffn_hidden, gemm_input) / tp
    else:
        tp_bytes += _mlp_tp_bytes(model, model.ffn_hidden or 0, gemm_input) / tp
    score = 0.0 if flash_attention else (2.0 + (3.0 if dropout else 0.0))
    op_seq, op_tp = _op_level_terms(model, tp, is_moe, tp_bytes,
                                    _attention_terms(model, tp, flash_attention, dropout, gemm_input)[1])
    # QKV's input and the MLP's (a MoE layer's is the bf16 router input: DTensor TP gathers it for the router)
    column_inputs = gemm_input * h + (ACT_BYTES if is_moe else gemm_input) * h
    return LayerActivationTerms(seq=seq, tp=tp_bytes, routed=routed, score=score,
                                heads_per_gpu=model.heads / tp, op_seq=op_seq, op_tp=op_tp,
                                column_inputs=column_inputs)


def _op_level_terms(model: ModelSpec, tp: int, is_moe: bool, layer_tp_bytes: float,
                    attention_tp_bytes: float) -> tuple[float, float]:
    """(sequence, per-GPU TP) bytes per token that torchtitan's op-level selective checkpointing keeps: the
    block input, the attention kernel's output and log-sum-exp, every matmul output except every second one
    in call order q, k, v, out, up, gate, down (so q, v, up and down; under SP also the two reduce-scatter
    outputs, added in `layer_bytes`). The down projection's output is a full-width partial sum on every TP
    rank. MLA's other attention tensors and a MoE layer's MLP keep half their no-recompute bytes (which
    matmuls fall on even counts depends on the implementation: judgement). `layer_tp_bytes` and
    `attention_tp_bytes` are the layer's and its attention half's no-recompute TP bytes."""
    h = model.hidden
    seq = ACT_BYTES * h  # the block input (the checkpoint's own argument)
    output_width = model.mla.v_head_dim if model.mla is not None else model.head_dim_
    attention_out = ACT_BYTES * model.heads * output_width / tp + FP32_BYTES * model.heads / tp
    if model.mla is not None:
        attention = attention_out + (attention_tp_bytes - attention_out) / 2
    else:
        q = ACT_BYTES * model.heads * model.head_dim_ / tp
        v = ACT_BYTES * model.head_dim_ * model.kv_heads / min(tp, model.kv_heads)
        attention = q + v + attention_out
    if is_moe:
        return seq, attention + (layer_tp_bytes - attention_tp_bytes) / 2
    f = model.ffn_hidden or 0
    up = ACT_BYTES * f / tp  # the first MLP matmul (up, the 5th) is kept
    down = ACT_BYTES * h if model.gated_mlp else 0.0  # gated: down is the 7th, kept; plain: the 6th, recomputed
    return seq, attention + up + down


def layer_bytes(
    terms: LayerActivationTerms,
    model: ModelSpec,
    layout: Layout,
    *,
    seq_len: int,
    micro_batch: int,
    recompute: Recompute,
    selective_policy: SelectivePolicy = "attention",
    gathered_column_inputs: bool = False,
) -> float:
    """Bytes one GPU keeps for one layer and one micro-batch, given precomputed terms. `gathered_column_inputs`:
    under sequence parallelism the column GEMMs' inputs are kept all-gathered (DTensor TP), not as the shard."""
    tokens = seq_len * micro_batch / layout.cp
    sp = layout.sequence_parallel and layout.tp > 1
    seq_split = layout.tp if sp else 1
    if recompute == "full":
        return ACT_BYTES * model.hidden * tokens / seq_split  # the checkpointed layer input
    if recompute == "selective" and selective_policy == "op":
        reduce_scatter_outputs = 2 * ACT_BYTES * model.hidden if sp else 0.0
        routed_half = expert_routed_tokens(layout, tokens) * terms.routed / 2  # the MoE judgement above
        return tokens * ((terms.op_seq + reduce_scatter_outputs) / seq_split + terms.op_tp) + routed_half
    seq_bytes = terms.seq / seq_split
    if sp and gathered_column_inputs:
        seq_bytes += terms.column_inputs * (1 - 1 / seq_split)
    total = tokens * (seq_bytes + terms.tp) + expert_routed_tokens(layout, tokens) * terms.routed
    if recompute == "none" and terms.score:
        # eager attention: heads/t × (s/cp queries) × s keys × b per GPU
        total += terms.score * terms.heads_per_gpu * tokens * seq_len
    return total


def activation_bytes_per_layer(
    model: ModelSpec,
    layout: Layout,
    *,
    seq_len: int,
    micro_batch: int,
    moe_layer: bool | None = None,
    flash_attention: bool = True,
    dropout: bool = False,
    recompute: Recompute | None = None,
    fp8: bool = False,
    selective_policy: SelectivePolicy = "attention",
    gathered_column_inputs: bool = False,
) -> float:
    """Activation bytes one GPU saves for one layer and one micro-batch (Korthikanti et al. 2022, Table 2).

    `moe_layer` picks a dense or MoE layer (default: MoE if the model has experts); `recompute` defaults to
    the layout's. With `flash_attention=False, dropout=True` on a GPT-style model (plain MLP of width 4h,
    MHA, LayerNorm) this reproduces the paper's expressions exactly.
    """
    is_moe = model.moe is not None if moe_layer is None else moe_layer
    terms = layer_terms(model, layout.tp, moe_layer=is_moe, flash_attention=flash_attention, dropout=dropout,
                        fp8=fp8)
    return layer_bytes(
        terms,
        model,
        layout,
        seq_len=seq_len,
        micro_batch=micro_batch,
        recompute=layout.recompute if recompute is None else recompute,
        selective_policy=selective_policy,
        gathered_column_inputs=gathered_column_inputs,
    )


def inflight_microbatches(layout: Layout, stage: int, micro_batches: int) -> float:
    """Micro-batches whose activations pipeline rank `stage` holds at its peak, in units of its whole layers.

    1F1B (Narayanan et al. 2021): rank i warms up with pp−i−1 forwards, then holds pp−i micro-batches.
    Interleaved 1F1B (Megatron's schedule, vpp model chunks per rank): rank i runs 2(pp−i−1) + (vpp−1)·pp
    warm-up chunk forwards plus one, each chunk 1/vpp of the rank's layers; on rank 0 this is
    Korthikanti's factor (1 + (pp−1)/(pp·vpp)) over 1F1B. Both are capped by the micro-batches per step.
    """
    if layout.pp == 1:
        return 1.0
    if layout.vpp == 1:
        return float(min(layout.pp - stage, micro_batches))
    chunks = 2 * (layout.pp - stage - 1) + (layout.vpp - 1) * layout.pp + 1
    return min(chunks, micro_batches * layout.vpp) / layout.vpp


def embedding_activation_bytes(
    model: ModelSpec, layout: Layout, *, seq_len: int, micro_batch: int, dropout: bool = False
) -> float:
    """First stage, per micro-batch in flight: token ids (int64) and the embedding dropout mask if any."""
    tokens = seq_len * micro_batch / layout.cp
    total = TOKEN_ID_BYTES * tokens
    if dropout:
        sp = layout.sequence_parallel and layout.tp > 1
        total += 1.0 * model.hidden * tokens / (layout.tp if sp else 1)
    return total


def output_activation_bytes(
    model: ModelSpec,
    layout: Layout,
    *,
    seq_len: int,
    micro_batch: int,
    logits_bytes_per_element: float,
) -> float:
    """Last stage, one micro-batch: final-norm input, output-layer input, logits (vocab-parallel, /t); bytes held
    per logit element (the catalog judgement logits-bytes-per-element, or a stack's)."""
    tokens = seq_len * micro_batch / layout.cp
    sp = layout.sequence_parallel and layout.tp > 1
    hidden = 2 * ACT_BYTES * model.hidden * tokens / (layout.tp if sp else 1)
    logits = logits_bytes_per_element * model.vocab * tokens / layout.tp
    return hidden + logits
