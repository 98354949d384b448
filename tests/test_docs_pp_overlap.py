"""docs/residuals.md, "Pipeline sends overlapped with compute": its table and rows against `gpufleet validate` with and
without `--no-overlap-pp` (two leave-one-source-out runs: slow tier)."""

from __future__ import annotations

import pytest

from test_docs_live import command_json, doc_section
from test_docs_live_more import table_row

SECTION = "## Pipeline sends overlapped with compute"


def _section() -> str:
    return doc_section("docs/residuals.md", SECTION)


def _pct(value: float) -> str:
    return f"{value * 100:.1f}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_table_is_what_validate_prints_with_and_without_the_overlap() -> None:
    text = _section()
    columns = {"off": ("--no-overlap-pp",), "on": ()}
    cells: dict[str, list[str]] = {"loso": [], "in": [], "held": []}
    for flags in columns.values():
        cv = command_json("validate", "--cross-validate", *flags)
        folds = cv["cross_validated"]
        cells["loso"].append(" / ".join(_pct(folds[key]["median_abs_error"]) if key != "all" else
                                        _pct(folds["median_abs_error"]) for key in ("all", "dense", "moe")))
        cells["in"].append(_pct(cv["summary"]["all"]["median_abs_error"]))
        cells["held"].append(_pct(cv["held_out"]["summary"]["all"]["median_abs_error"]))
    row = table_row(text, "LOSO, all / dense / MoE")
    assert row[1] == f"{cells['loso'][0]} %" and row[2].replace("**", "") == f"{cells['loso'][1]} %", row
    row = table_row(text, "in-sample, all (recorded fits)")
    assert row[1:3] == [f"{cells['in'][0]} %", f"{cells['in'][1]} %"], row
    row = table_row(text, "held-out (37 runs in no fit)")
    assert row[1:3] == [f"{cells['held'][0]} %", f"{cells['held'][1]} %"], row


def test_the_rows_the_section_quotes() -> None:
    text = " ".join(_section().split())
    errors = {flags: {run["id"]: run["error"] for run in command_json("validate", *flags)["runs"]}
              for flags in (("--no-overlap-pp",), ())}
    quoted = {"nemo2412-llama2-13b-16gpu": "Llama 2 13B", "nemo2412-llama2-70b-64gpu": "Llama 2 70B",
              "mbridge-2511-h100-llama3-70b-64gpu": "H100 Llama 3 70B",
              "mbridge-2602-gb200-llama3-405b-256gpu": "GB200 Llama 3 405B",
              "nemo2502-b200-llama3-70b-64gpu": "B200 Llama 3 70B",
              "nemo2504-gb200-llama3-405b-128gpu": "GB200 Llama 3 405B"}
    for run_id, words in quoted.items():
        off, on = (errors[flags][run_id] for flags in (("--no-overlap-pp",), ()))
        phrase = f"{words} {off * 100:+.1f} → {on * 100:+.1f} %".replace("-", "−")
        assert phrase in text, (run_id, phrase)
