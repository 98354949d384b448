"""What naming a stack's version does to a prediction: each run that names a versioned stack (`stack: nemo@24.12`),
predicted with that stack, with its bare family name (`nemo`: the family's conservative settings) and with no stack
(gpufleet's Megatron-LM defaults), against its measured tokens/s per GPU.

`scripts/validation_report.py` prints the comparison in docs/validation.md ("Versioned stacks") and
tests/test_stack_versions.py checks the claim it supports: naming the version moves the prediction toward the
measurement. In-sample: the recorded calibration fits, the figures a user of `plan` gets.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from gpufleet.catalog.registry import Catalog
from gpufleet.planner.published_runs import PublishedRun
from gpufleet.planner.validate import predict_run


@dataclass(frozen=True)
class VersionedRun:
    """One run's error (predicted / measured − 1) with its versioned stack, its bare family name and no stack."""

    id: str
    family: str
    stack_record: str  # the versioned record the run's stack resolves to (nemo@24.x)
    versioned_error: float
    bare_error: float
    default_error: float

    @property
    def moved_away(self) -> float:
        """How many points further from the measurement the versioned stack puts the prediction than the bare
        family name or no stack does, whichever is nearer (negative: the versioned stack is nearest)."""
        return abs(self.versioned_error) - min(abs(self.bare_error), abs(self.default_error))


@dataclass(frozen=True)
class VersionSummary:
    """A group of runs' median |error| with the versioned stack, the bare name and no stack."""

    label: str
    runs: int
    versioned: float
    bare: float
    default: float
    worst_move_away: float  # the largest `moved_away` of the group (fraction of the measurement)


def is_versioned(run: PublishedRun) -> bool:
    """Whether the run names its stack with a release or range (`FAMILY@...`)."""
    return run.stack is not None and "@" in run.stack


def compare_versions(runs: Iterable[PublishedRun], catalog: Catalog) -> list[VersionedRun]:
    """Each versioned run predicted three ways; runs any of the three cannot predict are left out."""
    rows: list[VersionedRun] = []
    for run in runs:
        if run.stack is None or not is_versioned(run):
            continue
        record = catalog.stack(run.stack)
        family = record.family or record.id
        errors = [predict_run(variant, catalog).error for variant in
                  (run, run.model_copy(update={"stack": family}), run.model_copy(update={"stack": None}))]
        if any(error is None for error in errors):
            continue
        versioned, bare, default = (float(error) for error in errors if error is not None)
        rows.append(VersionedRun(run.id, family, record.id, versioned, bare, default))
    return rows


def summarize_versions(rows: list[VersionedRun], label: str) -> VersionSummary:
    """Median |error| of `rows` each way, and the worst move away from the measurement."""
    def median(values: Iterable[float]) -> float:
        return statistics.median(abs(value) for value in values)

    return VersionSummary(label, len(rows), median(r.versioned_error for r in rows), median(r.bare_error for r in rows),
                          median(r.default_error for r in rows), max(r.moved_away for r in rows))


def version_table(rows: list[VersionedRun]) -> list[VersionSummary]:
    """One summary per versioned record, one per family, and one over every versioned run."""
    groups: dict[str, list[VersionedRun]] = {}
    for row in rows:
        groups.setdefault(row.stack_record, []).append(row)
    for row in rows:
        groups.setdefault(f"{row.family} (every release)", []).append(row)
    return [*(summarize_versions(members, label) for label, members in groups.items()),
            summarize_versions(rows, "all versioned runs")]
