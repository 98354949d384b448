"""`plan --no-overlap-dp`: the data-parallel collectives run in line after the backward (Megatron-LM without
--overlap-grad-reduce, DeepSpeed without overlap_comm), and `launch` writes the files that run it so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clirun import run_gpufleet
from gpufleet.planner.published_runs import shipped_runs_path

pytestmark = pytest.mark.timeout(300)
JOB = ("-m", "llama3-8b", "-t", "100B", "-n", "16", "--top", "5")


def _plan(*flags: str) -> dict[str, Any]:
    result = run_gpufleet("plan", *JOB, *flags, "--json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_in_line_dp_exposes_exactly_what_overlap_hid() -> None:
    """The same layout both ways: every second the overlapped plan hid under compute is exposed, and nothing else
    moves, so step(in line) = step(overlapped) + comm.dp's hidden seconds, by hand from the overlapped plan (with the
    overlap contention off: on, the in-line plan also stops paying the contention of what it no longer hides)."""
    overlapped, in_line = _plan("--overlap-contention", "off"), _plan("--no-overlap-dp", "--overlap-contention", "off")
    assert overlapped["framework"]["dp_overlap"] is True and in_line["framework"]["dp_overlap"] is False
    after = {plan["layout"]["label"]: plan for plan in in_line["plans"]}
    shared = [plan for plan in overlapped["plans"] if plan["layout"]["label"] in after]
    assert shared, "no layout in both plans"
    for before in shared:
        label = before["layout"]["label"]
        dp_before, dp_after = before["parts"]["comm.dp"], after[label]["parts"]["comm.dp"]
        assert dp_after["hidden_s"] == 0.0
        assert dp_after["exposed_s"] == pytest.approx(dp_before["exposed_s"] + dp_before["hidden_s"], rel=1e-9)
        assert after[label]["step_s"] == pytest.approx(before["step_s"] + dp_before["hidden_s"], rel=1e-9), label
        for name in ("compute.gemm", "compute.attention", "optimizer"):
            assert after[label]["parts"][name] == before["parts"][name]


def test_the_default_is_overlap_and_the_header_says_when_it_is_off() -> None:
    assert _plan("--overlap-dp")["plans"] == _plan()["plans"]
    text = run_gpufleet("plan", *JOB, "--no-overlap-dp")
    assert text.returncode == 0, text.stderr
    assert "data-parallel communication in line" in text.stdout


def test_launch_writes_megatron_without_the_overlap_flags(tmp_path: Path) -> None:
    def args(*flags: str) -> list[str]:
        out = tmp_path / ("in-line" if flags else "default")
        result = run_gpufleet("launch", *JOB[:6], *flags, "--target", "megatron", "--out", str(out), "--json")
        assert result.returncode == 0, result.stderr
        layout = json.loads(result.stdout)["layout"]
        assert layout["dp"] > 1
        return (out / "megatron" / "pretrain_gpt.args").read_text().split()

    assert {"--overlap-grad-reduce", "--overlap-param-gather"} <= set(args())  # zero3: params gathered too
    assert not {"--overlap-grad-reduce", "--overlap-param-gather"} & set(args("--no-overlap-dp"))


def test_a_plan_file_keeps_its_choice_and_refuses_a_second_one(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(_plan("--no-overlap-dp")))
    result = run_gpufleet("launch", "--plan", str(plan_file), "--target", "megatron", "--out", str(tmp_path / "r"))
    assert result.returncode == 0, result.stderr
    assert "--overlap-grad-reduce" not in (tmp_path / "r" / "megatron" / "pretrain_gpt.args").read_text().split()
    mixed = run_gpufleet("launch", "--plan", str(plan_file), "--overlap-dp", "--target", "megatron", "--out",
                         str(tmp_path / "s"))
    assert mixed.returncode == 2 and not (tmp_path / "s").exists()


def test_validate_takes_the_same_switch_under_both_spellings() -> None:
    """validate's older `--no-dp-overlap` and plan's `--no-overlap-dp` are one switch."""
    runs = ("validate", "--runs", str(shipped_runs_path("llama3_fitted.yaml")), "--json")
    spelled = [run_gpufleet(*runs, flag) for flag in ("--no-dp-overlap", "--no-overlap-dp")]
    assert all(result.returncode == 0 for result in spelled), spelled[0].stderr
    assert json.loads(spelled[0].stdout) == json.loads(spelled[1].stdout)
    overlapped = run_gpufleet(*runs)
    assert json.loads(overlapped.stdout) != json.loads(spelled[0].stdout)
