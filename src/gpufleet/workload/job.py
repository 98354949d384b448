"""Job: what is trained and how much — model, tokens, sequence length, global batch, precision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpufleet.catalog.records import ModelSpec, Precision
from gpufleet.errors import InputError

Optimizer = Literal["adam", "sgd"]


@dataclass(frozen=True)
class Job:
    """One training run. `precision` is the GEMM precision (fp8 = FP8 GEMMs, bf16 elsewhere)."""

    model: ModelSpec
    tokens: float
    seq_len: int = 4096
    global_batch: int = 1024  # sequences per optimizer step
    precision: Precision = "bf16"
    optimizer: Optimizer = "adam"

    def __post_init__(self) -> None:
        if self.tokens <= 0:
            raise InputError(f"tokens must be positive, got {self.tokens}")
        if self.seq_len < 1:
            raise InputError(f"sequence length must be at least 1, got {self.seq_len}")
        if self.global_batch < 1:
            raise InputError(f"global batch must be at least 1 sequence, got {self.global_batch}")
        if self.precision in ("fp32", "tf32"):
            raise InputError(
                f"precision {self.precision} is not a training precision; use bf16, fp16, fp8 or fp4"
            )

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    @property
    def steps(self) -> float:
        return self.tokens / self.tokens_per_step
