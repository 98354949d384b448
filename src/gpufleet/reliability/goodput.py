"""Goodput under exponential failures with periodic checkpoints and restarts (Daly 2006, eq. 13).

A job needs T_s seconds of compute. It checkpoints after every tau seconds of compute (each checkpoint
blocks for delta seconds); failures arrive as a Poisson process with mean M; after a failure it spends R
seconds restarting (and can fail again while restarting), then redoes the work since the last checkpoint.
Expected wall time:

    T_wall = M * exp(R / M) * (exp((tau + delta) / M) - 1) * T_s / tau

so goodput = T_s / T_wall = tau / (M * exp(R/M) * expm1((tau + delta)/M)). For tau, delta, R << M this is
1 - delta/tau - tau/(2M) - R/M + ..., the familiar first-order budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from gpufleet.errors import InfeasibleError, InputError

_MIN_GOODPUT = 1e-9


def goodput(*, interval_s: float, write_s: float, restart_s: float, mtti_s: float) -> float:
    """Useful fraction of wall time, in (0, 1]. Raises InfeasibleError when the job cannot progress."""
    if not interval_s > 0:
        raise InputError(f"checkpoint interval must be positive, got {interval_s!r} s")
    if write_s < 0 or restart_s < 0:
        raise InputError("checkpoint write time and restart time must not be negative")
    if not mtti_s > 0:
        raise InputError(f"mean time to interruption must be positive, got {mtti_s!r} s")
    value = math.exp(min(_log_goodput(math.log(interval_s), write_s, restart_s, mtti_s), 0.0))
    if value < _MIN_GOODPUT:
        raise InfeasibleError(
            f"the job cannot make progress: mean time to interruption {mtti_s / 60:.3g} min is too short "
            f"for a {write_s / 60:.3g} min checkpoint and a {restart_s / 60:.3g} min restart"
        )
    return value


def progress_interval_range_s(*, write_s: float, restart_s: float, mtti_s: float) -> tuple[float, float] | None:
    """The checkpoint intervals (s) at which the job makes progress (goodput at least `_MIN_GOODPUT`, as
    `goodput` requires): a shortest and a longest around Daly's optimum. None when even the optimum does not."""
    from gpufleet.reliability.checkpoint_interval import daly_interval_s

    if not (write_s > 0 and restart_s >= 0 and mtti_s > 0):
        raise InputError("checkpoint write time and mean time to interruption must be positive, restart time "
                         "not negative")
    floor = math.log(_MIN_GOODPUT)

    def progresses(log_interval: float) -> bool:
        return _log_goodput(log_interval, write_s, restart_s, mtti_s) >= floor

    best = math.log(daly_interval_s(write_s, mtti_s))
    if not progresses(best):
        return None
    # goodput rises up to the optimum and falls after it: bisect log(interval) on each side
    shortest = _edge(progresses, inside=best, outside=best - 700.0)
    longest = _edge(progresses, inside=best, outside=math.log(max(mtti_s, math.exp(best)) * 1e3))
    return math.exp(shortest), math.exp(longest)


def _edge(progresses: Callable[[float], bool], *, inside: float, outside: float) -> float:
    """The boundary between `inside` (progress) and `outside` (none), to within a relative 1e-9."""
    if progresses(outside):
        return outside
    for _ in range(200):
        middle = (inside + outside) / 2
        if progresses(middle):
            inside = middle
        else:
            outside = middle
        if abs(outside - inside) < 1e-9:
            break
    return inside


def wall_time_s(train_time_s: float, goodput_fraction: float) -> float:
    """Time to train including failures, checkpoints and restarts."""
    if not train_time_s > 0:
        raise InputError(f"training time must be positive, got {train_time_s!r} s")
    if not 0 < goodput_fraction <= 1:
        raise InputError(f"goodput must be in (0, 1], got {goodput_fraction!r}")
    return train_time_s / goodput_fraction


def _log_goodput(log_interval: float, write_s: float, restart_s: float, mtti_s: float) -> float:
    """log(goodput) for an interval of exp(`log_interval`) seconds (in logs, so that no term overflows)."""
    exponent = (math.exp(log_interval) + write_s) / mtti_s
    return log_interval - math.log(mtti_s) - restart_s / mtti_s - _log_expm1(exponent)


def _log_expm1(x: float) -> float:
    """log(exp(x) - 1) without overflow."""
    if x > 30.0:
        return x + math.log1p(-math.exp(-x))
    return math.log(math.expm1(x))
