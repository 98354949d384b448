"""Parameter counts of a ModelSpec, by part, total and active (per token)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.catalog.records import ModelSpec


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one transformer layer, split by what shards how."""

    attention: int
    norms: int
    dense_mlp: int
    routed_experts: int  # all routed experts of the layer
    routed_expert_one: int  # one routed expert
    shared_experts: int
    router: int

    @property
    def total(self) -> int:
        return (self.attention + self.norms + self.dense_mlp + self.routed_experts + self.shared_experts
                + self.router)


def _norm_params(model: ModelSpec, width: int) -> int:
    return 2 * width if model.norm == "layernorm" else width


def attention_params(model: ModelSpec) -> int:
    """q, k, v, o projections (MHA/GQA/MQA) or MLA's low-rank projections, with biases and qk-norms."""
    h = model.hidden
    if model.mla is not None:
        mla = model.mla
        qk_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        q = h * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * model.heads * qk_head
        kv_down = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank
        kv_up = mla.kv_lora_rank * model.heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        out = model.heads * mla.v_head_dim * h
        return q + kv_down + kv_up + out
    d = model.head_dim_
    q_width = model.heads * d
    kv_width = model.kv_heads * d
    weights = h * (q_width + 2 * kv_width) + q_width * h
    biases = 0
    if model.linear_bias:
        biases = q_width + 2 * kv_width + h
    elif model.qkv_bias:
        biases = q_width + 2 * kv_width
    qk_norm = 2 * d if model.qk_norm else 0
    return weights + biases + qk_norm


def mlp_params(model: ModelSpec, ffn_hidden: int) -> int:
    """One MLP of a given width: gated (three matrices) or plain (two), biases if the model has them."""
    h = model.hidden
    matrices = 3 if model.gated_mlp else 2
    biases = (ffn_hidden + h) if model.linear_bias else 0
    return matrices * h * ffn_hidden + biases


def layer_params(model: ModelSpec, layer_index: int) -> LayerParams:
    """Parameters of layer `layer_index` (MoE models have leading dense layers)."""
    attention = attention_params(model)
    norms = 2 * _norm_params(model, model.hidden)
    moe = model.moe
    if moe is None or layer_index < moe.dense_layers:
        return LayerParams(attention, norms, mlp_params(model, model.ffn_hidden or 0), 0, 0, 0, 0)
    one_expert = mlp_params(model, moe.expert_ffn_hidden)
    return LayerParams(
        attention=attention,
        norms=norms,
        dense_mlp=0,
        routed_experts=moe.experts * one_expert,
        routed_expert_one=one_expert,
        shared_experts=moe.shared_experts * one_expert,
        router=model.hidden * moe.experts,
    )


def embedding_params(model: ModelSpec) -> int:
    """Input embedding table plus a learned position table (GPT-2/3)."""
    return model.vocab * model.hidden + model.learned_positions * model.hidden


def output_params(model: ModelSpec) -> int:
    """Final norm plus the output projection (zero extra when tied to the input embedding)."""
    head = 0 if model.tied_embeddings else model.vocab * model.hidden
    return _norm_params(model, model.hidden) + head


@dataclass(frozen=True)
class ParamCount:
    """Whole-model parameter counts."""

    total: int
    active: int  # per token: shared + top_k routed experts, everything else
    embedding: int
    output: int
    per_layer_total: tuple[int, ...]

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding


def count_params(model: ModelSpec) -> ParamCount:
    """Total and active parameters; active counts only the top_k routed experts a token visits."""
    layers = [layer_params(model, i) for i in range(model.layers)]
    total_layers = sum(layer.total for layer in layers)
    inactive = 0
    if model.moe is not None:
        inactive = sum(
            layer.routed_experts - model.moe.top_k * layer.routed_expert_one for layer in layers
        )
    embedding = embedding_params(model)
    output = output_params(model)
    total = total_layers + embedding + output
    return ParamCount(
        total=total,
        active=total - inactive,
        embedding=embedding,
        output=output,
        per_layer_total=tuple(layer.total for layer in layers),
    )
