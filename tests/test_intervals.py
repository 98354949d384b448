"""80 % prediction intervals (planner/intervals.py): regimes, the conformal quantile, sparse regimes borrowing their
parent's band, nested leave-one-source-out coverage, the recorded table (catalog intervals:) and validate's output."""

from __future__ import annotations

import json
import math

import pytest

from clirun import run_gpufleet
from gpufleet.catalog.records import MoESpec
from gpufleet.catalog.registry import load_catalog
from gpufleet.parallel.layout import Layout
from gpufleet.planner.intervals import (
    MIN_RUNS,
    Interval,
    IntervalTable,
    Regime,
    Residual,
    classify_regime,
    conformal_quantile,
    coverage,
    interval_record_data,
    residuals_from_record,
    step_interval,
)
from gpufleet.planner.published_runs import fitted_run_paths, load_runs, shipped_runs_path
from gpufleet.workload.job import Job

RUNS = shipped_runs_path().parent


def _dense_model():  # type: ignore[no-untyped-def]
    return load_catalog().model("llama3-8b")


def test_classify_regime_moe_then_fp8_then_model_parallel_across_nodes_else_data_parallel() -> None:
    dense = _dense_model()
    moe = dense.model_copy(update={"moe": MoESpec(experts=8, top_k=2, expert_ffn_hidden=1024)})
    tp8 = Layout(tp=8, pp=2, dp=4)
    assert classify_regime(moe, tp8, "fp8", 64) is Regime.MOE
    assert classify_regime(dense, tp8, "fp8", 64) is Regime.FP8
    assert classify_regime(dense, tp8, "bf16", 64) is Regime.MODEL_PARALLEL
    assert classify_regime(dense, Layout(tp=8, dp=1), "bf16", 8) is Regime.DENSE_DP  # inside one node
    assert classify_regime(dense, Layout(dp=64), "bf16", 64) is Regime.DENSE_DP


def test_conformal_quantile_is_the_finite_sample_corrected_rank() -> None:
    assert conformal_quantile([0.1, 0.2, 0.3]) is None  # ⌈4 × 0.8⌉ = 4 > 3: too few for an 80 % band
    assert conformal_quantile([0.4, 0.1, 0.3, 0.2]) == 0.4  # ⌈5 × 0.8⌉ = 4: the largest of 4
    scores = [i / 100 for i in range(1, 20)]  # 19 scores: ⌈20 × 0.8⌉ = 16th smallest, not the plain 80 % (15.2)
    assert conformal_quantile(scores) == 0.16
    assert conformal_quantile([i / 10 for i in range(1, 10)]) == 0.8  # 9: ⌈10 × 0.8⌉ = 8th


def _residuals(regime: Regime, errors: list[float], family: str = "f") -> list[Residual]:
    return [Residual(f"{regime.value}-{i}", family, regime, error) for i, error in enumerate(errors)]


def test_a_sparse_regime_borrows_its_parents_band_widened_to_its_own_reach_and_says_so() -> None:
    dense = _residuals(Regime.DENSE_DP, [0.01 * i for i in range(1, 21)])  # 20 runs: its own band
    fp8 = _residuals(Regime.FP8, [0.5, -0.05, 0.02])  # 3 runs: too few for a quantile of its own
    mp = _residuals(Regime.MODEL_PARALLEL, [0.01, 0.02])
    table = IntervalTable.from_residuals([*dense, *fp8, *mp])
    own = table.bands[Regime.DENSE_DP]
    assert not own.widened and own.runs == 20 and own.quantile_log == pytest.approx(0.17)  # ⌈21 × 0.8⌉ = 17th
    dense_band = table.bands[Regime.DENSE]
    assert dense_band.runs == 25 and not dense_band.widened
    wide = table.bands[Regime.FP8]
    assert wide.widened and wide.runs == 3 and wide.quantile_log == 0.5  # its own largest residual reaches further
    assert "fewer than 10" in wide.note and "widened" in wide.note
    narrow = table.bands[Regime.MODEL_PARALLEL]
    assert narrow.widened and narrow.quantile_log == dense_band.quantile_log  # the parent's band, unwidened
    moe = table.bands[Regime.MOE]  # no runs at all: the root's band
    assert moe.widened and moe.runs == 0 and moe.quantile_log == table.bands[Regime.ALL].quantile_log


def test_interval_is_symmetric_in_log_and_maps_to_tokens_time_and_cost() -> None:
    table = IntervalTable.from_residuals(_residuals(Regime.DENSE_DP, [0.01 * i for i in range(1, 21)]))
    job = Job(model=_dense_model(), tokens=1e12, seq_len=8192, global_batch=512)
    step = step_interval(job, Layout(dp=64), 64, 4.0, table)
    factor = math.exp(0.17)
    assert step.regime == "dense-dp" and step.level == 0.8 and not step.widened
    assert step.low == pytest.approx(4.0 / factor) and step.high == pytest.approx(4.0 * factor)
    tokens_per_gpu_per_step = 512 * 8192 / 64
    tokens = step.inverted(tokens_per_gpu_per_step)  # tokens/s per GPU: the inverse of step time
    assert tokens.low == pytest.approx(tokens_per_gpu_per_step / step.high)
    assert tokens.high == pytest.approx(tokens_per_gpu_per_step / step.low)
    days = step.scaled(1e5 / 86400)  # time to train: steps × step time
    assert days.low == pytest.approx(step.low * 1e5 / 86400)
    assert step.half_width(4.0) == pytest.approx(math.sinh(0.17))
    assert step.as_json()["level"] == 0.8 and set(step.as_json()) >= {"level", "low", "high"}
    assert Interval.model_validate(step.as_json()) == step
    assert step.text(".2g") == f"({4.0 / factor:.2g}–{4.0 * factor:.2g})"


def test_coverage_scores_each_family_with_bands_from_the_others_only() -> None:
    # family a: 12 runs at 0.01; family b: 12 runs at 0.30. Left out, each is judged by the other's band.
    a = [Residual(f"a{i}", "a", Regime.DENSE_DP, 0.01) for i in range(12)]
    b = [Residual(f"b{i}", "b", Regime.DENSE_DP, -0.30) for i in range(12)]
    result = coverage([*a, *b])
    assert result["dense-dp"].runs == 24
    assert result["dense-dp"].inside == 12  # a's runs inside b's wide band; b's outside a's narrow one
    assert result["all"].coverage == 0.5
    assert result["dense-dp"].median_half_width == pytest.approx((math.sinh(0.01) + math.sinh(0.30)) / 2)
    assert result["moe"].runs == 0 and result["moe"].coverage is None


def test_recorded_bands_follow_from_the_recorded_residuals() -> None:
    """The catalog's table holds what its residuals give (a hand edit of a band or a residual fails here)."""
    record = load_catalog().interval_table()
    assert record.level == 0.8 and record.min_runs == MIN_RUNS
    rebuilt = interval_record_data(residuals_from_record(record), record.run_files, record.built)
    assert rebuilt["regimes"] == {name: band.model_dump() for name, band in record.regimes.items()}
    fitted = {run.id for path in fitted_run_paths() for run in load_runs(path)}
    assert {r.id for r in record.residuals} <= fitted
    assert record.run_files == tuple(str(path.relative_to(RUNS.parent.parent.parent)) for path in fitted_run_paths())


@pytest.mark.timeout(600)
def test_regression_guard_interval_table_rebuilds_to_the_recorded_numbers() -> None:
    """Rebuilding the table (scripts/build_intervals.py: cross-validate the fitted files, about a minute) gives the
    recorded residuals and bands: a model change that moves them must rebuild the table."""
    from gpufleet.planner.fit import cross_validate
    from gpufleet.planner.validate import predict_run

    catalog = load_catalog()
    record = catalog.interval_table()
    runs = [run for path in fitted_run_paths() for run in load_runs(path)]
    residuals = cross_validate(runs, [predict_run(run, catalog) for run in runs], catalog).residuals()
    rebuilt = interval_record_data(residuals, record.run_files, record.built)
    recorded = {r.id: r for r in record.residuals}
    assert [r["id"] for r in rebuilt["residuals"]] == list(recorded)
    for row in rebuilt["residuals"]:
        assert (row["family"], row["regime"]) == (recorded[row["id"]].family, recorded[row["id"]].regime), row["id"]
        assert row["log_error"] == pytest.approx(recorded[row["id"]].log_error, abs=2e-6), row["id"]
    for name, band in record.regimes.items():
        assert rebuilt["regimes"][name]["quantile_log"] == pytest.approx(band.quantile_log, abs=2e-6), name
        assert rebuilt["regimes"][name]["runs"] == band.runs


def test_validate_gives_each_run_its_interval_in_tokens_per_s_per_gpu() -> None:
    done = run_gpufleet("validate", "--runs", str(RUNS / "llama3_fitted.yaml"), "--json")
    assert done.returncode == 0, done.stderr
    record = load_catalog().interval_table()
    for run in json.loads(done.stdout)["runs"]:
        interval, predicted = run["interval"], run["predicted_tokens_per_s_per_gpu"]
        assert interval["level"] == 0.8 and run["regime"] == "model-parallel" and run["family"] == "llama3-meta"
        factor = math.exp(record.regimes["model-parallel"].quantile_log)
        assert interval["low"] == pytest.approx(predicted / factor) and interval["high"] == pytest.approx(
            predicted * factor)
    text = run_gpufleet("validate", "--runs", str(RUNS / "llama3_fitted.yaml"))
    row = next(line for line in text.stdout.splitlines() if "llama3-405b-8192xh100-8k" in line)
    # a regression guard: predicted (low–high), from the recorded band; 144 (124–166) since pipeline sends overlap
    # compute
    assert "144 (124–166)" in row


@pytest.mark.timeout(300)
def test_validate_cross_validate_reports_interval_coverage_by_regime() -> None:
    done = run_gpufleet("validate", "--runs", str(RUNS / "llama3_fitted.yaml"), "--runs",
                        str(RUNS / "nemo_2412_fitted.yaml"), "--cross-validate", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    regimes = data["cross_validated"]["regimes"]
    assert set(regimes) == {"dense-dp", "model-parallel", "fp8", "moe", "dense", "all"}
    everything = regimes["all"]
    assert everything["cross_validated"]["runs"] == everything["interval"]["runs"] == 10
    assert everything["in_sample"]["runs"] == 10
    assert regimes["fp8"]["interval"]["runs"] == 8 and regimes["model-parallel"]["interval"]["runs"] == 2
    residuals = [Residual(r["id"], r["family"], Regime(r["regime"]), r["log_error"])
                 for r in data["cross_validated"]["residuals"]]
    assert {r.family for r in residuals} == set(data["cross_validated"]["by_source"])
    for name, row in coverage(residuals).items():  # the summary's coverage is the nested folds' over its residuals
        assert regimes[name]["interval"] == row.as_dict()
    assert 0 <= everything["interval"]["coverage"] <= 1 and everything["interval"]["median_half_width"] > 0


def test_validate_with_no_runs_scores_every_fitted_file_and_names_vtrains_command() -> None:
    done = run_gpufleet("validate", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    fitted = [run.id for path in fitted_run_paths() for run in load_runs(path)]
    assert [run["id"] for run in data["runs"]] == fitted
    assert {path.name for path in fitted_run_paths()} >= {"published_runs.yaml", "megatron_bridge_fitted.yaml"}
    predicted = [run for run in data["runs"] if run["status"] == "ok"]
    assert {run["regime"] for run in predicted} == {"dense-dp", "model-parallel", "fp8", "moe"}
    assert all(run["interval"]["low"] < run["predicted_tokens_per_s_per_gpu"] < run["interval"]["high"]
               for run in predicted)
    assert {run["family"] for run in data["runs"]} >= {"megatron-bridge", "nemo", "torchtitan", "llm-foundry"}
    assert "vtrain_runs.yaml" in data["validated_apart"]["vtrain"]
    assert not any("vtrain" in run_id for run_id in fitted)
