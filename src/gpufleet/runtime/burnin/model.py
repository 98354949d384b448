"""A small decoder-only GPT in plain PyTorch (pre-norm blocks, causal SDPA attention, GELU MLP, tied embeddings)
and the deterministic synthetic batches it trains on."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    vocab: int = 512
    seq_len: int = 64
    micro_batch: int = 4

    @property
    def ffn(self) -> int:
        return 4 * self.hidden


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.norm1 = nn.LayerNorm(config.hidden)
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden, bias=False)
        self.proj = nn.Linear(config.hidden, config.hidden, bias=False)
        self.norm2 = nn.LayerNorm(config.hidden)
        self.up = nn.Linear(config.hidden, config.ffn, bias=False)
        self.down = nn.Linear(config.ffn, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(hidden, dim=-1)
        shape = (batch, seq, self.heads, hidden // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(x.shape)
        x = x + self.proj(attention)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(config.vocab, config.hidden)
        self.position = nn.Embedding(config.seq_len, config.hidden)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.hidden)
        for table in (self.embed, self.position):  # GPT-2's 0.02: logits start near uniform (loss ≈ ln vocab)
            nn.init.normal_(table.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embed.weight.t()  # tied output projection


def batch(config: GPTConfig, seed: int, step: int, rank: int, device: torch.device) -> torch.Tensor:
    """Rank `rank`'s tokens for `step`: a pure function of (seed, step, rank), so a resumed run sees exactly the
    batches the uninterrupted one saw. A repeating pattern plus noise: a loss that falls, so a broken step shows."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    base = torch.randint(0, config.vocab, (config.micro_batch, 8), generator=generator)
    tokens = base.repeat(1, config.seq_len // 8 + 1)[:, : config.seq_len + 1]
    return tokens.to(device)


def loss_of(model: nn.Module, tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
