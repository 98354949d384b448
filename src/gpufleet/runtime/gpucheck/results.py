"""What each gpu-check step saw, and the two files that record it: results.json (for scripts) and REPORT.md (for
people). The format is documented in docs/measure.md; `FORMAT` names its version."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

FORMAT = "gpufleet-gpu-check/1"
Status = Literal["pass", "fail", "skipped"]
STATUSES: tuple[Status, ...] = ("pass", "fail", "skipped")


@dataclass(frozen=True)
class Outcome:
    """What a step returns: its status, the figures it measured, and one line saying why."""

    status: Status
    reason: str
    numbers: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepResult:
    name: str
    title: str
    status: Status
    reason: str
    seconds: float
    timeout_s: float
    numbers: Mapping[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "status": self.status, "reason": self.reason,
                "seconds": round(self.seconds, 3), "timeout_s": self.timeout_s, "numbers": dict(self.numbers)}


@dataclass(frozen=True)
class Report:
    mode: Literal["gpu", "dry"]
    machine: Mapping[str, Any]
    started: str
    wall_s: float
    steps: Sequence[StepResult]
    versions: Mapping[str, str]

    def counts(self) -> dict[str, int]:
        return {status: sum(step.status == status for step in self.steps) for status in STATUSES}

    def as_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "mode": self.mode, "started": self.started, "wall_s": round(self.wall_s, 3),
                "machine": dict(self.machine), "versions": dict(self.versions), "counts": self.counts(),
                "steps": [step.as_json() for step in self.steps]}


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, Mapping):
        return "; ".join(f"{key} {_cell(item)}" for key, item in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(_cell(item) for item in value) if value else "none"
    return "-" if value is None else str(value).replace("|", "/").replace("\n", " ")


def report_markdown(report: Report) -> str:
    """REPORT.md: a header, one table row per step, then each step's figures."""
    counts = report.counts()
    gpu = report.machine.get("gpu_name") or "none"
    lines = [f"# gpu-check report ({report.mode} path)", "",
             f"- started {report.started}, {report.wall_s:.1f} s in all, on {report.machine.get('hostname')}",
             f"- GPU: {gpu} (catalog id {report.machine.get('catalog_gpu') or '-'}); "
             + ", ".join(f"{name} {version}" for name, version in report.versions.items()),
             f"- {counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped", "",
             "| step | status | seconds | why |", "|---|---|---|---|"]
    lines += [f"| {step.name} | {step.status} | {step.seconds:.1f} | {_cell(step.reason)} |" for step in report.steps]
    for step in report.steps:
        lines += ["", f"## {step.name}: {step.title}", "", f"**{step.status}**: {step.reason}", ""]
        for key, value in step.numbers.items():
            lines += _bullets(key, value, "")
    return "\n".join(lines) + "\n"


def _bullets(key: str, value: Any, indent: str) -> list[str]:
    """`- key: value`; a mapping that holds mappings opens nested bullets instead (two levels at most)."""
    if isinstance(value, Mapping) and len(indent) < 4 and any(isinstance(item, Mapping) for item in value.values()):
        return [f"{indent}- {key}:", *[line for name, item in value.items() for line in _bullets(name, item,
                                                                                                  indent + "  ")]]
    return [f"{indent}- {key}: {_cell(value)}"]


def write_report(report: Report, out: Path) -> tuple[Path, Path]:
    """results.json and REPORT.md under `out` (created), each written whole then renamed into place."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in (("results.json", json.dumps(report.as_json(), indent=2) + "\n"),
                       ("REPORT.md", report_markdown(report))):
        path = out / name
        temporary = path.with_name(f".{name}.tmp")
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(path)
        written.append(path)
    return written[0], written[1]
