"""A plan file's `request` block is checked field by field, with types and bounds, before `report` re-runs it
(planner/request_file.py, PlanRequest, StepOptions, MemoryAssumptions and SearchSpace): a wrong-typed, out-of-range or
huge value is one line and exit 2, within seconds (a gpus of 10**40 ran past 75 s; a micro-batch of 0 was a
ZeroDivisionError)."""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clirun import one_error_line, run_gpufleet

BAD_VALUES = st.one_of(st.none(), st.booleans(), st.just(10**40), st.integers(max_value=0),
                       st.sampled_from([math.nan, math.inf, -1.5, 1e308]), st.text(max_size=6),
                       st.lists(st.integers(max_value=0), min_size=1, max_size=2), st.just({"x": 1}))


@pytest.fixture(scope="module")
def plan_document() -> dict[str, Any]:
    done = run_gpufleet("plan", "-m", "llama3-8b", "-n", "64", "--top", "2", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _paths(block: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for key, value in block.items():
        if isinstance(value, dict) and key != "pins":
            found += _paths(value, (*prefix, key))
        else:
            found.append((*prefix, key))
    return found


def _set(document: dict[str, Any], path: tuple[str, ...], value: object) -> None:
    node = document["request"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_bad_request_field_is_one_line_and_exit_2(plan_document: dict[str, Any], tmp_path: Path,
                                                    data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(sorted(_paths(plan_document["request"]))))
    value = data.draw(BAD_VALUES)
    document = copy.deepcopy(plan_document)
    _set(document, path, value)
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(document))
    started = time.monotonic()
    done = run_gpufleet("report", str(saved), "-o", str(tmp_path / "plan.html"))
    assert time.monotonic() - started < 10, (path, value)
    assert "Traceback" not in done.stderr, (path, value, done.stderr)
    if done.returncode == 2:  # refused: one line (an allowed value re-plans: exit 0, or 1 where nothing then fits)
        assert one_error_line(done).startswith("error: ")
    else:
        assert done.returncode in (0, 1) and len(done.stderr.splitlines()) <= 1, (path, value, done.stderr)


@pytest.mark.parametrize(("path", "value", "says"), [
    (("gpus",), 10**40, "gpus must be from 1 to"),
    (("options", "dp_overlap"), "maybe", "request.options.dp_overlap"),
    (("search_space", "micro_batches"), [0], "search_space.micro_batches must be whole numbers of at least 1"),
    (("options", "memory", "grad_dtype"), "fp64", "request.options.memory.grad_dtype"),
    (("options", "straggler_sigma"), -1, "options.straggler_sigma must be a finite number of at least 0"),
])
def test_the_cases_the_issue_names(plan_document: dict[str, Any], tmp_path: Path, path: tuple[str, ...],
                                   value: object, says: str) -> None:
    document = copy.deepcopy(plan_document)
    _set(document, path, value)
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(document))
    assert says in one_error_line(run_gpufleet("report", str(saved), "-o", str(tmp_path / "plan.html")))
