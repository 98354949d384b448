"""Training FLOPs per token, by part — and gpufleet's MFU convention.

Convention (documented once, used everywhere): model FLOPs per token = 3 × forward FLOPs, where
forward = 2 × (active GEMM parameters, output head included, input embedding excluded)
        + attention scores and values: 4 × seq × (heads × qk-head-dim … ) per layer, halved for
          causal masking (only the lower triangle is computed by flash attention).
Recompute is not model FLOPs: it counts in HFU (hardware FLOPs) only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from gpufleet.catalog.records import ModelSpec
from gpufleet.workload.params import attention_params, layer_params, mlp_params


@dataclass(frozen=True, slots=True)
class FlopsPerToken:
    """Forward FLOPs per token by part (multiply by 3 for forward + backward)."""

    dense_gemm: float  # attention projections, dense MLPs, active experts, routers
    attention: float  # QK^T and softmax·V
    logits: float  # output projection

    @property
    def forward(self) -> float:
        return self.dense_gemm + self.attention + self.logits

    @property
    def training(self) -> float:
        """Model FLOPs per token (forward + backward = 3 × forward)."""
        return 3 * self.forward


def attention_score_flops_per_token(model: ModelSpec, seq_len: int, causal: bool = True) -> float:
    """Forward FLOPs of QK^T and AV for one token in one layer."""
    if model.mla is not None:
        qk_dim = model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim
        v_dim = model.mla.v_head_dim
    else:
        qk_dim = v_dim = model.head_dim_
    full = 2 * seq_len * model.heads * (qk_dim + v_dim)
    return full / 2 if causal else full


def active_layer_gemm_params(model: ModelSpec, layer_index: int) -> float:
    """GEMM parameters one token multiplies through in one layer (top-k experts only)."""
    layer = layer_params(model, layer_index)
    if model.moe is None or layer.routed_experts == 0:
        return attention_params(model) + layer.dense_mlp
    routed = model.moe.top_k * mlp_params(model, model.moe.expert_ffn_hidden)
    return attention_params(model) + routed + layer.shared_experts + layer.router


@lru_cache(maxsize=256)
def flops_per_token(model: ModelSpec, seq_len: int, causal: bool = True) -> FlopsPerToken:
    """Forward FLOPs per token of the whole model."""
    moe_layers = 0 if model.moe is None else model.layers - model.moe.dense_layers
    dense_layers = model.layers - moe_layers
    gemm_params = dense_layers * active_layer_gemm_params(model, 0)
    if moe_layers:
        gemm_params += moe_layers * active_layer_gemm_params(model, model.layers - 1)
    attention = model.layers * attention_score_flops_per_token(model, seq_len, causal)
    return FlopsPerToken(
        dense_gemm=2 * gemm_params,
        attention=attention,
        logits=2 * model.vocab * model.hidden,
    )
