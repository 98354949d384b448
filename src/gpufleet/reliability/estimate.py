"""One job's reliability: interruptions, checkpoint interval, goodput, wall time and lost GPU-hours."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.errors import InputError
from gpufleet.reliability.checkpoint_interval import daly_interval_s, write_time_s, young_interval_s
from gpufleet.reliability.failures import FailureModel
from gpufleet.reliability.goodput import goodput, wall_time_s


@dataclass(frozen=True)
class ReliabilityEstimate:
    gpus: int
    failure_source: str
    interruptions_per_day: float
    mtti_s: float
    checkpoint_bytes: float
    write_bytes_per_s: float
    checkpoint_write_s: float
    restart_s: float
    young_interval_s: float
    checkpoint_interval_s: float
    goodput: float
    train_time_s: float | None
    wall_time_s: float | None
    interruptions_expected: float | None
    lost_gpu_hours: float | None


def estimate_reliability(
    failures: FailureModel,
    *,
    gpus: int,
    checkpoint_bytes: float,
    write_bytes_per_s: float,
    restart_s: float,
    train_time_s: float | None = None,
    interval_s: float | None = None,
) -> ReliabilityEstimate:
    """Everything the reliability model says about one job; `interval_s` overrides Daly's optimum."""
    if checkpoint_bytes <= 0:
        raise InputError(f"checkpoint size must be positive, got {checkpoint_bytes!r} bytes")
    mtti = failures.mtti_s(gpus)
    write_s = write_time_s(checkpoint_bytes, write_bytes_per_s)
    chosen = daly_interval_s(write_s, mtti) if interval_s is None else interval_s
    fraction = goodput(interval_s=chosen, write_s=write_s, restart_s=restart_s, mtti_s=mtti)
    wall = wall_time_s(train_time_s, fraction) if train_time_s is not None else None
    lost = None if wall is None or train_time_s is None else gpus * (wall - train_time_s) / 3600.0
    return ReliabilityEstimate(
        gpus=gpus,
        failure_source=failures.source_id,
        interruptions_per_day=failures.interruptions_per_day(gpus),
        mtti_s=mtti,
        checkpoint_bytes=checkpoint_bytes,
        write_bytes_per_s=write_bytes_per_s,
        checkpoint_write_s=write_s,
        restart_s=restart_s,
        young_interval_s=young_interval_s(write_s, mtti),
        checkpoint_interval_s=chosen,
        goodput=fraction,
        train_time_s=train_time_s,
        wall_time_s=wall,
        interruptions_expected=None if wall is None else wall / mtti,
        lost_gpu_hours=lost,
    )
