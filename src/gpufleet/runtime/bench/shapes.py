"""The GEMMs one transformer layer (and the output projection) runs, at a model's own shapes. Pure: no torch.

For `tokens` tokens per micro-batch on one GPU with tensor parallelism `tp` (Megatron's split: column-parallel
QKV and MLP-up, row-parallel attention-out and MLP-down, vocabulary-parallel logits), as M×N×K with M the tokens:
qkv (h → (heads + 2·kv_heads)·head_dim / tp), attn-out (heads·head_dim / tp → h), mlp-up (h → ffn·(2 if gated) /
tp), mlp-down (ffn / tp → h), logits (h → vocab / tp). MoE layers: one expert's up and down GEMMs at the tokens an
expert sees on average (tokens · top_k / experts), with the expert width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufleet.catalog.records import ModelSpec
from gpufleet.errors import InputError


@dataclass(frozen=True, slots=True)
class GemmShape:
    name: str
    m: int
    n: int
    k: int

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


def _split(width: int, tp: int, what: str) -> int:
    if width % tp:
        raise InputError(f"--tp {tp} does not divide the model's {what} ({width})")
    return width // tp


def model_gemm_shapes(model: ModelSpec, tokens: int, tp: int = 1) -> list[GemmShape]:
    """The forward GEMMs of one layer plus the logits, each once (backward runs the same shapes transposed)."""
    h, head_dim = model.hidden, model.head_dim_
    shapes = [
        GemmShape("qkv", tokens, _split((model.heads + 2 * model.kv_heads) * head_dim, tp, "q/k/v width"), h),
        GemmShape("attn-out", tokens, h, _split(model.heads * head_dim, tp, "attention width")),
    ]
    if model.ffn_hidden is not None:
        ffn = _split(model.ffn_hidden, tp, "MLP width")
        shapes += [GemmShape("mlp-up", tokens, ffn * (2 if model.gated_mlp else 1), h),
                   GemmShape("mlp-down", tokens, h, ffn)]
    if model.moe is not None:
        expert = _split(model.moe.expert_ffn_hidden, tp, "expert width")
        routed = max(1, math.ceil(tokens * model.moe.top_k / model.moe.experts))
        shapes += [GemmShape("expert-up", routed, expert * (2 if model.gated_mlp else 1), h),
                   GemmShape("expert-down", routed, h, expert)]
    shapes.append(GemmShape("logits", tokens, math.ceil(model.vocab / tp), h))  # frameworks pad the vocabulary
    return shapes
