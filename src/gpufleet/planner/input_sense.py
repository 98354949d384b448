"""Inputs that are well-formed but cannot be what the user meant, refused before a search: a token count below one
optimizer step (15 tokens for 15T), and a pinned tensor-parallel degree that divides neither the model's heads nor
the GPUs (no layout can have it). Each is one InputError naming the flag and why (exit 2, as any other mistake)."""

from __future__ import annotations

from gpufleet.errors import InputError
from gpufleet.planner.pins import LayoutPins, ValueRange
from gpufleet.workload.job import Job


def check_tokens_fill_a_step(job: Job) -> None:
    """A run shorter than one optimizer step is a missing unit, not a plan."""
    step_tokens = job.global_batch * job.seq_len
    if job.tokens < step_tokens:
        raise InputError(f"--tokens {job.tokens:,.0f} is less than one optimizer step ({step_tokens:,} tokens = "
                         f"{job.global_batch:,} sequences of {job.seq_len:,}); give a unit, e.g. 15T or 300B")


def _pinned_values(pin: object) -> list[int] | None:
    """The values a tp pin allows (None: a range, which the search narrows to what is legal, or no pin)."""
    if pin is None or isinstance(pin, ValueRange):
        return None
    values = list(pin) if isinstance(pin, tuple) else [pin]
    return [value for value in values if isinstance(value, int)]


def check_pinned_tp(pins: LayoutPins, job: Job, gpus: int, max_tp: int) -> None:
    """A pinned tp that no layout of this model on these GPUs can have: at most `max_tp` (the scale-up domain, or
    the search space's cap), dividing the heads and the GPUs, and one of the heads and the key-value heads must
    divide the other."""
    values = _pinned_values(pins.tp)
    if not values:
        return
    model = job.model

    def legal(tp: int) -> bool:
        return (tp <= max_tp and model.heads % tp == 0 and gpus % tp == 0
                and (model.kv_heads % tp == 0 or tp % model.kv_heads == 0))

    if any(legal(tp) for tp in values):
        return
    allowed = [tp for tp in range(1, model.heads + 1) if legal(tp)]
    shown = ", ".join(map(str, values))
    raise InputError(f"--tp {shown}: a tensor-parallel degree is at most {max_tp} and divides {model.id}'s "
                     f"{model.heads} attention heads and the {gpus:,} GPUs ({model.kv_heads} key-value heads); "
                     "allowed: "
                     f"{', '.join(map(str, allowed))}")
