"""Interruption rates: a job of N GPUs sees N times the per-GPU rate (independent failures, Poisson).

The per-GPU rate comes from a published run (Llama 3: 419 unexpected interruptions in 54 days on 16,384
H100s). Meta's RSC study (Kokolis et al., HPCA 2025) finds job MTTF falling roughly inversely with GPU
count, which is what a constant per-GPU rate predicts.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.catalog.economics_records import FailureStats
from gpufleet.errors import InputError

SECONDS_PER_DAY = 86400.0


@dataclass(frozen=True)
class FailureModel:
    """A constant per-GPU interruption rate (1/s), and where it came from."""

    interruptions_per_gpu_s: float
    source_id: str

    def __post_init__(self) -> None:
        if not self.interruptions_per_gpu_s > 0:
            raise InputError(f"interruption rate must be positive, got {self.interruptions_per_gpu_s!r}")

    @classmethod
    def from_stats(cls, stats: FailureStats) -> FailureModel:
        if stats.unexpected_interruptions == 0:
            raise InputError(f"failure_stats {stats.id!r} has no interruptions; cannot derive a rate")
        return cls(stats.interruptions_per_gpu_s, stats.id)

    def interruptions_per_s(self, gpus: int) -> float:
        """Expected interruptions per second of wall time for a job spanning `gpus` GPUs."""
        if gpus < 1:
            raise InputError(f"a job needs at least one GPU, got {gpus}")
        return self.interruptions_per_gpu_s * gpus

    def interruptions_per_day(self, gpus: int) -> float:
        return self.interruptions_per_s(gpus) * SECONDS_PER_DAY

    def mtti_s(self, gpus: int) -> float:
        """Mean time to interruption of the whole job."""
        return 1.0 / self.interruptions_per_s(gpus)
