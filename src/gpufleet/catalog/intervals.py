"""Prediction intervals as recorded catalog data (`data/intervals.yaml`), like the calibration fits.

One record is one table: the leave-one-source-out residuals it was built from (each run's id, source family, regime
and log(predicted / measured) of tokens/s per GPU), the band each regime gets (the conformal quantile of |log error|
at `level`, or its parent's where the regime is sparse), the date and the command that regenerates it
(`scripts/build_intervals.py --write`). The arithmetic lives in `gpufleet.planner.intervals`.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from gpufleet.catalog.records import RECORD_CONFIG, Record


class RecordedResidual(BaseModel):
    """One run's out-of-sample error: predicted with the fits refitted without its source family."""

    model_config = RECORD_CONFIG
    id: str
    family: str  # the run's source family (its stack's `family`, else the stack id): the fold it was left out in
    regime: str
    log_error: float  # log(predicted / measured tokens/s per GPU)


class RecordedBand(BaseModel):
    """One regime's band: |log(predicted / measured)| ≤ `quantile_log` holds for `level` of its runs."""

    model_config = RECORD_CONFIG
    quantile_log: float = Field(ge=0)
    runs: int = Field(ge=0)  # the regime's own residuals
    widened: bool  # sparse (fewer than `min_runs`): the parent's band, widened to the regime's own quantile
    note: str


class IntervalRecord(Record):
    """A recorded interval table (kind `intervals`)."""

    level: float = Field(gt=0, lt=1)
    #: a regime with fewer residuals than this borrows its parent's band (a judgement, not fitted)
    min_runs: int = Field(ge=1)
    built: str  # ISO date the residuals were computed
    command: str  # regenerates this record
    run_files: tuple[str, ...]
    residuals: tuple[RecordedResidual, ...]
    regimes: dict[str, RecordedBand]
