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
    exponent = (interval_s + write_s) / mtti_s
    log_denominator = math.log(mtti_s) + restart_s / mtti_s + _log_expm1(exponent)
    log_goodput = math.log(interval_s) - log_denominator
    value = math.exp(min(log_goodput, 0.0))
    if value < _MIN_GOODPUT:
        raise InfeasibleError(
            f"the job cannot make progress: mean time to interruption {mtti_s / 60:.3g} min is too short "
            f"for a {write_s / 60:.3g} min checkpoint and a {restart_s / 60:.3g} min restart"
        )
    return value


def wall_time_s(train_time_s: float, goodput_fraction: float) -> float:
    """Time to train including failures, checkpoints and restarts."""
    if not train_time_s > 0:
        raise InputError(f"training time must be positive, got {train_time_s!r} s")
    if not 0 < goodput_fraction <= 1:
        raise InputError(f"goodput must be in (0, 1], got {goodput_fraction!r}")
    return train_time_s / goodput_fraction


def _log_expm1(x: float) -> float:
    """log(exp(x) - 1) without overflow."""
    if x > 30.0:
        return x + math.log1p(-math.exp(-x))
    return math.log(math.expm1(x))
