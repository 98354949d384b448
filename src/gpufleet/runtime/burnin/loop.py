"""Closing the loop: the planner's step time for the burn-in's own layout on the host catalog `--measure-host`
wrote (`planner.fixed_layout.eager_fsdp_step`, composed by the CLI: runtime never imports the planner), next to
the step time the burn-in measured. No torch here."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpufleet.errors import InputError

#: Steps left out of the measured median: the first steps pay for allocation and lazy initialisation.
WARMUP_STEPS = 2


@dataclass(frozen=True)
class LoopCheck:
    """The plan's step for the burn-in's layout, the burn-in's measured step (median after warm-up), and the plan's
    parts (exposed seconds by name) that say which term is off when the two differ."""

    predicted_s: float
    measured_s: float
    parts_s: Mapping[str, float]
    clock: str  # "wall" or "cpu": what both sides were timed with
    #: the plan's 80 % interval for its step (planner/intervals.py), where the planner gave one
    interval_s: tuple[float, float] | None = None

    @property
    def ratio(self) -> float:
        return self.predicted_s / self.measured_s

    def summary(self) -> str:
        parts = ", ".join(f"{name} {seconds * 1e3:.1f}" for name, seconds in self.parts_s.items() if seconds > 0)
        band = f" ({self.interval_s[0]:.4f}–{self.interval_s[1]:.4f})" if self.interval_s else ""
        return (f"plan {self.predicted_s:.4f} s/step{band}, burn-in {self.measured_s:.4f} s/step ({self.clock} clock): "
                f"plan/burn-in {self.ratio:.3f}{'' if self.interval_s is None else self._inside()}; plan parts (ms): "
                f"{parts}")

    def _inside(self) -> str:
        low, high = self.interval_s or (0.0, 0.0)
        return ", inside the plan's interval" if low <= self.measured_s <= high else ", outside the plan's interval"


def measured_step(step_seconds: Sequence[float]) -> float:
    """The median step after the warm-up steps (all steps when there are no more than that)."""
    if not step_seconds:
        raise InputError("the burn-in logged no steps to compare the plan with")
    kept = step_seconds[WARMUP_STEPS:] or step_seconds
    return statistics.median(kept)
