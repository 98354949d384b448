"""The result of one preflight check, and the report of a node."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.runtime.doctor.nccl_log import Finding
from gpufleet.runtime.doctor.seams import Status


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check: a stable `id`, ok/warn/fail/skip, what was seen and (unless ok) what to change."""

    id: str
    status: Status
    message: str
    fix: str = ""
    figures: dict[str, float] = field(default_factory=dict)  # numbers `doctor --cluster` compares across nodes
    findings: tuple[Finding, ...] = ()  # the separate things a check saw (nccl-env: one per variable)


@dataclass(frozen=True, slots=True)
class NodeReport:
    host: str
    checks: tuple[CheckResult, ...]

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return tuple(check for check in self.checks if check.status == "fail")

    def figures(self) -> dict[str, float]:
        """Every check's figures, as `check-id.name`."""
        return {f"{check.id}.{name}": value for check in self.checks for name, value in check.figures.items()}
