"""Calibration constants chosen by looking at measured runs, as recorded fits (`data/fits.yaml`).

Each fit sets one calibration field on a set of GPUs (a calibration profile that sets the field itself wins),
records the value, the grid it is searched over, which runs it is fitted on (a selector over explicit run fields)
and the ids of the runs the recorded value was fitted on. `scripts/fit_calibration.py` refits them from run files;
`gpufleet validate --cross-validate` refits them without each source in turn (planner/fit.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from gpufleet.catalog.calibration import AttentionKernel, CalibrationProfile
from gpufleet.catalog.records import RECORD_CONFIG, Record

FittedField = Literal["in_training_fraction", "cudnn_attention_fraction", "gemm_sustained_fraction",
                      "host_s_per_kernel"]


class FitSelector(BaseModel):
    """Which runs a fit is fitted on, among those on its GPUs (explicit run fields only; unset: any)."""

    model_config = RECORD_CONFIG
    attention_kernel: AttentionKernel | None = None  # the kernel the run's stack and calibration give it
    moe: bool | None = None  # the run's model has experts


class FitRecord(Record):
    """One fitted calibration constant."""

    field: FittedField
    gpus: tuple[str, ...] | None = None  # None: every GPU
    value: float = Field(ge=0)
    low: float = Field(ge=0)
    high: float = Field(gt=0)
    step: float = Field(gt=0)
    runs: FitSelector = Field(default_factory=FitSelector)
    #: the runs the recorded value was fitted on (written by scripts/fit_calibration.py --write)
    chosen_on: tuple[str, ...] = ()
    #: the value before it became a recorded fit, and how it had been chosen
    prior: str | None = None

    @model_validator(mode="after")
    def _grid(self) -> FitRecord:
        if not self.low <= self.value <= self.high:
            raise ValueError(f"value {self.value} is outside the grid [{self.low}, {self.high}]")
        return self

    def grid(self) -> list[float]:
        """The values the fit tries, low to high."""
        count = round((self.high - self.low) / self.step)
        return [round(self.low + i * self.step, 10) for i in range(count + 1)]

    def governs(self, profile: CalibrationProfile) -> bool:
        """Whether this fit sets the profile's field (its GPU is covered and the profile does not set it)."""
        return (self.gpus is None or profile.id in self.gpus) and self.field not in profile.model_fields_set


def apply_fits(profile: CalibrationProfile, fits: Sequence[FitRecord],
               values: Mapping[str, float] | None = None) -> CalibrationProfile:
    """`profile` with every fit that governs it applied: the recorded value, or `values[fit.id]` when given."""
    updates: dict[str, float] = {fit.field: (values or {}).get(fit.id, fit.value) for fit in fits
                                 if fit.governs(profile)}
    return profile.model_copy(update=updates) if updates else profile
