"""StepMonitor's arithmetic against the plan, straggler scoring, and the hang watchdog, in one process."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.errors import InputError
from gpufleet.runtime.monitor.exporter import scrape
from gpufleet.runtime.monitor.plan_target import PlanFileError, PlanTarget
from gpufleet.runtime.monitor.step_monitor import StepMonitor
from gpufleet.runtime.monitor.straggler import RankStats, describe, score_ranks
from gpufleet.runtime.monitor.watchdog import HangWatchdog

PLAN = {"plans": [{"step_s": 2.0, "tokens_per_s_per_gpu": 8000.0, "mfu": 0.4},
                  {"step_s": 3.0, "tokens_per_s_per_gpu": 5000.0, "mfu": 0.3}]}


def gauge(monitor: StepMonitor, name: str) -> float:
    for family in text_string_to_metric_families(scrape(monitor.registry)):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(name)


def test_plan_json_from_gpufleet_plan_is_read_as_plain_json(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PLAN))
    assert PlanTarget.from_file(path) == PlanTarget(2.0, 8000.0, 0.4)
    assert PlanTarget.from_file(path, 1).step_s == 3.0
    with pytest.raises(PlanFileError, match="index must be in"):
        PlanTarget.from_file(path, 2)
    with pytest.raises(PlanFileError, match=r"the plan file .* does not exist"):
        PlanTarget.from_file(tmp_path / "missing.json")
    with pytest.raises(PlanFileError, match="no plans"):
        PlanTarget.from_json({"plans": []})


def test_running_slower_than_plan_reads_as_a_fraction_of_plan(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PLAN))
    monitor = StepMonitor(plan=path, window=4, straggler_every=4, rank=0, world_size=1)
    # steps of 2.5 s processing 16000 tokens: 6400 tokens/s against a plan of 2.0 s and 8000 tokens/s
    for step_s in (2.4, 2.5, 2.6, 2.5):
        monitor.record_step(step_s, tokens=16_000)
    summary = monitor.summary()
    assert summary.step_s == pytest.approx(2.5)
    assert summary.plan_ratio == pytest.approx(2.0 / 2.5)  # 0.8 of plan
    assert summary.tokens_per_s == pytest.approx(64_000 / 10.0)
    assert summary.mfu == pytest.approx(0.4 * 6400 / 8000)  # MFU scales with throughput on the same model and GPU
    assert "running at 0.80 of plan" in summary.line()
    assert gauge(monitor, "gpufleet_train_plan_ratio") == pytest.approx(0.8)
    assert gauge(monitor, "gpufleet_train_steps_total") == 4
    assert gauge(monitor, "gpufleet_train_tokens_total") == 64_000
    assert gauge(monitor, "gpufleet_train_plan_step_seconds") == 2.0


def test_mfu_from_flops_per_token_and_peak() -> None:
    monitor = StepMonitor(flops_per_token=6 * 8e9, peak_flops_per_s=989e12, rank=0, world_size=1)
    monitor.record_step(1.0, tokens=10_000)
    assert monitor.summary().mfu == pytest.approx(10_000 * 6 * 8e9 / 989e12)
    assert monitor.summary().plan_ratio is None


def test_the_context_managers_time_data_wait_compute_and_checkpoint_stall() -> None:
    monitor = StepMonitor(rank=0, world_size=1)
    with monitor.data_wait():
        time.sleep(0.01)
    with monitor.step(tokens=5), monitor.compute():
        time.sleep(0.02)
    with monitor.checkpoint():
        time.sleep(0.01)
    summary = monitor.summary()
    assert summary.compute_s is not None and summary.step_s >= summary.compute_s >= 0.02
    assert gauge(monitor, "gpufleet_train_data_wait_seconds_total") >= 0.01
    assert gauge(monitor, "gpufleet_train_checkpoint_stall_seconds_total") >= 0.01
    assert gauge(monitor, "gpufleet_train_last_checkpoint_timestamp_seconds") > 1.6e9
    with pytest.raises(ZeroDivisionError), monitor.step():
        raise ZeroDivisionError  # a step that raises is not counted
    assert monitor.steps == 1


def test_every_series_names_its_rank_and_gpu_for_joins() -> None:
    monitor = StepMonitor(rank=3, local_rank=1, world_size=8, gpu_index=5)
    labels = [s.labels for f in text_string_to_metric_families(scrape(monitor.registry)) for s in f.samples]
    assert labels and all(lab["rank"] == "3" and lab["local_rank"] == "1" and lab["gpu"] == "5" for lab in labels)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"hang_timeout_s": 0}, "hang timeout must be a positive"),
    ({"hang_timeout_s": -1.0}, "hang timeout must be a positive"),
    ({"straggler_every": 0}, "straggler_every must be"),
    ({"straggler_threshold": 1.5}, "threshold must be between 0 and 1"),
    ({"rank": 4, "world_size": 4}, "rank must be in [0, 3]"),
])
def test_bad_settings_are_refused(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(InputError, match=words.replace("[", r"\[").replace("]", r"\]")):
        StepMonitor(**kwargs)  # type: ignore[arg-type]


def test_a_rank_twice_as_slow_as_the_median_scores_one_half_and_is_named() -> None:
    stats = [RankStats(0, 0.10), RankStats(1, 0.10), RankStats(2, 0.20, gpu_slowed=True), RankStats(3, 0.11)]
    report = score_ranks(stats)
    # median of (0.10, 0.10, 0.11, 0.20) = 0.105
    assert report.median_s == pytest.approx(0.105)
    assert report.scores[2] == pytest.approx(0.105 / 0.20)
    assert report.stragglers == (2,)
    (line,) = describe(report, ["a", "b", "node-c", "d"])
    assert line.startswith("straggler: rank 2 on node-c") and "throttling" in line


def test_the_threshold_is_nvidia_resiliency_extensions_default() -> None:
    # just above 1/0.75 = 1.333x the median is a straggler, just below is not
    assert score_ranks([RankStats(0, 1.0), RankStats(1, 1.0), RankStats(2, 1.34)]).stragglers == (2,)
    assert score_ranks([RankStats(0, 1.0), RankStats(1, 1.0), RankStats(2, 1.33)]).stragglers == ()


@given(st.lists(st.floats(0.001, 100.0), min_size=1, max_size=64), st.floats(0.01, 100.0))
def test_scores_do_not_depend_on_the_unit_of_time(times: list[float], scale: float) -> None:
    plain = score_ranks([RankStats(i, t) for i, t in enumerate(times)])
    scaled = score_ranks([RankStats(i, t * scale) for i, t in enumerate(times)])
    assert scaled.stragglers == plain.stragglers
    assert scaled.scores == pytest.approx(plain.scores)
    # at most half the ranks can be below the median
    assert len(plain.stragglers) <= len(times) // 2


def test_the_watchdog_dumps_stacks_without_the_environment_and_sets_the_metric(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_TEST_SECRET", "hunter2")
    monitor = StepMonitor(rank=0, world_size=1, hang_timeout_s=0.5, stack_dir=tmp_path)
    monitor.record_step(0.01)  # armed by progress
    started = time.monotonic()
    assert monitor.watchdog is not None
    while monitor.watchdog.report is None and time.monotonic() - started < 10:
        time.sleep(0.05)
    report = monitor.watchdog.report
    assert report is not None and report.seconds_without_progress >= 0.5
    text = report.stack_file.read_text()
    assert "seconds_without_progress" in text and "test_the_watchdog_dumps" in text
    assert "hunter2" not in text and "GPUFLEET_TEST_SECRET" not in text
    assert gauge(monitor, "gpufleet_train_hang") == 1
    monitor.close()


def test_the_watchdog_stays_quiet_while_beaten_or_paused(tmp_path: Path) -> None:
    watchdog = HangWatchdog(0.3, tmp_path)
    watchdog.beat()
    for _ in range(10):
        time.sleep(0.1)
        watchdog.beat()
    watchdog.pause()
    time.sleep(0.6)
    assert watchdog.report is None and not list(tmp_path.iterdir())
    watchdog.stop()
