"""What `gpufleet reliability` asks, as one typed request, and its answer.

The request owns the rules and defaults the command applies before the catalog is read: the accepted ranges of
the checkpoint size and write bandwidth, which flags exclude each other, the node size that sets the write
bandwidth. `reliability_report` applies the catalog's reliability defaults (the checkpoint bytes per parameter,
the per-node write bandwidth, the restart time, the failure rates) and estimates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import model_validator

from gpufleet.catalog.economics_records import FailureStats, ReliabilityDefaults
from gpufleet.catalog.registry import Catalog
from gpufleet.errors import InputError, UnknownNameError
from gpufleet.reliability.checkpoint_interval import checkpoint_bytes, daly_interval_s, write_bandwidth_bytes_per_s
from gpufleet.reliability.defaults import reliability_defaults
from gpufleet.reliability.estimate import ReliabilityEstimate, estimate_reliability
from gpufleet.reliability.failures import FailureModel
from gpufleet.reliability.goodput import progress_interval_range_s
from gpufleet.request import Request
from gpufleet.units import parse_count, parse_duration_s

#: Accepted ranges: 1 kB to 1 EB for a checkpoint, 1 kB/s to 1 PB/s for its write (100x the fastest file
#: systems): wide enough for any job, narrow enough that a write never takes zero or infinite time.
CHECKPOINT_GB = (1e-6, 1e9)
WRITE_GBPS = (1e-6, 1e6)
#: GPUs per node when neither the write bandwidth nor the node size is given (the common 8-GPU server).
DEFAULT_GPUS_PER_NODE = 8
#: The flags that override a ReliabilityDefaults field, so that a bad value names the flag.
RELIABILITY_FLAGS = {"restart_min": "--restart-min", "failure_stats": "--failures"}


def _check_range(flag: str, value: float, bounds: tuple[float, float], unit: str) -> None:
    if not bounds[0] <= value <= bounds[1]:
        raise InputError(f"{flag} must be between {bounds[0]:g} and {bounds[1]:g} {unit}, got {value:g}")


class ReliabilityRequest(Request):
    """A job of `gpus` GPUs and its checkpoint: sized by `checkpoint_gb` or by `params` (e.g. '70B')."""

    gpus: int
    checkpoint_gb: float | None = None
    params: str | None = None
    #: None: from the node count (`gpus_per_node`) and the catalog's per-node write bandwidth
    write_gbps: float | None = None
    #: None: the catalog's reliability defaults
    restart_min: float | None = None
    #: None: Daly's optimum
    interval_min: float | None = None
    #: failure-free training time for totals ('30d'); None: no totals
    train_time: str | None = None
    #: None: DEFAULT_GPUS_PER_NODE
    gpus_per_node: int | None = None
    #: a failure_stats id; None: the catalog's default
    failures: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ReliabilityRequest:
        if self.gpus < 1:
            raise InputError(f"--gpus must be at least 1, got {self.gpus}")
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise InputError(f"--gpus-per-node must be at least 1, got {self.gpus_per_node}")
        if self.checkpoint_gb is not None and self.params is not None:
            raise InputError("give --checkpoint-gb or --params, not both: each sets the checkpoint size")
        if self.checkpoint_gb is not None:
            _check_range("--checkpoint-gb", self.checkpoint_gb, CHECKPOINT_GB, "GB")
        elif self.params is not None:
            if self.param_count < 1:
                raise InputError(f"--params must be at least 1 parameter, got {self.params}")
        else:
            raise InputError("give --checkpoint-gb SIZE or --params COUNT (e.g. --params 70B)")
        if self.write_gbps is not None:
            if self.gpus_per_node is not None:
                raise InputError("give --write-gbps or --gpus-per-node, not both: --gpus-per-node only sets the "
                                 "write bandwidth when --write-gbps is not given")
            _check_range("--write-gbps", self.write_gbps, WRITE_GBPS, "GB/s")
        if self.interval_min is not None and not self.interval_min > 0:
            raise InputError(f"--interval-min must be positive, got {self.interval_min:g}")
        if self.train_time is not None:
            self.train_time_s  # noqa: B018 - parsed now: a bad duration is refused with the request
        return self

    @property
    def param_count(self) -> float:
        return parse_count(self.params, "--params") if self.params is not None else 0.0

    @property
    def train_time_s(self) -> float | None:
        """Finite and positive (units), or None."""
        return parse_duration_s(self.train_time, "--train-time") if self.train_time else None

    def checkpoint_bytes(self, defaults: ReliabilityDefaults) -> float:
        """--checkpoint-gb, or weights + optimizer state of --params at the catalog's bytes per parameter."""
        if self.checkpoint_gb is not None:
            return self.checkpoint_gb * 1e9
        size = checkpoint_bytes(self.param_count, weight_bytes_per_param=defaults.weight_bytes_per_param,
                                optimizer_bytes_per_param=defaults.optimizer_bytes_per_param)
        if not size <= CHECKPOINT_GB[1] * 1e9:
            most = CHECKPOINT_GB[1] * 1e9 / (defaults.weight_bytes_per_param + defaults.optimizer_bytes_per_param)
            raise InputError(f"--params {self.params} needs a checkpoint over {CHECKPOINT_GB[1]:g} GB; give at most "
                             f"{most:.3g} parameters")
        return size

    def write_bytes_per_s(self, defaults: ReliabilityDefaults) -> float:
        """--write-gbps, or every node writing in parallel at the catalog's per-node bandwidth, up to its cap."""
        if self.write_gbps is not None:
            return self.write_gbps * 1e9
        return write_bandwidth_bytes_per_s(
            math.ceil(self.gpus / (self.gpus_per_node or DEFAULT_GPUS_PER_NODE)),
            per_node_bytes_per_s=defaults.write_bytes_per_s_per_node,
            max_bytes_per_s=defaults.write_bytes_per_s_max,
        )


@dataclass(frozen=True)
class ReliabilityReport:
    """The estimate and the sizes it was made with; `data` is `gpufleet reliability --json`'s document."""

    estimate: ReliabilityEstimate
    checkpoint_bytes: float
    write_bytes_per_s: float
    data: dict[str, Any]


def _inward(value: float, *, up: bool) -> float:
    """`value` to three significant figures, rounded up (a lower bound) or down (an upper bound), so that the
    range printed holds only values that are inside it."""
    unit = 10.0 ** (math.floor(math.log10(value)) - 2)
    return (math.ceil(value / unit) if up else math.floor(value / unit)) * unit


def _check_interval(interval_min: float, write_s: float, restart_s: float, mtti_s: float) -> None:
    """Refuse an --interval-min at which the job would make no progress (when some interval would)."""
    span = progress_interval_range_s(write_s=write_s, restart_s=restart_s, mtti_s=mtti_s)
    if span is None:  # no interval helps: estimate_reliability says why (failures outpace checkpoints)
        return
    shortest, longest = _inward(span[0] / 60, up=True), _inward(span[1] / 60, up=False)
    if not shortest <= interval_min <= longest:
        raise InputError(
            f"--interval-min {interval_min:g} leaves the job no progress: with an interruption every "
            f"{mtti_s / 60:.3g} min and a {write_s:.3g} s checkpoint, it must be between {shortest:.3g} and "
            f"{longest:.3g} min (optimum {daly_interval_s(write_s, mtti_s) / 60:.3g} min)"
        )


def failure_model(catalog: Catalog, defaults: ReliabilityDefaults, named: str | None) -> FailureModel:
    """The failure rates the defaults name; a --failures id the catalog lacks is the user's InputError."""
    try:
        stats = catalog.get("failure_stats", defaults.failure_stats, FailureStats)
    except UnknownNameError as error:
        if named is None:  # the catalog's own default is missing: say so as the catalog says it
            raise
        raise InputError(f"--failures: {error}") from error
    return FailureModel.from_stats(stats)


def reliability_report(request: ReliabilityRequest, catalog: Catalog) -> ReliabilityReport:
    """Interruptions, checkpoint write time, checkpoint interval (Young/Daly or the one asked for) and goodput."""
    defaults = reliability_defaults(catalog, flags=RELIABILITY_FLAGS, restart_min=request.restart_min,
                                    failure_stats=request.failures)
    model = failure_model(catalog, defaults, request.failures)
    size = request.checkpoint_bytes(defaults)
    bandwidth = request.write_bytes_per_s(defaults)
    interval_min = request.interval_min
    if interval_min is not None:
        _check_interval(interval_min, size / bandwidth, defaults.restart_s, model.mtti_s(request.gpus))
    est = estimate_reliability(
        model, gpus=request.gpus, checkpoint_bytes=size, write_bytes_per_s=bandwidth, restart_s=defaults.restart_s,
        train_time_s=request.train_time_s, interval_s=interval_min * 60 if interval_min is not None else None,
    )
    optimal_s = est.checkpoint_interval_s if interval_min is None else daly_interval_s(est.checkpoint_write_s,
                                                                                       est.mtti_s)
    data: dict[str, Any] = {
        "gpus": request.gpus,
        "failure_source": est.failure_source,
        "interruptions_per_day": est.interruptions_per_day,
        "mtti_hours": est.mtti_s / 3600,
        "checkpoint_gb": size / 1e9,
        "write_gbps": bandwidth / 1e9,
        "checkpoint_write_s": est.checkpoint_write_s,
        "restart_min": est.restart_s / 60,
        "young_interval_min": est.young_interval_s / 60,
        "optimal_interval_min": optimal_s / 60,
        "interval_min": est.checkpoint_interval_s / 60,
        "goodput": est.goodput,
        "wall_time_days": est.wall_time_s / 86400 if est.wall_time_s is not None else None,
        "interruptions_expected": est.interruptions_expected,
        "lost_gpu_hours": est.lost_gpu_hours,
    }
    return ReliabilityReport(estimate=est, checkpoint_bytes=size, write_bytes_per_s=bandwidth, data=data)
