"""docs/validation.md's by-source and by-regime tables (in-sample, leave-one-source-out, interval coverage) hold what
`gpufleet validate --cross-validate --json` prints, figure by figure."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from clirun import run_gpufleet

DOC = Path(__file__).resolve().parent.parent / "docs" / "validation.md"
HEADER = ("| regime | runs | in-sample median abs error | leave-one-source-out median abs error | "
          "inside the 80 % interval (left out) | median half-width of the interval |")
SOURCE_HEADER = ("| source left out (stack family) | runs | in-sample median abs error | "
                 "leave-one-source-out median abs error | within 10 % (out of sample) |")


def regime_rows(text: str, header: str = HEADER) -> dict[str, list[str]]:
    """A table of the doc, found by its header line: first cell -> the cells after it."""
    lines = text.splitlines()
    start = lines.index(header) + 2  # the header, then the |---| line
    rows: dict[str, list[str]] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def _pct(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}%}"


def expected_rows(regimes: dict) -> dict[str, list[str]]:
    """What each row must say, from the command's `cross_validated.regimes`."""
    rows = {}
    for name, row in regimes.items():
        interval = row["interval"]
        inside = "–" if interval["coverage"] is None else (
            f"{_pct(interval['coverage'], 0)} ({interval['inside']}/{interval['runs']})")
        rows[name] = [str(row["cross_validated"]["runs"]), _pct(row["in_sample"]["median_abs_error"]),
                      _pct(row["cross_validated"]["median_abs_error"]), inside, _pct(interval["median_half_width"])]
    return rows


def test_regime_rows_parse_the_table_and_stop_at_its_end() -> None:
    text = "\n".join(["intro", HEADER, "|---|---|---|---|---|---|", "| moe | 2 | 1.0% | 2.0% | 50% (1/2) | 9.0% |",
                      "", "| other | table |"])
    assert regime_rows(text) == {"moe": ["2", "1.0%", "2.0%", "50% (1/2)", "9.0%"]}
    regimes = {"moe": {"in_sample": {"median_abs_error": 0.01},
                       "cross_validated": {"runs": 2, "median_abs_error": 0.02},
                       "interval": {"coverage": 0.5, "inside": 1, "runs": 2, "median_half_width": 0.09}}}
    assert expected_rows(regimes) == regime_rows(text)


def expected_source_rows(data: dict) -> dict[str, list[str]]:
    """The by-source table from the command's output: leave-one-source-out from `cross_validated`, in-sample from
    each run's `family` and `error` (the recorded fits)."""
    cv = data["cross_validated"]

    def in_sample(rows: list[dict]) -> str:
        errors = [abs(run["error"]) for run in rows if run["error"] is not None]
        return _pct(statistics.median(errors)) if errors else "–"

    def row(stats: dict, runs: list[dict]) -> list[str]:
        if not stats["runs"]:
            return ["0", "–", "–", "–"]
        return [str(stats["runs"]), in_sample(runs), _pct(stats["median_abs_error"]), _pct(stats["within_10pct"], 0)]

    runs = data["runs"]
    rows = {source: row(stats, [r for r in runs if r["family"] == source]) for source, stats in cv["by_source"].items()}
    rows["dense"] = row(cv["dense"], [r for r in runs if r["regime"] not in ("moe", None)])
    rows["MoE"] = row(cv["moe"], [r for r in runs if r["regime"] == "moe"])
    rows["**all**"] = row(cv, runs)
    return rows


@pytest.mark.timeout(600)
def test_the_docs_regime_and_source_tables_are_what_validate_cross_validate_prints() -> None:
    done = run_gpufleet("validate", "--cross-validate", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    doc = DOC.read_text(encoding="utf-8")
    assert regime_rows(doc) == expected_rows(data["cross_validated"]["regimes"])
    assert regime_rows(doc, SOURCE_HEADER) == expected_source_rows(data)
