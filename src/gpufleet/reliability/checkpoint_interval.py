"""Checkpoint size, write time and the optimal interval between checkpoints.

Young (1974): tau = sqrt(2 * delta * M), first order in delta/M.
Daly (2006), "A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS 22:
tau = sqrt(2 delta M) * (1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9) - delta   for delta < 2M, else M.
tau is compute time between checkpoints; delta the time a checkpoint blocks training; M the job's MTTI.
"""

from __future__ import annotations

import math

from gpufleet.errors import InputError


def checkpoint_bytes(
    params: float, *, weight_bytes_per_param: float, optimizer_bytes_per_param: float
) -> float:
    """Bytes of one full checkpoint: model weights plus optimizer state."""
    if params <= 0:
        raise InputError(f"parameter count must be positive, got {params!r}")
    if weight_bytes_per_param <= 0 or optimizer_bytes_per_param < 0:
        raise InputError("bytes per parameter must be positive (weights) and non-negative (optimizer)")
    return params * (weight_bytes_per_param + optimizer_bytes_per_param)


def write_bandwidth_bytes_per_s(nodes: int, *, per_node_bytes_per_s: float, max_bytes_per_s: float) -> float:
    """Aggregate checkpoint write bandwidth: every node writes its shard, up to the storage system's cap."""
    if nodes < 1:
        raise InputError(f"need at least one node, got {nodes}")
    if per_node_bytes_per_s <= 0 or max_bytes_per_s <= 0:
        raise InputError("checkpoint write bandwidth must be positive")
    return min(nodes * per_node_bytes_per_s, max_bytes_per_s)


def write_time_s(size_bytes: float, bandwidth_bytes_per_s: float) -> float:
    if size_bytes < 0:
        raise InputError(f"checkpoint size must not be negative, got {size_bytes!r}")
    if bandwidth_bytes_per_s <= 0:
        raise InputError(f"write bandwidth must be positive, got {bandwidth_bytes_per_s!r}")
    return size_bytes / bandwidth_bytes_per_s


def young_interval_s(write_s: float, mtti_s: float) -> float:
    """Young's first-order optimum sqrt(2 * delta * M)."""
    _check_positive(write_s, mtti_s)
    return math.sqrt(2.0 * write_s * mtti_s)


def daly_interval_s(write_s: float, mtti_s: float) -> float:
    """Daly's higher-order optimum; tends to Young's as delta/M -> 0, equals M once delta >= 2M."""
    _check_positive(write_s, mtti_s)
    if write_s >= 2.0 * mtti_s:
        return mtti_s
    ratio = write_s / (2.0 * mtti_s)
    return math.sqrt(2.0 * write_s * mtti_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - write_s


def _check_positive(write_s: float, mtti_s: float) -> None:
    if not write_s > 0:
        raise InputError(f"checkpoint write time must be positive, got {write_s!r} s")
    if not mtti_s > 0:
        raise InputError(f"mean time to interruption must be positive, got {mtti_s!r} s")
