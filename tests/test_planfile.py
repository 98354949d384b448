"""One plan file: `plan --json` writes the versioned schema (gpufleet.planfile) and every reader goes through it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from clirun import one_error_line, run_gpufleet
from gpufleet.errors import InputError
from gpufleet.planfile import PLAN_KIND, SCHEMA_VERSION, read_plan_file

SRC = Path(__file__).parents[1] / "src" / "gpufleet"


@pytest.fixture(scope="module")
def pinned_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    done = run_gpufleet("plan", "-m", "llama3-8b", "-n", "64", "--tp", "2", "--pp", "1-2", "--sharding",
                        "zero1,zero3", "--top", "3", "--json")
    assert done.returncode == 0, done.stderr
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(done.stdout, encoding="utf-8")
    return path


def test_plan_json_is_a_plan_file_of_this_schema(pinned_plan: Path) -> None:
    data = json.loads(pinned_plan.read_text())
    saved = read_plan_file(data, "plan.json")
    assert (saved.kind, saved.schema_version) == (PLAN_KIND, SCHEMA_VERSION)
    assert saved.plans and all(plan.layout.tp == 2 and plan.layout.pp in (1, 2) for plan in saved.plans)
    assert data["request"]["pins"]["pp"] == {"low": 1, "high": 2}  # a range is saved as a range


def test_launch_and_report_read_the_pinned_plan_back(pinned_plan: Path, tmp_path: Path) -> None:
    launched = run_gpufleet("launch", "--plan", str(pinned_plan), "--rank", "2", "--target", "megatron", "--out",
                            str(tmp_path / "run"), "--json")
    assert launched.returncode == 0, launched.stderr
    second = read_plan_file(json.loads(pinned_plan.read_text()), "plan.json").plans[1]  # type: ignore[index]
    assert json.loads(launched.stdout)["layout"]["tp"] == second.layout.tp == 2
    reported = run_gpufleet("report", str(pinned_plan), "-o", str(tmp_path / "plan.html"))
    assert reported.returncode == 0, reported.stderr


def test_an_unversioned_file_is_refused_in_one_line_saying_what_to_do(pinned_plan: Path, tmp_path: Path) -> None:
    data = json.loads(pinned_plan.read_text())
    del data["schema_version"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    for args in (("launch", "--plan", str(old), "--target", "megatron", "--out", str(tmp_path / "r")),
                 ("report", str(old), "-o", str(tmp_path / "r.html"))):
        line = one_error_line(run_gpufleet(*args))
        assert "schema 1" in line and f"schema {SCHEMA_VERSION}" in line and "plan it again" in line


@pytest.mark.parametrize("damage", ["kind", "plans", "step"])
def test_a_foreign_or_damaged_file_is_one_input_error(pinned_plan: Path, damage: str) -> None:
    data = json.loads(pinned_plan.read_text())
    if damage == "kind":
        data["kind"] = "something-else"
    elif damage == "plans":
        data["plans"] = "not a list"
    else:
        data["plans"][0]["step_s"] = -1
    with pytest.raises(InputError):
        read_plan_file(data, "plan.json")


def test_no_reader_outside_the_schema_takes_the_plan_files_keys_by_hand() -> None:
    """The plan file has one owner: outside planfile.py (and the writer, planner/plan_json.py), no module indexes a
    document by the plan file's own top-level keys."""
    pattern = re.compile(r"""(\[|\.get\()["'](plans|sweep|gpufleet_version|schema_version|framework)["']""")
    readers = []
    for path in SRC.rglob("*.py"):
        if path.name == "planfile.py" or path.relative_to(SRC).as_posix() in ("planner/plan_json.py",
                                                                               "runtime/monitor/plan_target.py"):
            continue
        readers += [f"{path.relative_to(SRC)}:{number}" for number, line in
                    enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert readers == []
