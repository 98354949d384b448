"""The rules a PlanRequest meets, whoever builds it (the CLI from its flags, a script from Python): each field of
the right type, each literal one of those allowed, each number finite and in range. A broken rule is one
InputError naming the field (the CLI's own records name the flag before a request is ever built)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gpufleet.catalog.calibration import AttentionKernel
from gpufleet.errors import InputError, shorten
from gpufleet.fabric.topology import TOPOLOGY_KINDS
from gpufleet.parallel.memory import TRAINING_PRECISIONS
from gpufleet.request import MAX_GPUS

if TYPE_CHECKING:
    from gpufleet.planner.plan import PlanRequest

ATTENTION_KERNELS: tuple[AttentionKernel, ...] = ("flash", "cudnn", "flash-v1", "materialized")
RANK_BYS = ("time", "cost")
FABRIC_MODELS = ("analytical", "sim")


def _shown(value: Any) -> str:
    return shorten(repr(value))


def check_name(name: str, value: Any, optional: bool = False) -> None:
    """A catalog name: a non-empty string (or None where `optional`)."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{name} must be a catalog name (a non-empty string), got {_shown(value)}")


def check_choice(name: str, value: Any, allowed: Iterable[str], optional: bool = False) -> None:
    """One of `allowed` (or None where `optional`)."""
    allowed = tuple(allowed)
    if value is None and optional:
        return
    if not isinstance(value, str) or value not in allowed:
        raise InputError(f"{name} must be one of {', '.join(allowed)}, got {_shown(value)}")


def check_int(name: str, value: Any, least: int = 1, most: int | None = None, optional: bool = False) -> None:
    """A whole number (not a bool, not a float) from `least` to `most`."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{name} must be a whole number, got {_shown(value)}")
    if value < least or (most is not None and value > most):
        bounds = f"from {least:,} to {most:,}" if most is not None else f"at least {least:,}"
        raise InputError(f"{name} must be {bounds}, got {value:,}")


def check_number(name: str, value: Any, *, above: float | None = None, least: float | None = None,
                 optional: bool = False) -> None:
    """A finite real number (not a bool) above `above` or at least `least`."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{name} must be a number, got {_shown(value)}")
    if not math.isfinite(value):
        raise InputError(f"{name} must be a finite number, got {value}")
    if above is not None and not value > above:
        raise InputError(f"{name} must be greater than {above:g}, got {value:g}")
    if least is not None and not value >= least:
        raise InputError(f"{name} must be at least {least:g}, got {value:g}")


def check_plan_request(request: PlanRequest) -> None:
    """Every rule of a PlanRequest's fields (module docstring); the first broken one is raised."""
    from gpufleet.perf.step import StepOptions
    from gpufleet.planner.pins import LayoutPins
    from gpufleet.planner.search import SearchSpace

    check_name("model", request.model)
    check_name("gpu", request.gpu)
    check_name("node", request.node, optional=True)
    check_name("network", request.network, optional=True)
    check_name("stack", request.stack, optional=True)
    check_number("tokens", request.tokens, above=0)
    check_int("gpus", request.gpus, most=MAX_GPUS)
    check_choice("topology", request.topology, TOPOLOGY_KINDS)
    check_number("oversubscription", request.oversubscription, least=1)
    check_int("seq_len", request.seq_len)
    check_int("global_batch", request.global_batch, optional=True)
    check_choice("precision", request.precision, TRAINING_PRECISIONS)
    check_int("top", request.top)
    check_choice("rank_by", request.rank_by, RANK_BYS)
    check_choice("fabric_model", request.fabric_model, FABRIC_MODELS)
    check_choice("attention_kernel", request.attention_kernel, ATTENTION_KERNELS, optional=True)
    check_int("sites", request.sites)
    check_number("wan_gbps", request.wan_gbps, above=0, optional=True)
    check_number("wan_latency_s", request.wan_latency_s, least=0, optional=True)
    for name, value, kind in (("options", request.options, StepOptions),
                              ("search_space", request.search_space, SearchSpace),
                              ("pins", request.pins, LayoutPins)):
        if not isinstance(value, kind):
            raise InputError(f"{name} must be a {kind.__name__}, got {type(value).__name__}")
