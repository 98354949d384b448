"""`launch --target T` plans within what T can run: which stack that is, and what the restriction costs.

A user who names one framework gets the best plan that framework can run (the target's stack narrows the search:
planner/stack.py), and is told what was left out: the best plan of the unrestricted search, what the target lacks
to run it (its writer's own refusal), and how much faster it would have been.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.catalog.registry import Catalog
from gpufleet.catalog.stacks import LaunchTarget, StackRecord
from gpufleet.emit.build import launch_spec
from gpufleet.emit.registry import FRAMEWORKS, emitter
from gpufleet.emit.spec import TargetCannotExpress
from gpufleet.errors import InputError
from gpufleet.planner.plan import PlanResult
from gpufleet.planner.stack import TARGET_STACKS


def framework_target(named: list[str]) -> LaunchTarget | None:
    """The one framework among the targets the user named (not `all`), else None."""
    frameworks = [name for name in dict.fromkeys(named) if name in FRAMEWORKS]
    if "all" in named or len(frameworks) != 1:
        return None
    target = frameworks[0]
    return target if target in TARGET_STACKS else None


def stack_for_target(catalog: Catalog, target: LaunchTarget, stack: str | None) -> str:
    """The stack to plan with: the one named (InputError when it launches with another framework, or has no writer
    while its family has one: `check_launchable`), else the target's (TARGET_STACKS)."""
    if stack is None:
        return TARGET_STACKS[target]
    launches = check_launchable(catalog, stack).value("launch_target")
    if launches is not None and launches != target:
        raise InputError(f"--stack {stack} launches with --target {launches}, not --target {target}: name one "
                         f"of them, or a stack of {target} (gpufleet catalog list stacks)")
    return stack


def check_launchable(catalog: Catalog, stack: str) -> StackRecord:
    """The record `stack` names; InputError when it is a release range with no writer of a family whose writer
    writes another range (`torchtitan@0.1` prices a full recompute that stops early; the torchtitan files gpufleet
    writes do not): whatever files `launch` wrote, they would not run the job the plan priced."""
    record = catalog.stack(stack)
    if record.value("launch_target") is not None:
        return record
    written = [other.id for other in catalog.records("stacks").values() if isinstance(other, StackRecord)
               and other.fold == record.fold and other.id != record.id and other.value("launch_target") is not None]
    if written:
        releases = f"releases {record.releases.words()}" if record.releases else record.name
        raise InputError(f"--stack {stack} prices {record.fold} {releases}, and gpufleet writes files for "
                         f"--stack {' or '.join(written)} only, whose settings differ: plan with --stack "
                         f"{written[0]} (gpufleet plan --stack {stack} plans without launching)")
    return record


@dataclass(frozen=True)
class LeftOut:
    """The best plan the restriction left out: its layout, what the target lacks to run it, how much faster."""

    layout: str
    lacks: str
    faster_fraction: float  # 0.12: the left-out plan's time to train is 12 % shorter

    def sentence(self, target: str) -> str:
        return (f"--target {target}: planned within what {target} can run; the best plan of any framework, "
                f"{self.layout}, would train {self.faster_fraction:.0%} faster, but {target} has no {self.lacks}")


def left_out(target: LaunchTarget, within: PlanResult, overall: PlanResult) -> LeftOut | None:
    """What the unrestricted search's best plan would have gained, when the target cannot run it; None when the
    target can run it or it is no faster."""
    best, chosen = overall.plans[0], within.plans[0]
    if best.wall_time_s >= chosen.wall_time_s:
        return None
    try:
        emitter(target).render(launch_spec(overall, 1))
    except TargetCannotExpress as refusal:
        return LeftOut(best.layout.short(), refusal.lacks, 1.0 - best.wall_time_s / chosen.wall_time_s)
    return None
