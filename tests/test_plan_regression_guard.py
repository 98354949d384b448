"""Regression guard: `gpufleet plan --json` gives the answers recorded in tests/data/plan_regression_guard/ for a
fixed set of cases (issue 29, item 5: the MoE search made fast with its answers unchanged): the same document, keys
in the same order, every string, integer and flag the same, and every float the same up to last-bit noise
(tests/guards.py's GUARD_REL_TOL: libm and numpy builds may differ in a figure's last bit from machine to machine).

The cases: the DeepSeek-V3 search the issue times (2,048 H800 in FP8), Mixtral on 64 GPUs (ten plans), dense
Llama 3.1 405B on 16,384 H100, a scale sweep, and torchtitan's settings for an MoE and a dense model. A change
that is meant to change an answer regenerates the files (`PYTHONPATH=src python tests/test_plan_regression_guard.py`)
and says why in its commit; a speed-up must leave them as they are.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from clirun import run_gpufleet
from guards import assert_same_document

pytestmark = pytest.mark.timeout(600)

DATA = Path(__file__).parent / "data" / "plan_regression_guard"

#: name -> the `gpufleet plan` arguments (each run with --json)
CASES: dict[str, tuple[str, ...]] = {
    "deepseek-v3-2048xh800-fp8": ("-m", "deepseek-v3", "-n", "2048", "-g", "h800-sxm", "--precision", "fp8"),
    "mixtral-8x7b-64-top10": ("-m", "mixtral-8x7b", "-n", "64", "--top", "10"),
    "llama3-405b-16384xh100": ("-m", "llama3-405b", "-t", "15T", "-g", "h100-sxm", "-n", "16384"),
    "mixtral-8x7b-sweep-64-256": ("-m", "mixtral-8x7b", "-n", "64-256"),
    "qwen3-30b-a3b-64-torchtitan": ("-m", "qwen3-30b-a3b", "-n", "64", "--stack", "torchtitan"),
    "llama3-70b-256-torchtitan": ("-m", "llama3-70b", "-n", "256", "--stack", "torchtitan"),
}


def plan_json(args: tuple[str, ...]) -> str:
    done = run_gpufleet("plan", *args, "--json")
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("name", list(CASES))
def test_regression_guard_plan_json_is_unchanged(name: str) -> None:
    expected = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    assert_same_document(json.loads(plan_json(CASES[name])), expected)  # the message says where they differ


def test_every_case_has_its_recorded_answer() -> None:
    assert sorted(path.stem for path in DATA.glob("*.json")) == sorted(CASES)


if __name__ == "__main__":  # regenerate the recorded answers (only for a change meant to change them)
    sys.path.insert(0, str(Path(__file__).parent))
    DATA.mkdir(parents=True, exist_ok=True)
    for case, arguments in CASES.items():
        (DATA / f"{case}.json").write_text(plan_json(arguments), encoding="utf-8")
        print(f"wrote {case}.json")
