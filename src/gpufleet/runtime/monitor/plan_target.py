"""What a plan predicts for one rank, read from `gpufleet plan --json` output as plain JSON (runtime never imports
the planner): step time, tokens per second per GPU, MFU."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufleet.errors import InputError
from gpufleet.input_files import load_json
from gpufleet.planfile import PLAN_KIND, read_plan_file


class PlanFileError(InputError):
    """plan.json is missing, unreadable, or lacks a plan's predictions."""


@dataclass(frozen=True)
class PlanTarget:
    """A plan's prediction: seconds per step, tokens/s per GPU, MFU (0..1)."""

    step_s: float
    tokens_per_s_per_gpu: float
    mfu: float

    @classmethod
    def from_json(cls, data: Any, index: int = 0, where: str = "plan") -> PlanTarget:
        """From `gpufleet plan --json` (its `plans` list; `index` picks one, 0 = the best) or one plan object."""
        if isinstance(data, dict) and data.get("kind") == PLAN_KIND:  # a whole plan file: its schema reads it
            try:
                plans = read_plan_file(data, where).plans
            except InputError as error:
                raise PlanFileError(str(error)) from None
            if not plans:
                raise PlanFileError(f"{where} has no plans (the search found nothing feasible, or it is a sweep)")
            if not 0 <= index < len(plans):
                raise PlanFileError(f"{where} has {len(plans)} plans; the plan index must be in [0, {len(plans) - 1}]"
                                    f", got {index}")
            chosen = plans[index]
            return cls(chosen.step_s, chosen.tokens_per_s_per_gpu, chosen.mfu)
        plans_only = data.get("plans") if isinstance(data, dict) else None
        if isinstance(plans_only, list):  # a script's {"plans": [...]}: each plan object checked below
            if not plans_only:
                raise PlanFileError(f"{where} has no plans (the search found nothing feasible)")
            if not 0 <= index < len(plans_only):
                raise PlanFileError(f"{where} has {len(plans_only)} plans; the plan index must be in "
                                    f"[0, {len(plans_only) - 1}], got {index}")
            data = plans_only[index]
        if not isinstance(data, dict):
            raise PlanFileError(f"{where} is not a `gpufleet plan --json` document")
        values = {}
        for key in ("step_s", "tokens_per_s_per_gpu", "mfu"):
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise PlanFileError(f"{where}: {key} must be a positive number (from `gpufleet plan --json`), "
                                    f"got {value!r}")
            values[key] = float(value)
        if values["mfu"] > 1:
            raise PlanFileError(f"{where}: mfu must be at most 1, got {values['mfu']}")
        return cls(**values)

    @classmethod
    def from_file(cls, path: Path, index: int = 0) -> PlanTarget:
        data = load_json(Path(path), "the plan file", "write it with `gpufleet plan ... --json > plan.json`",
                         error=PlanFileError)
        return cls.from_json(data, index, str(path))


class _PlanCollector(Collector):
    def __init__(self, plan: PlanTarget) -> None:
        self.plan = plan

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> list[Metric]:
        return [
            GaugeMetricFamily("gpufleet_plan_step_seconds", "Step time the plan predicts.", value=self.plan.step_s),
            GaugeMetricFamily("gpufleet_plan_tokens_per_second_per_gpu", "Tokens per second per GPU the plan predicts.",
                              value=self.plan.tokens_per_s_per_gpu),
            GaugeMetricFamily("gpufleet_plan_mfu_ratio", "Model FLOPs utilization the plan predicts.",
                              value=self.plan.mfu),
        ]


def plan_collector(plan: PlanTarget) -> Collector:
    """The plan's three predictions as gauges, for alerts and dashboards to compare against."""
    return _PlanCollector(plan)
