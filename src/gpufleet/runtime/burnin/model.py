"""The burn-in GPT in plain PyTorch and its FSDP2 wrapping.

Each block is its own FSDP2 unit (parameters all-gathered in bf16 before its forward, gradients reduce-scattered in
fp32 after its backward), the embeddings and head belong to the root unit: the layout `Layout(dp=N,
sharding="zero3")` the planner prices.

With `ModelShape.experts` > 0 each block's MLP is `MoEMLP`: its router and experts are parameters of the block's
FSDP2 unit like the attention's, sharded over every rank and all-gathered whole before the block's forward, so every
rank computes every expert on its own tokens: no expert parallelism, no all-to-all (the planner's `ep=1`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpufleet.runtime.burnin.config import ModelShape


class DenseMLP(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.up = nn.Linear(shape.hidden, shape.ffn_hidden, bias=False)
        self.down = nn.Linear(shape.ffn_hidden, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class MoEMLP(nn.Module):
    """Top-k routed experts, each a plain GELU MLP of width ffn_hidden: the router scores every expert, each token
    goes to its `top_k` best, weighted by the softmax over those k scores; dropless (each expert takes every token
    routed to it), no load-balancing loss. The tokens of each expert are gathered, run through it, weighed and added
    back (`index_add_`: deterministic on the CPU)."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.top_k = shape.top_k
        self.router = nn.Linear(shape.hidden, shape.experts, bias=False)
        self.experts = nn.ModuleList(DenseMLP(shape) for _ in range(shape.experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        scores, chosen = self.router(flat).topk(self.top_k, dim=-1)
        weights = F.softmax(scores.float(), dim=-1).to(flat.dtype)
        out = torch.zeros_like(flat)
        for index, expert in enumerate(self.experts):
            token, slot = torch.nonzero(chosen == index, as_tuple=True)
            if token.numel() == 0:
                continue
            out.index_add_(0, token, expert(flat[token]) * weights[token, slot].unsqueeze(-1))
        return out.view_as(x)


class Block(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.heads = shape.heads
        self.norm1 = nn.LayerNorm(shape.hidden, bias=False)
        self.qkv = nn.Linear(shape.hidden, 3 * shape.hidden, bias=False)
        self.out = nn.Linear(shape.hidden, shape.hidden, bias=False)
        self.norm2 = nn.LayerNorm(shape.hidden, bias=False)
        if shape.moe:
            self.moe = MoEMLP(shape)
        else:  # the dense MLP's weights directly on the block (the checkpoints' names)
            self.up = nn.Linear(shape.hidden, shape.ffn_hidden, bias=False)
            self.down = nn.Linear(shape.ffn_hidden, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, hidden // self.heads).unbind(2)
        attended = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, seq, hidden))
        normed = self.norm2(x)
        if hasattr(self, "moe"):
            return x + self.moe(normed)
        return x + self.down(F.gelu(self.up(normed)))


class BurninGPT(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.tokens = nn.Embedding(shape.vocab, shape.hidden)
        self.positions = nn.Embedding(shape.seq_len, shape.hidden)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.norm = nn.LayerNorm(shape.hidden, bias=False)
        self.head = nn.Linear(shape.hidden, shape.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def build_model(shape: ModelShape, mesh: Any, seed: int, device: torch.device) -> nn.Module:
    """The model, initialised identically on every rank from `seed`, then sharded with FSDP2 over `mesh`."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(seed)
    model = BurninGPT(shape).to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model
