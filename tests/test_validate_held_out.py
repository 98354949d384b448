"""`validate` with no `--runs` also scores the shipped runs held out of every calibration fit (`*_holdout.yaml`): the
out-of-sample check a user gets without asking, computed here a second way (`validate --runs` on those files)."""

from __future__ import annotations

import json
import math
import statistics

from clirun import run_gpufleet
from gpufleet.catalog.judgements import ConstantFit
from gpufleet.catalog.registry import load_catalog
from gpufleet.planner.published_runs import fitted_run_paths, held_out_run_paths, load_runs


def test_the_held_out_files_are_in_no_calibration_fit() -> None:
    held = held_out_run_paths()
    assert [path.name for path in held] == ["dp_scaling_holdout.yaml", "megatron_bridge_2604_holdout.yaml",
                                            "torchao_float8_holdout.yaml"]
    assert not set(held) & set(fitted_run_paths())
    held_ids = {run.id for path in held for run in load_runs(path)}
    assert len(held_ids) == 49
    for fit in load_catalog().fits():
        assert not held_ids & set(fit.chosen_on), fit.id


def test_validate_scores_the_held_out_runs_as_validate_runs_does() -> None:
    default = run_gpufleet("validate", "--json")
    assert default.returncode == 0, default.stderr
    held = json.loads(default.stdout)["held_out"]
    args = [arg for path in held_out_run_paths() for arg in ("--runs", str(path))]
    direct = json.loads(run_gpufleet("validate", "--json", *args).stdout)
    assert held["files"] == [path.name for path in held_out_run_paths()]
    # the runs a constant fit was chosen on (the FP8 amax spread's DGX Cloud series) are named and not scored
    chosen = {run_id for record in load_catalog().records("constant_fits").values()
              if isinstance(record, ConstantFit) for run_id in record.chosen_on}
    assert set(held["left_out_chosen_on"]) == chosen & {run["id"] for run in direct["runs"]}
    assert len(held["left_out_chosen_on"]) == 12
    kept = [run for run in direct["runs"] if run["id"] not in chosen and run["error"] is not None]
    assert held["summary"]["all"]["runs"] == len(kept) == 37
    assert math.isclose(held["summary"]["all"]["median_abs_error"], statistics.median(abs(r["error"]) for r in kept))
    # the interval count, recounted from the direct run's own predictions and intervals
    scored = [run for run in kept if run["predicted_tokens_per_s_per_gpu"] and run["interval"]]
    inside = sum(run["interval"]["low"] <= run["target_tokens_per_s_per_gpu"] <= run["interval"]["high"]
                 for run in scored)
    assert (held["interval"]["runs"], held["interval"]["inside"]) == (len(scored), inside)
    assert math.isclose(held["interval"]["coverage"], inside / len(scored))
    # the fitted runs are not mixed in: the default summary is the fitted files' own
    assert json.loads(default.stdout)["summary"]["all"]["runs"] == 126
    text = " ".join(run_gpufleet("validate").stdout.split())
    median = held["summary"]["all"]["median_abs_error"]
    assert (f"{held['summary']['all']['runs']} runs (12 more that a constant fit was chosen on are not scored here), "
            f"median |error| {median:.1%}") in text
    # naming runs (or a --node for them) scores only what was named
    assert "held_out" not in direct
