"""Synthetic, learnable token batches that are a pure function of (seed, step, rank): the data position a
checkpoint must keep is just the next step.

Each sequence follows a fixed random successor table (token t is followed by succ[t]) with a share of random
tokens mixed in, so the loss falls from ln(vocab) towards the noise floor: a burn-in that learns nothing would hide
a broken gradient path.
"""

from __future__ import annotations

import torch

#: Share of positions replaced by a uniformly random token (judgement: enough noise that the loss does not reach 0).
NOISE_SHARE = 0.1


def _generator(seed: int, *parts: int) -> torch.Generator:
    value = seed
    for part in parts:
        value = (value * 1_000_003 + part) % (2**61 - 1)
    return torch.Generator().manual_seed(value)


def successor_table(vocab: int, seed: int) -> torch.Tensor:
    return torch.randperm(vocab, generator=_generator(seed, 0))


def batch(seed: int, step: int, rank: int, micro_batch: int, seq_len: int, vocab: int,
          table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each micro_batch x seq_len int64 on the CPU."""
    gen = _generator(seed, 1, step, rank)
    tokens = torch.empty(micro_batch, seq_len + 1, dtype=torch.int64)
    tokens[:, 0] = torch.randint(vocab, (micro_batch,), generator=gen)
    noise = torch.rand(micro_batch, seq_len + 1, generator=gen) < NOISE_SHARE
    random_tokens = torch.randint(vocab, (micro_batch, seq_len + 1), generator=gen)
    for position in range(1, seq_len + 1):
        following = table[tokens[:, position - 1]]
        tokens[:, position] = torch.where(noise[:, position], random_tokens[:, position], following)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
