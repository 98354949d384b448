"""Versioned stacks (catalog/stacks.py resolve_stack, planner/stack_versions.py): a stack id names a framework at a
release range; a release picks its range; a bare framework name gets the conservative settings and says so; and
naming the version moves a prediction toward the measurement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clirun import run_gpufleet
from gpufleet.catalog.registry import load_catalog
from gpufleet.catalog.stacks import StackRecord, release_key
from gpufleet.errors import UnknownNameError
from gpufleet.planner.published_runs import fitted_run_paths, load_runs
from gpufleet.planner.stack_versions import compare_versions, is_versioned, version_table
from gpufleet.planner.validate import predict_run


def _stacks() -> dict[str, StackRecord]:
    return {key: record for key, record in load_catalog().records("stacks").items()
            if isinstance(record, StackRecord)}


def test_a_release_picks_the_range_that_holds_it_and_a_bare_name_the_conservative_settings() -> None:
    catalog = load_catalog()
    assert catalog.stack("nemo@24.12").id == "nemo@24.x"  # the 24.12 performance summary's runs
    assert catalog.stack("nemo@24.11").id == "nemo@24.x"  # DGX Cloud's 24.11 Nemotron recipe
    assert catalog.stack("nemo@25.04").id == "nemo@25.x"
    assert catalog.stack("megatron-bridge@25.09").id == "megatron-bridge@25.09"
    assert catalog.stack("megatron-bridge@26.02").id == "megatron-bridge@25.11-26.02"
    bare = catalog.stack_choice("nemo")
    assert bare.assumed and bare.record.id == "nemo"
    assert "nemo named without a version: the conservative settings assumed" in bare.said
    assert "releases 24.01–25.09" in bare.said
    bridge = catalog.stack_choice("megatron-bridge")
    assert bridge.assumed and bridge.record.id == "megatron-bridge@25.11-26.02"
    versioned = catalog.stack_choice("nemo@24.12")
    assert not versioned.assumed
    assert versioned.said == "nemo@24.x (releases 24.01–24.12; the range that holds nemo@24.12)"
    assert not catalog.stack_choice("deepseek-v3").assumed  # a single-range stack: nothing assumed
    titan = catalog.stack_choice("torchtitan")  # current torchtitan, whose full recompute re-runs every GEMM
    assert titan.assumed and titan.record.value("recompute_early_stop") is None
    assert catalog.stack("torchtitan@0.1").value("recompute_early_stop") == "aten-or-compiled"
    assert catalog.stack("llm-foundry@0.3").id == "llm-foundry"  # the A100 tables: PyTorch 1.13, no early stop
    assert catalog.stack("llm-foundry@0.5").value("recompute_early_stop") == "aten"
    for unknown in ("nemo@23.05", "nemo@latest", "nemo@26.02"):  # no range holds it: one line naming the ranges
        with pytest.raises(UnknownNameError, match=r"nemo@24\.x"):
            catalog.stack(unknown)


def test_release_numbers_order_as_releases() -> None:
    assert release_key("24.12") < release_key("25.02") < release_key("25.11") < release_key("26.02")
    assert release_key("0.9") < release_key("0.10")  # numerically, not as text


def test_each_family_has_one_conservative_record_and_its_ranges_do_not_overlap() -> None:
    families: dict[str, list[StackRecord]] = {}
    for record in _stacks().values():
        if "@" in record.id:
            assert record.family == record.id.split("@")[0] and record.releases is not None, record.id
        if record.family is not None:
            families.setdefault(record.family, []).append(record)
    for family, members in families.items():
        assert sum(member.conservative for member in members) == 1, family
        ranges = sorted((release_key(m.releases.first), release_key(m.releases.last)) for m in members
                        if m.releases is not None and not m.conservative)
        assert all(first <= last for first, last in ranges)
        assert all(ranges[i][1] < ranges[i + 1][0] for i in range(len(ranges) - 1)), family
    for record in _stacks().values():  # every setting of a versioned record has its source
        for name in record.stated():
            assert len(getattr(record.settings, name).source) > 10, (record.id, name)


def test_the_conservative_settings_never_predict_faster_than_a_release_of_the_family() -> None:
    # Behaviour, not accuracy: on each of the family's runs, the bare name's prediction is at most any of its
    # versioned ranges' (nemo: fp32 gradient reduction and TP communication in line; Megatron-Bridge 25.11 on:
    # dropless routing, where 25.09 dropped tokens).
    catalog = load_catalog()
    runs = [run for path in fitted_run_paths() for run in load_runs(path) if is_versioned(run)]
    for run in runs:
        family = catalog.stack(run.stack or "").family
        ranges = [r.id for r in _stacks().values() if r.family == family and not r.conservative]
        bare = predict_run(run.model_copy(update={"stack": family}), catalog).predicted_tokens_per_s_per_gpu
        for stack_id in ranges:
            versioned = predict_run(run.model_copy(update={"stack": stack_id}), catalog)
            assert bare is not None and versioned.predicted_tokens_per_s_per_gpu is not None
            assert bare <= versioned.predicted_tokens_per_s_per_gpu * (1 + 1e-9), (run.id, stack_id)


def test_naming_the_version_moves_the_prediction_toward_the_measurement() -> None:
    # Issue 32: the same 2024 NeMo run was +16 % with no stack and +56 % with `stack: nemo`, whose settings came
    # from 2025 scripts. Over every run that names its release (in-sample, the recorded fits: what `plan` prices
    # with), the versioned stack's median |error| is at most the bare name's and no stack's, for each range, each
    # family and all; and no run is put 35 points further from its measurement than the nearer of the other two.
    runs = [run for path in fitted_run_paths() for run in load_runs(path)]
    rows = compare_versions(runs, load_catalog())
    assert len(rows) == sum(is_versioned(run) for run in runs) == 87
    table = {row.label: row for row in version_table(rows)}
    # The exception, shown in docs/validation.md's table: the four llm-foundry rows outside the 0.4-0.21 range (its
    # A100 rows) are nearer with no stack (4.6 % against 3.2 %): gpufleet's default FA2-class attention is faster
    # than the family's FlashAttention-1 and those rows are under-predicted. (Before the MoE routing change's refit
    # of the cuDNN attention fit, llm-foundry@0.4-0.21 and nemo@25.x were exceptions too; they no longer are.)
    near_default = {"llm-foundry"}
    for label, row in table.items():
        assert row.worst_move_away < 0.35, label
        assert row.versioned <= row.bare, label
        if label not in near_default:
            assert row.versioned <= row.default, label
    # the 2024 NeMo runs (24.11 and 24.12): the 24.x performance settings against the defaults a bare name gets and
    # no stack (17.5 % and 17.3 %, within a point of each other)
    nemo_2024 = table["nemo@24.x"]
    assert nemo_2024.runs == 9 and nemo_2024.versioned < min(nemo_2024.bare, nemo_2024.default) - 0.1


def test_a_run_naming_a_bare_framework_gets_the_conservative_settings_and_says_so() -> None:
    catalog = load_catalog()
    run = next(r for r in load_runs(fitted_run_paths()[0].parent / "nemo_2412_fitted.yaml")
               if r.id == "nemo2412-llama2-70b-64gpu")
    assert run.stack == "nemo@24.12"  # the release the performance summary states
    versioned = predict_run(run, catalog)
    assert versioned.stack == "nemo@24.x" and not versioned.stack_version_assumed
    assert "stack: nemo@24.x (from nemo@24.12)" in versioned.note
    bare = predict_run(run.model_copy(update={"stack": "nemo"}), catalog)
    assert bare.stack == "nemo" and bare.stack_version_assumed and bare.family == "nemo"
    assert "nemo named without a version: the conservative settings assumed" in bare.note
    assert bare.as_dict()["stack_version_assumed"] is True


def test_plan_with_a_bare_stack_says_which_range_it_assumed() -> None:
    args = ("plan", "-m", "llama3-8b", "-n", "8", "--top", "1")
    text = run_gpufleet(*args, "--stack", "nemo")
    assert text.returncode == 0, text.stderr
    assert "nemo named without a version: the conservative settings assumed" in " ".join(text.stdout.split())
    framework = json.loads(run_gpufleet(*args, "--stack", "nemo", "--json").stdout)["framework"]
    assert framework["stack"] == "nemo" and framework["stack_record"] == "nemo" and framework["stack_version_assumed"]
    assert framework["grad_dtype"] == "fp32" and not framework["tp_comm_overlap"]
    release = json.loads(run_gpufleet(*args, "--stack", "nemo@25.04", "--json").stdout)["framework"]
    assert release["stack_record"] == "nemo@25.x" and not release["stack_version_assumed"]
    assert release["grad_dtype"] == "bf16" and release["tp_comm_overlap"]
    unknown = run_gpufleet(*args, "--stack", "nemo@23.01")
    assert unknown.returncode == 2 and "unknown stack 'nemo@23.01'" in unknown.stderr
    assert "Traceback" not in unknown.stderr


def test_validate_lists_the_runs_that_name_a_framework_without_a_version(tmp_path: Path) -> None:
    path = fitted_run_paths()[0].parent / "nemo_2412_fitted.yaml"
    text = path.read_text(encoding="utf-8").replace("stack: nemo@24.12", "stack: nemo", 1)
    runs = tmp_path / "bare.yaml"
    runs.write_text(text, encoding="utf-8")
    done = run_gpufleet("validate", "--runs", str(runs))
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())
    assert "1 run(s) name a framework without a version, so got its conservative settings" in said
    assert "nemo2412-gpt3-175b-128gpu" in said.split("without a version")[1]
