"""Straggler scoring: each rank's median step (or compute) time against the median over all ranks.

A rank's score is `median over ranks / its own median`: 1.0 is a typical rank, 0.5 a rank twice as slow. A rank
scoring below the threshold is a straggler. The default threshold, 0.75, is the default of NVIDIA's resiliency
extension (source: nvidia-resiliency-ext, `straggler.reporting.Report.identify_stragglers`, gpu_rel_threshold =
section_rel_threshold = 0.75). NVRx scores against the *fastest* rank; we score against the median, so one rank
that is lucky (or idle) cannot make every other rank look slow (judgement; documented in docs/monitoring.md).

The exchange is one `all_gather` of a few floats per rank over the job's process group (torch is imported when it
runs, never at import).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.errors import InputError

#: source: nvidia-resiliency-ext Report.identify_stragglers default (gpu_rel_threshold=0.75).
DEFAULT_THRESHOLD = 0.75
#: What each rank contributes to the exchange: median time, GPU slowed-down flag, SM clock / base clock.
STATS_FIELDS = 3


@dataclass(frozen=True)
class RankStats:
    """One rank's numbers for one exchange."""

    rank: int
    median_s: float
    gpu_slowed: bool = False
    sm_clock_ratio: float | None = None  # current SM clock / base clock, None when unknown


@dataclass(frozen=True)
class StragglerReport:
    """Scores of every rank at one exchange; `stragglers` lists the ranks below the threshold, slowest first."""

    scores: tuple[float, ...]
    stragglers: tuple[int, ...]
    median_s: float
    threshold: float
    stats: tuple[RankStats, ...]


def check_threshold(threshold: float) -> float:
    if not 0 < threshold < 1:
        raise InputError(f"the straggler threshold must be between 0 and 1 (exclusive), got {threshold}")
    return threshold


def score_ranks(stats: Sequence[RankStats], threshold: float = DEFAULT_THRESHOLD) -> StragglerReport:
    """Score every rank; a rank with no timing yet (median <= 0 or NaN) scores 1.0 (nothing to say)."""
    check_threshold(threshold)
    ordered = sorted(stats, key=lambda s: s.rank)
    timed = [s.median_s for s in ordered if s.median_s > 0]
    middle = statistics.median(timed) if timed else 0.0
    scores = tuple(middle / s.median_s if s.median_s > 0 and middle > 0 else 1.0 for s in ordered)
    slow = sorted((score, s.rank) for score, s in zip(scores, ordered, strict=True) if score < threshold)
    return StragglerReport(scores, tuple(rank for _, rank in slow), middle, threshold, tuple(ordered))


def exchange(local: RankStats, group: Any = None) -> list[RankStats]:
    """Every rank's stats, gathered over `group` (the default process group when None): one all_gather."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    mine = torch.tensor([local.median_s, float(local.gpu_slowed),
                         -1.0 if local.sm_clock_ratio is None else local.sm_clock_ratio], dtype=torch.float64)
    if dist.get_backend(group) == "nccl":
        mine = mine.cuda()
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    out = []
    for rank, row in enumerate(gathered):
        median_s, slowed, ratio = (float(x) for x in row.cpu().tolist())
        out.append(RankStats(rank, median_s, slowed > 0.5, None if ratio < 0 else ratio))
    return out


def describe(report: StragglerReport, hosts: Sequence[str]) -> list[str]:
    """One log line per straggler: rank, host, how much slower, and what its GPU reports."""
    lines = []
    for rank in report.stragglers:
        score = report.scores[rank]
        stats = report.stats[rank]
        host = hosts[rank] if rank < len(hosts) else "?"
        gpu = ""
        if stats.gpu_slowed:
            gpu = "; its GPU reports thermal or power throttling"
        elif stats.sm_clock_ratio is not None and stats.sm_clock_ratio < 1:
            gpu = f"; its GPU's SM clock is {stats.sm_clock_ratio:.2f} of base"
        lines.append(f"straggler: rank {rank} on {host}: {stats.median_s:.4f} s vs median {report.median_s:.4f} s "
                     f"({1 / score:.2f}x, score {score:.2f} < {report.threshold}){gpu}")
    return lines
