"""`gpufleet report PLAN.json`, `plan --html` and `validate --html` as a user runs them: what they write, and the
one-line refusals (exit 2) for a file that is not a plan, a plan from another version, and an unwritable path."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from clirun import one_error_line
from clirun import run_gpufleet as gpufleet
from gpufleet import __version__

pytestmark = pytest.mark.timeout(300)
SMALL = ("plan", "-n", "16", "--top", "2")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plan saved as `plan --json` writes it, with --html written alongside."""
    folder = tmp_path_factory.mktemp("saved")
    done = gpufleet(*SMALL, "--json", "--html", str(folder / "planned.html"))
    assert done.returncode == 0, done.stderr
    (folder / "plan.json").write_text(done.stdout)
    return folder / "plan.json"


def test_report_redraws_a_saved_plan(saved: Path, tmp_path: Path) -> None:
    data = json.loads(saved.read_text())
    assert data["kind"] == "gpufleet-plan" and data["gpufleet_version"] == __version__
    assert data["request"]["gpus"] == 16 and data["html"].endswith("planned.html")  # plan's keys stay as they were
    target = tmp_path / "again.html"
    done = gpufleet("report", str(saved), "-o", str(target), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["html"] == str(target)
    page, planned = target.read_text(), (saved.parent / "planned.html").read_text()
    for plan in data["plans"]:
        assert plan["layout"]["label"] in page
    # the same charts as plan --html drew (only the line saying where the numbers came from differs)
    assert re.findall(r"<svg.*?</svg>", page, flags=re.S) == re.findall(r"<svg.*?</svg>", planned, flags=re.S)


def test_report_refuses_a_plan_it_no_longer_reproduces(saved: Path, tmp_path: Path) -> None:
    data = json.loads(saved.read_text())
    data["plans"][0]["step_s"] *= 1.5  # as if planned with another catalog
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    done = gpufleet("report", str(edited), "-o", str(tmp_path / "x.html"))
    assert done.returncode == 2
    assert "no longer gives plan" in one_error_line(done)
    assert not (tmp_path / "x.html").exists()


@pytest.mark.parametrize(("content", "said"), [
    ("not json at all", "is not JSON"),
    ('{"runs": []}', "is not a gpufleet plan"),
    ('[1, 2]', "is not a gpufleet plan"),
])
def test_report_refuses_what_is_not_a_plan(tmp_path: Path, content: str, said: str) -> None:
    source = tmp_path / "in.json"
    source.write_text(content)
    done = gpufleet("report", str(source), "-o", str(tmp_path / "out.html"))
    assert done.returncode == 2 and said in one_error_line(done)


def test_report_refuses_another_versions_plan(saved: Path, tmp_path: Path) -> None:
    data = json.loads(saved.read_text())
    data["gpufleet_version"] = "0.0.1"
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    done = gpufleet("report", str(old), "-o", str(tmp_path / "out.html"))
    assert done.returncode == 2
    assert f"written by gpufleet 0.0.1; this is {__version__}" in one_error_line(done)


def test_report_refuses_a_missing_file(tmp_path: Path) -> None:
    done = gpufleet("report", str(tmp_path / "nope.json"), "-o", str(tmp_path / "out.html"))
    assert done.returncode == 2 and "does not exist" in one_error_line(done)


def test_unwritable_targets_are_one_line_and_leave_nothing(saved: Path, tmp_path: Path) -> None:
    missing = gpufleet("report", str(saved), "-o", str(tmp_path / "no" / "such" / "r.html"))
    assert missing.returncode == 2 and "does not exist" in one_error_line(missing)
    folder = tmp_path / "taken.html"  # a folder where the file should go: the rename fails
    folder.mkdir()
    (folder / "keep").write_text("mine")
    done = gpufleet("report", str(saved), "-o", str(folder))
    assert done.returncode == 2 and "cannot write there" in one_error_line(done)
    assert (folder / "keep").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.html"]  # no temporary file left behind
    wrong = gpufleet("report", str(saved), "-o", str(tmp_path / "r.png"))
    assert wrong.returncode == 2 and "must end in .html or .htm" in one_error_line(wrong)


def test_plan_html_on_a_sweep_and_report_of_the_sweep(tmp_path: Path) -> None:
    first = tmp_path / "sweep.html"
    done = gpufleet("plan", "-n", "8,16", "--json", "--html", str(first))
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [row["gpus"] for row in data["sweep"]] == [8, 16] and data["html"] == str(first)
    (tmp_path / "sweep.json").write_text(done.stdout)
    second = tmp_path / "again.html"
    assert gpufleet("report", str(tmp_path / "sweep.json"), "-o", str(second)).returncode == 0
    page = second.read_text()
    assert "best searched plan per GPU count" in page
    for row in data["sweep"]:
        assert f"<td>best plan per count</td><td>{row['gpus']}</td>" in page  # each count is a scaling point


def test_validate_html(tmp_path: Path) -> None:
    target = tmp_path / "validate.html"
    done = gpufleet("validate", "--html", str(target), "--json")
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)["runs"]
    page = target.read_text()
    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    assert len(svgs) == page.count("<figcaption>") == 2
    parity = ElementTree.fromstring(svgs[0])
    points = [e for e in parity.iter() if e.tag.endswith(("circle", "rect", "path")) and e.get("stroke") == "#333"]
    predicted = [r for r in runs if r["predicted_tokens_per_s_per_gpu"]]
    parity_figure = re.search(r"<figure id='fig-parity'>.*?</figure>", page, flags=re.S)
    assert parity_figure is not None
    assert parity_figure[0].count("<tr>") - 1 == len(predicted)  # every predicted run in the plot's data table
    assert len(points) >= len(predicted)  # and drawn (plus one legend swatch per source)
    for run in runs:
        assert run["id"] in page  # every run, skipped ones too, in the error table


def test_validate_html_refuses_an_unwritable_path(tmp_path: Path) -> None:
    done = gpufleet("validate", "--html", str(tmp_path / "missing" / "v.html"))
    assert done.returncode == 2 and "does not exist" in one_error_line(done)


def test_report_refuses_a_sweep_it_no_longer_reproduces(tmp_path: Path) -> None:
    done = gpufleet("plan", "-n", "8,16", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    data["sweep"][1]["step_s"] /= 2
    (tmp_path / "sweep.json").write_text(json.dumps(data))
    refused = gpufleet("report", str(tmp_path / "sweep.json"), "-o", str(tmp_path / "x.html"))
    assert refused.returncode == 2 and "no longer gives plan 16:" in one_error_line(refused)
