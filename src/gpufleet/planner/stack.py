"""Applying a framework stack to a search: what it can run (its features narrow the space) and what it does where
nothing is pinned (its layout defaults fill free fields).

`plan --stack`, `launch --target` and `validate` (a run's `stack:`) all go through these two functions with
explicit fields, never a published run, so that the layout a stack is priced with in `validate` is the layout
`plan` ranks for it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpufleet.catalog.registry import Catalog
from gpufleet.catalog.stacks import LaunchTarget, StackRecord
from gpufleet.errors import InputError
from gpufleet.planner.search import SearchSpace
from gpufleet.workload.job import Job

#: The stack `launch --target T` plans with when no --stack is named: the one whose settings are the target's own
#: defaults (megatron-lm's are gpufleet's, which are Megatron-LM's). Each maps to a stack of that launch target
#: (tests/test_stack_capabilities.py checks it against the catalog).
TARGET_STACKS: dict[LaunchTarget, str] = {"megatron": "megatron-lm", "deepspeed": "deepspeed",
                                          "torchtitan": "torchtitan"}


def stack_search_space(stack: StackRecord, space: SearchSpace) -> SearchSpace:
    """`space` narrowed to what the stack can run: without the features it lacks (sequence or context parallelism,
    CPU activation offload, expert parallelism, block recompute), with only the virtual-stage counts and sharding
    kinds it offers, and only the sharding kinds it combines with pipeline parallelism."""
    if stack.value("sequence_parallel") is False:
        space = replace(space, sequence_parallel=False)
    if stack.value("context_parallel") is False:
        space = replace(space, cps=(1,))
    if stack.value("activation_offload") is False:
        space = replace(space, activation_offload=False)
    if stack.value("expert_parallel") is False:
        space = replace(space, expert_parallel=False)
    if stack.value("partial_recompute") is False:
        space = replace(space, partial_recompute=False)
    vpps = stack.value("vpps")
    if vpps is not None:
        space = replace(space, vpps=tuple(v for v in space.vpps if v in vpps) or (1,))
    shardings = stack.value("shardings")
    if shardings is not None:
        space = replace(space, shardings=tuple(s for s in space.shardings if s in shardings) or ("none",))
    pp_shardings = stack.value("pp_shardings")
    if pp_shardings is not None:
        space = replace(space, pp_shardings=tuple(pp_shardings))
    return space


def stack_layout_defaults(stack: StackRecord, fixed: dict[str, Any], job: Job,
                          local_batches: int | None) -> dict[str, Any]:
    """`fixed` (layout field -> pin, None where free) with the stack's documented layout defaults in the free
    fields: its sharding, sequence parallelism and expert tp, and its micro-batch rule (torchtitan: one local
    batch split into as many micro-batches as pipeline stages) where the local batch count (dp × pp) is known."""
    filled = dict(fixed)
    for name in ("sharding", "sequence_parallel"):
        if filled.get(name) is None and stack.value(name) is not None:
            filled[name] = stack.value(name)
    if job.model.moe is not None and filled.get("expert_tp") is None and stack.value("expert_tp") is not None:
        filled["expert_tp"] = stack.value("expert_tp")
    if (stack.value("micro_batches_per_pp_stage") and filled.get("micro_batch") is None
            and local_batches is not None and job.global_batch % local_batches == 0):
        filled["micro_batch"] = job.global_batch // local_batches
    return filled


def check_stack_precision(stack: StackRecord, precision: str) -> None:
    """InputError naming the precisions the stack runs, when `precision` is not one of them."""
    precisions = stack.value("precisions")
    if precisions is not None and precision not in precisions:
        raise InputError(f"stack {stack.id} does not train in {precision}: it runs {', '.join(precisions)} "
                         f"({stack.settings.precisions.source if stack.settings.precisions else ''})")


def target_stack(catalog: Catalog, target: LaunchTarget) -> StackRecord:
    """The stack `launch --target` plans with when no --stack is named."""
    return catalog.stack(TARGET_STACKS[target])
