"""`gpufleet doctor --cluster`: every rank's report and bench figures gathered to rank 0, outliers named.

A lopsided cluster is as slow as its worst member: a figure (GEMM FLOP/s, memory bandwidth, disk throughput, RDMA
rate, NVLink links up, ...) far below the median of the same figure over every rank marks that rank's node. The
comparison is pure (`find_outliers`); the gathering uses torch.distributed's `all_gather_object`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.runtime.doctor.checks import NodeReport

#: A figure below this fraction of the median over every rank is an outlier. Judgement: healthy nodes of one type
#: land within ~10 % of each other on GEMM, memory and link benchmarks; a throttled GPU, a link trained at half
#: rate or a degraded disk sits at or below half. 0.8 flags the second without tripping on the first.
OUTLIER_FRACTION = 0.8


@dataclass(frozen=True, slots=True)
class RankReport:
    """What one rank sends to rank 0."""

    rank: int
    host: str
    report: NodeReport
    bench: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.host}/rank{self.rank}"

    def figures(self) -> dict[str, float]:
        return {**self.report.figures(), **{f"bench.{name}": value for name, value in self.bench.items()}}


@dataclass(frozen=True, slots=True)
class Outlier:
    label: str
    figure: str
    value: float
    median: float

    @property
    def fraction(self) -> float:
        return self.value / self.median if self.median else 0.0


def find_outliers(reports: Sequence[RankReport], fraction: float = OUTLIER_FRACTION) -> list[Outlier]:
    """Every (rank, figure) below `fraction` × the figure's median over the ranks that report it (higher is better
    for every figure the checks and benches give)."""
    by_figure: dict[str, list[tuple[str, float]]] = {}
    for report in reports:
        for name, value in report.figures().items():
            by_figure.setdefault(name, []).append((report.label, value))
    outliers = []
    for name, values in sorted(by_figure.items()):
        if len(values) < 2:
            continue
        median = statistics.median(value for _, value in values)
        outliers += [Outlier(label, name, value, median) for label, value in values
                     if median > 0 and value < fraction * median]
    return outliers


def gather_reports(dist: Any, mine: RankReport) -> list[RankReport] | None:
    """Every rank's report on rank 0 (None elsewhere)."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return [report for report in gathered if report is not None] if dist.get_rank() == 0 else None


def quick_bench() -> dict[str, float]:
    """Small GEMM and memory figures of this rank's device, fast enough to run before every job (judgement: a 4096³
    bf16 GEMM on a GPU, 512³ fp32 on a CPU; a 256 MiB / 64 MiB copy)."""
    import torch

    from gpufleet.runtime.bench.gemm import bench_gemm
    from gpufleet.runtime.bench.memory import bench_memory
    from gpufleet.runtime.bench.shapes import GemmShape

    on_gpu = torch.cuda.is_available()
    side = 4096 if on_gpu else 512
    [gemm] = bench_gemm([GemmShape("square", side, side, side)], ["bf16" if on_gpu else "fp32"], iters=5, warmup=2)
    memory = bench_memory((256 if on_gpu else 64) * 2**20, iters=5)
    return {"gemm_flops_per_s": gemm.flops_per_s, "memory_bytes_per_s": memory.bytes_per_s}
