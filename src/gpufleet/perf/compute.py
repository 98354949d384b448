"""Compute time of one transformer layer for one micro-batch on one GPU, after sharding.

Three kinds of kernel, each against its own bound:
* GEMMs: 2·M·N·K FLOPs at peak × the calibrated best-shape fraction × a shape factor Π d/(d+d½)
  (small sharded dimensions run less efficiently — tp and micro-batch size change this);
* fused attention: score FLOPs at peak × the calibrated attention fraction (flash attention's backward
  recomputes the scores: 2.5× forward FLOPs instead of 2×);
* memory-bound element-wise kernels (norms, residual adds, activation, rotary): bytes / (HBM × fraction).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.judgements import Judgements
from gpufleet.catalog.records import GPUSpec, ModelSpec, MoESpec, Precision
from gpufleet.catalog.stacks import RecomputeEarlyStop
from gpufleet.parallel.layout import Layout, SelectivePolicy, expert_parallel_degrees, expert_routed_tokens
from gpufleet.workload.flops import attention_score_flops_per_token
from gpufleet.workload.params import attention_params

#: bf16 activations
ACTIVATION_BYTES = 2
#: Element-wise passes over the MLP intermediate: gated (read gate and up, write product) 3, plain 2.
ELEMENTWISE_FFN_PASSES_GATED = 3
ELEMENTWISE_FFN_PASSES_PLAIN = 2
#: Backward element-wise traffic relative to forward.
BACKWARD_ELEMENTWISE_RATIO = 2.0
#: Eager PyTorch (no torch.compile, no fused kernels; torchtitan's own RMSNorm, rotary and SwiGLU) moves more
#: than the fused kernels above, counted from its op sequence in bf16-element (2 B) passes:
#: RMSNorm `y = x.float(); (y * rsqrt(y.pow(2).mean(-1) + eps)).type_as(x) * w` reads and writes 6 + 8 + 4 + 8 +
#: 6 + 4 = 36 B per element, 18 passes where a fused kernel makes 2: 16 more per norm.
EAGER_RMSNORM_EXTRA_PASSES = 16
#: Rotary `view_as_real(view_as_complex(x.float()) * freqs).type_as(x)` on q and k: 6 + 8 + 6 = 20 B, 10 passes
#: over the q and k widths where a fused kernel makes 2: 8 more.
EAGER_ROTARY_EXTRA_PASSES = 8
#: `silu(gate) * up` as two kernels: silu reads and writes (2 passes), the product reads two and writes one
#: (3): 5 passes over the MLP width where a fused kernel makes 3: 2 more.
EAGER_GATED_EXTRA_PASSES = 2
#: MoE token shuffling per token and routed copy: permute (read+write h) and un-permute/combine (read h),
#: plus writing the combined output once: (3·top_k + 1)·h elements forward.
MOE_PERMUTE_PASSES_PER_COPY = 3
#: FP8 GEMMs (Transformer Engine): every GEMM input is cast bf16 -> fp8 (read 2 B, write 1 B = 1.5
#: bf16-element equivalents per input element).
FP8_CAST_ELEMENT_EQUIVALENTS = 1.5
#: Flash attention backward FLOPs relative to forward (recomputes QK^T: 2.5x instead of 2x).
ATTENTION_BACKWARD_RATIO = 2.5
#: First-generation fused attention (FlashAttention-1 and its Triton port) relative to the FA2-class
#: kernels `attention_fraction` describes: the FlashAttention-2 paper (Dao 2023, abstract) puts FA1 at
#: 25-40 % of A100 peak and FA2 at 50-73 %; midpoints 0.325 / 0.615.
FLASH_V1_RELATIVE_SPEED = 0.325 / 0.615
#: Materialized (non-flash) attention, Megatron's fused scale-mask-softmax with attention dropout: bytes
#: moved per score element. Forward: write QK^T (2), softmax read+write (4), dropout read+write+mask (5),
#: AV reads the probabilities (2) = 13. Backward: write dP (2), dropout grad (5), softmax grad reads P and
#: dP and writes dS (6), dQ and dK GEMMs read dS (2+2) = 17. Derived from the kernel sequence (judgement).
MATERIALIZED_SCORE_BYTES_FWD = 13
MATERIALIZED_SCORE_BYTES_BWD = 17


@dataclass(frozen=True, slots=True)
class LayerCompute:
    """Seconds for one layer and one micro-batch on one GPU."""

    gemm_fwd_s: float
    attention_fwd_s: float
    attention_bwd_s: float
    elementwise_fwd_s: float
    gemm_flops_fwd: float
    attention_flops_fwd: float
    #: forward seconds / FLOPs of every second matmul in call order (q, k, v, out; up, gate, down): what
    #: torchtitan's op-level selective checkpointing recomputes
    alternate_matmul_fwd_s: float = 0.0
    alternate_matmul_flops_fwd: float = 0.0
    #: forward seconds of the column-parallel GEMMs of the attention block (QKV) and of the MLP (up/gate: the dense
    #: MLP's, a MoE layer's shared experts', else 0): their backward hides the block's TP input-gradient reduction
    qkv_gemm_fwd_s: float = 0.0
    mlp_up_gemm_fwd_s: float = 0.0
    #: forward seconds / FLOPs of the layer's last GEMM, the dense MLP's down projection (0 in a MoE layer): what a
    #: full recompute that stops early does not re-run (`recompute_s`)
    mlp_down_gemm_fwd_s: float = 0.0
    mlp_down_gemm_flops_fwd: float = 0.0

    @property
    def forward_s(self) -> float:
        return self.gemm_fwd_s + self.attention_fwd_s + self.elementwise_fwd_s

    @property
    def backward_s(self) -> float:
        return (2 * self.gemm_fwd_s + self.attention_bwd_s
                + BACKWARD_ELEMENTWISE_RATIO * self.elementwise_fwd_s)

    def recompute_s(self, recompute: str, selective_policy: SelectivePolicy = "attention",
                    early_stop: bool = False) -> float:
        """Extra forward work in the backward pass: full = whole layer (less its last GEMM when the recompute
        stops early: `recompute_stops_early`); selective = the attention core (Megatron) or, under the "op"
        policy, every second matmul and all element-wise ops (torchtitan)."""
        if recompute == "full":
            return self.forward_s - (self.mlp_down_gemm_fwd_s if early_stop else 0.0)
        if recompute == "selective":
            if selective_policy == "op":
                return self.alternate_matmul_fwd_s + self.elementwise_fwd_s
            return self.attention_fwd_s
        return 0.0

    def recompute_flops(self, recompute: str, selective_policy: SelectivePolicy = "attention",
                        early_stop: bool = False) -> float:
        """Tensor-core FLOPs of `recompute_s` (element-wise work does none)."""
        if recompute == "full":
            return self.flops_fwd - (self.mlp_down_gemm_flops_fwd if early_stop else 0.0)
        if recompute == "selective":
            return self.alternate_matmul_flops_fwd if selective_policy == "op" else self.attention_flops_fwd
        return 0.0

    @property
    def flops_fwd(self) -> float:
        return self.gemm_flops_fwd + self.attention_flops_fwd


def recompute_stops_early(early_stop: RecomputeEarlyStop, precision: Precision, compiled: bool) -> bool:
    """Whether a full recompute skips the layer's last GEMM (the MLP down projection) under `early_stop`: 16-bit
    GEMMs run as aten ops and stop early; FP8/FP4 ones only in a compiled block ("aten-or-compiled")."""
    if early_stop == "off":
        return False
    return precision not in ("fp8", "fp4") or (early_stop == "aten-or-compiled" and compiled)


def shape_factor(calibration: CalibrationProfile, *dims: float) -> float:
    """Efficiency relative to the best shape: Π d/(d + d½) over the GEMM's dimensions."""
    factor = 1.0
    half = calibration.gemm_half_dim
    for dim in dims:
        factor *= dim / (dim + half)
    return factor


def gemm_time_s(m: float, n: float, k: float, peak_flops: float, calibration: CalibrationProfile,
                precision: str, count: float = 1.0) -> float:
    """Seconds for `count` GEMMs of shape M×N×K."""
    if m <= 0 or n <= 0 or k <= 0 or count <= 0:
        return 0.0
    efficiency = (calibration.in_training_fraction * calibration.gemm_fraction(precision)
                  * shape_factor(calibration, m, n, k))
    return count * 2 * m * n * k / (peak_flops * efficiency)


def _eager_extra_elements_per_token(model: ModelSpec, hidden_share: float, ffn_share: float, tp: int) -> float:
    """Element passes per token that eager PyTorch adds over fused kernels: two RMSNorms (LayerNorm is one ATen
    kernel either way), rotary on q and k (none with learned positions; MLA's partial rotary is left out), and a
    gated MLP's activation."""
    extra = 0.0
    if model.norm == "rmsnorm":
        extra += 2 * EAGER_RMSNORM_EXTRA_PASSES * hidden_share
    if model.learned_positions == 0 and model.mla is None:
        extra += EAGER_ROTARY_EXTRA_PASSES * (model.heads + model.kv_heads) * model.head_dim_ / tp
    if model.gated_mlp:
        extra += EAGER_GATED_EXTRA_PASSES * ffn_share
    return extra


@dataclass(frozen=True, slots=True)
class _LayerShape:
    """What sizes one layer's kernels on one GPU: the model, the layout, tokens per micro-batch and the peaks."""

    model: ModelSpec
    layout: Layout
    calibration: CalibrationProfile
    precision: Precision
    seq_len: int
    tokens: float  # per micro-batch on this GPU (after cp)
    gemm_peak: float  # FLOP/s of the job's GEMM precision
    attn_peak: float  # FLOP/s of the 16-bit kernels (attention, router): fp8 recipes keep them in bf16
    judged: Judgements  # the catalog's judgement constants (shares, passes, the router's GEMM fraction)

    def gemm(self, m: float, n: float, k: float, count: float = 1.0) -> float:
        """Seconds of `count` GEMMs of shape M×N×K in the job's precision."""
        return gemm_time_s(m, n, k, self.gemm_peak, self.calibration, self.precision, count)


@dataclass(frozen=True, slots=True)
class _Gemms:
    """Forward GEMM seconds and FLOPs of a layer's blocks so far, of every second matmul (what op-level selective
    recompute re-runs), of the column-parallel GEMMs (QKV; MLP up/gate) and the MLP's width per token."""

    s: float
    flops: float
    alternate_s: float
    alternate_flops: float
    qkv_s: float
    up_s: float = 0.0
    ffn_width: float = 0.0
    down_s: float = 0.0  # the dense MLP's down projection (the layer's last GEMM)
    down_flops: float = 0.0


@dataclass(frozen=True, slots=True)
class _AttentionCore:
    """Seconds of the attention core (scores and values) forward and backward, and its forward FLOPs."""

    fwd_s: float
    bwd_s: float
    flops: float


def layer_compute(model: ModelSpec, layout: Layout, gpu: GPUSpec, calibration: CalibrationProfile,
                  *, seq_len: int, precision: Precision, moe_layer: bool, judged: Judgements,
                  fused_elementwise: bool = True) -> LayerCompute:
    """Forward compute of one layer for one micro-batch on one GPU of `layout`; `fused_elementwise=False`
    prices eager PyTorch's unfused norms, rotary and gated activation; `judged`: the catalog's judgements."""
    shape = _LayerShape(model, layout, calibration, precision, seq_len, tokens=layout.micro_batch * seq_len / layout.cp,
                        gemm_peak=gpu.peak_flops(precision),
                        attn_peak=gpu.peak_flops("bf16" if precision in ("fp8", "fp4") else precision), judged=judged)
    projections = _attention_projections(shape)
    moe = model.moe if moe_layer else None
    gemms = _moe_mlp(shape, moe, projections) if moe is not None else _dense_mlp(shape, projections)
    core = _attention_core(shape, gpu.hbm_bytes_per_s)
    elements = _elementwise_elements(shape, gemms.ffn_width, moe is not None, fused_elementwise)
    elementwise_s = elements * ACTIVATION_BYTES / (gpu.hbm_bytes_per_s * calibration.hbm_fraction)
    return LayerCompute(
        gemm_fwd_s=gemms.s,
        attention_fwd_s=core.fwd_s,
        attention_bwd_s=core.bwd_s,
        elementwise_fwd_s=elementwise_s,
        gemm_flops_fwd=gemms.flops,
        attention_flops_fwd=core.flops,
        alternate_matmul_fwd_s=gemms.alternate_s,
        alternate_matmul_flops_fwd=gemms.alternate_flops,
        qkv_gemm_fwd_s=gemms.qkv_s,
        mlp_up_gemm_fwd_s=gemms.up_s,
        mlp_down_gemm_fwd_s=gemms.down_s,
        mlp_down_gemm_flops_fwd=gemms.down_flops,
    )


def _attention_projections(shape: _LayerShape) -> _Gemms:
    """QKV then the output projection (MLA: treated as the same parameter count)."""
    model, tokens, tp, h = shape.model, shape.tokens, shape.layout.tp, shape.model.hidden
    if model.mla is None:
        q_width = model.heads * model.head_dim_
        kv_width = 2 * model.kv_heads * model.head_dim_
        qkv_s = shape.gemm(tokens, (q_width + kv_width) / tp, h)
        out_s = shape.gemm(tokens, h, q_width / tp)
        # every second matmul of q, k, v, out: k and out
        return _Gemms(s=qkv_s + out_s, flops=2 * tokens * h * (2 * q_width + kv_width) / tp,
                      alternate_s=shape.gemm(tokens, kv_width / 2 / tp, h) + out_s,
                      alternate_flops=2 * tokens * h * (kv_width / 2 + q_width) / tp, qkv_s=qkv_s)
    gemm_s = shape.gemm(tokens, attention_params(model) / (h * tp), h)
    gemm_flops = 2 * tokens * attention_params(model) / tp
    # MLA: the down/up projections before attention and its alternate matmuls, a judged share (catalog)
    share = shape.judged.mla_alternate_matmul_share
    return _Gemms(s=gemm_s, flops=gemm_flops, alternate_s=gemm_s * share, alternate_flops=gemm_flops * share,
                  qkv_s=gemm_s * share)


def _moe_mlp(shape: _LayerShape, moe: MoESpec, before: _Gemms) -> _Gemms:
    """Routed experts (split f over etp ranks; each rank computes the tokens it routes, balanced: tokens × top_k),
    the shared experts and the router, added to the attention block's GEMMs."""
    model, layout, tokens, tp, h = shape.model, shape.layout, shape.tokens, shape.layout.tp, shape.model.hidden
    up_matrices = 2 if model.gated_mlp else 1
    f = moe.expert_ffn_hidden
    etp, _ = expert_parallel_degrees(layout)
    tokens_per_expert = expert_routed_tokens(layout, tokens) * moe.top_k * layout.ep / moe.experts
    local_experts = moe.experts / layout.ep
    gemm_s = before.s
    gemm_s += shape.gemm(tokens_per_expert, up_matrices * f / etp, h, count=local_experts)
    gemm_s += shape.gemm(tokens_per_expert, h, f / etp, count=local_experts)
    gemm_flops = before.flops + 2 * tokens * moe.top_k * (up_matrices + 1) * h * f / tp
    up_s = 0.0
    if moe.shared_experts:
        fs = f * moe.shared_experts
        up_s = shape.gemm(tokens, up_matrices * fs / tp, h)
        gemm_s += up_s
        gemm_s += shape.gemm(tokens, h, fs / tp)
        gemm_flops += 2 * tokens * (up_matrices + 1) * h * fs / tp
    router_flops = 2 * tokens * h * moe.experts
    gemm_s += router_flops / (shape.attn_peak * shape.calibration.gemm_fraction_16bit
                              * shape.judged.router_gemm_fraction)
    gemm_flops += router_flops
    # The experts' and router's matmuls alternate too; which land on the even counts depends on the
    # implementation: a judged share of their time (catalog).
    share = shape.judged.moe_alternate_matmul_share
    return _Gemms(s=gemm_s, flops=gemm_flops, alternate_s=before.alternate_s + (gemm_s - before.s) * share,
                  alternate_flops=before.alternate_flops + (gemm_flops - before.flops) * share, qkv_s=before.qkv_s,
                  up_s=up_s, ffn_width=moe.top_k * f + moe.shared_experts * f)


def _dense_mlp(shape: _LayerShape, before: _Gemms) -> _Gemms:
    """The dense MLP (gated: up and gate, then down), added to the attention block's GEMMs."""
    model, tokens, tp, h = shape.model, shape.tokens, shape.layout.tp, shape.model.hidden
    up_matrices = 2 if model.gated_mlp else 1
    f = model.ffn_hidden or 0
    up_s = shape.gemm(tokens, up_matrices * f / tp, h)
    down_s = shape.gemm(tokens, h, f / tp)
    matrix_flops = 2 * tokens * h * f / tp  # one h x f/tp matrix: the down projection, or the gate
    # counting on from out-proj (4th): gated up (5), gate (6), down (7) -> gate; plain up (5), down (6) -> down
    alternate = shape.gemm(tokens, f / tp, h) if model.gated_mlp else down_s
    return _Gemms(s=before.s + (up_s + down_s), flops=before.flops + 2 * tokens * (up_matrices + 1) * h * f / tp,
                  alternate_s=before.alternate_s + alternate, alternate_flops=before.alternate_flops + matrix_flops,
                  qkv_s=before.qkv_s, up_s=up_s, ffn_width=f, down_s=down_s, down_flops=matrix_flops)


def _attention_core(shape: _LayerShape, hbm_bytes_per_s: float) -> _AttentionCore:
    """Fused attention: this rank's queries against the (causal) keys (CP splits queries and keys), at the
    calibrated kernel's fraction; materialized attention: s×s scores through HBM."""
    calibration, model, layout = shape.calibration, shape.model, shape.layout
    flops = shape.tokens * attention_score_flops_per_token(model, shape.seq_len, causal=True) / layout.tp
    if calibration.attention_kernel == "materialized":
        fwd_s, bwd_s = _materialized_attention_s(model, layout, calibration, shape.attn_peak, hbm_bytes_per_s,
                                                 seq_len=shape.seq_len)
        return _AttentionCore(fwd_s, bwd_s, flops)
    fraction = calibration.attention_fraction
    if calibration.attention_kernel == "flash-v1":
        fraction *= FLASH_V1_RELATIVE_SPEED
    elif calibration.attention_kernel == "cudnn" and calibration.cudnn_attention_fraction is not None:
        fraction = calibration.cudnn_attention_fraction
    fwd_s = flops / (shape.attn_peak * fraction * calibration.in_training_fraction)
    return _AttentionCore(fwd_s, ATTENTION_BACKWARD_RATIO * fwd_s, flops)


def _elementwise_elements(shape: _LayerShape, ffn_width: float, moe: bool, fused_elementwise: bool) -> float:
    """bf16 elements the memory-bound kernels move in the forward pass: norms/residuals (sharded by tp only under
    sequence parallel), the MLP activation, MoE permutes, eager PyTorch's extra passes and fp8 input casts."""
    model, layout, tokens, tp, h = shape.model, shape.layout, shape.tokens, shape.layout.tp, shape.model.hidden
    hidden_share = h / tp if layout.sequence_parallel else h
    ffn_passes = ELEMENTWISE_FFN_PASSES_GATED if model.gated_mlp else ELEMENTWISE_FFN_PASSES_PLAIN
    elements = tokens * (shape.judged.elementwise_hidden_passes * hidden_share + ffn_passes * ffn_width / tp)
    if moe and model.moe is not None:
        elements += expert_routed_tokens(layout, tokens) * (MOE_PERMUTE_PASSES_PER_COPY * model.moe.top_k + 1) * h
    if not fused_elementwise:
        elements += tokens * _eager_extra_elements_per_token(model, hidden_share, ffn_width / tp, tp)
    if shape.precision in ("fp8", "fp4"):
        elements += tokens * FP8_CAST_ELEMENT_EQUIVALENTS * _gemm_inputs_per_token(shape, ffn_width, moe)
    return elements


def _gemm_inputs_per_token(shape: _LayerShape, ffn_width: float, moe: bool) -> float:
    """Input elements per token of the GEMMs an fp8 recipe casts: QKV, out-proj, MLP up, MLP down. Routed experts
    take each of a token's top_k copies (plus the shared experts' one) at their own width f/etp."""
    model, layout, tokens, tp, h = shape.model, shape.layout, shape.tokens, shape.layout.tp, shape.model.hidden
    q_width = model.heads * model.head_dim_
    mlp_up_inputs: float = h
    mlp_down_inputs = ffn_width / tp
    if moe and model.moe is not None:
        routed_copies = expert_routed_tokens(layout, tokens) / tokens * model.moe.top_k
        mlp_up_inputs = (routed_copies + (1 if model.moe.shared_experts else 0)) * h
        mlp_down_inputs = (routed_copies * model.moe.expert_ffn_hidden / expert_parallel_degrees(layout)[0]
                           + model.moe.shared_experts * model.moe.expert_ffn_hidden / tp)
    return h + q_width / tp + mlp_up_inputs + mlp_down_inputs


def _materialized_attention_s(model: ModelSpec, layout: Layout, calibration: CalibrationProfile, peak: float,
                              hbm_bytes_per_s: float, *, seq_len: int) -> tuple[float, float]:
    """(forward, backward) seconds of unfused attention: two batched GEMMs over the full s×s score
    matrix (no causal skipping) and the memory-bound softmax/dropout passes over it."""
    heads = model.heads / layout.tp
    queries = seq_len / layout.cp
    head_dim = model.head_dim_
    batch = layout.micro_batch * heads
    scores_gemm_s = gemm_time_s(queries, seq_len, head_dim, peak, calibration, "bf16", count=batch)
    values_gemm_s = gemm_time_s(queries, head_dim, seq_len, peak, calibration, "bf16", count=batch)
    elements = batch * queries * seq_len
    bandwidth = hbm_bytes_per_s * calibration.hbm_fraction
    forward = scores_gemm_s + values_gemm_s + elements * MATERIALIZED_SCORE_BYTES_FWD / bandwidth
    backward = 2 * (scores_gemm_s + values_gemm_s) + elements * MATERIALIZED_SCORE_BYTES_BWD / bandwidth
    return forward, backward


#: HBM bytes Megatron's (unfused) vocab-parallel cross-entropy moves per logit, forward and backward, from its op
#: sequence (tensor_parallel/cross_entropy.py): upcast to fp32 (read 2, write 4), max (4), subtract in place (8),
#: exp in place (8), row sum (4), divide in place (8); backward scale in place (8) and the cast back to bf16 (6).
#: Megatron-Core's default (cross_entropy_loss_fusion=False). Its fused version (NeMo, Megatron-Bridge) folds the
#: max into the upcast and the subtract into the exp: 40; PyTorch's cross_entropy on upcast logits (torchtitan)
#: moves about the same.
CROSS_ENTROPY_BYTES_PER_LOGIT = 52.0


def logits_compute_s(model: ModelSpec, layout: Layout, gpu: GPUSpec, calibration: CalibrationProfile,
                     *, seq_len: int, precision: Precision,
                     loss_bytes_per_logit: float = CROSS_ENTROPY_BYTES_PER_LOGIT) -> tuple[float, float]:
    """(forward+backward seconds, forward FLOPs) of the output head and the fp32 cross-entropy."""
    tokens = layout.micro_batch * seq_len / layout.cp
    vocab_share = model.vocab / layout.tp
    # The output head usually stays in bf16 even in fp8 recipes.
    head_precision: Precision = "bf16" if precision in ("fp8", "fp4") else precision
    peak = gpu.peak_flops(head_precision)
    fwd_s = gemm_time_s(tokens, vocab_share, model.hidden, peak, calibration, head_precision)
    loss_s = tokens * vocab_share * loss_bytes_per_logit / (gpu.hbm_bytes_per_s * calibration.hbm_fraction)
    return 3 * fwd_s + loss_s, 2 * tokens * vocab_share * model.hidden
