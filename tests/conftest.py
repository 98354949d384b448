"""Test tiers: every test that needs something beyond this process and the model half carries a marker that says what.

    server     starts a real server: Slurm (munged, slurmctld, slurmd), Prometheus/promtool, an S3 server
    torchrun   starts real torch.distributed processes (torchrun, gloo on CPU)
    browser    drives a real headless Chromium
    framework  loads a training framework's own config code (DeepSpeed, torchtitan, Megatron-LM, PyTorch FSDP)
    slow       more than a few seconds of CPU on its own (exhaustive searches, refits, fuzzing, whole-cluster runs)

`scripts/test --fast` runs the rest (`-m "not (server or torchrun or browser or framework or slow)"`): the model,
the catalog, the emitters and every CLI command in process. `scripts/test` (what CI runs) runs everything.

The markers are assigned here, by module and by test name, so that one table says what each tier holds; a test
file may add its own as well.

Hypothesis runs without deadlines (the `gpufleet` profile below): a property test's examples take what they take on
a loaded 2-core machine, and hypothesis's default 200 ms deadline would fail a correct test there. A test's own
`@settings(...)` that names no deadline inherits the profile's None.
"""

from __future__ import annotations

import pytest
from hypothesis import settings as hypothesis_settings

hypothesis_settings.register_profile("gpufleet", deadline=None)
hypothesis_settings.load_profile("gpufleet")

TIER_MARKERS = ("server", "torchrun", "browser", "framework", "slow")
FAST_TIER = "not (" + " or ".join(TIER_MARKERS) + ")"

#: Module (path under tests/, without .py) -> the markers every test in it carries.
MODULE_MARKERS: dict[str, tuple[str, ...]] = {
    "test_emit_slurm": ("server",),
    "test_report_browser": ("browser",),
    "test_launch_frameworks": ("framework",),
    "test_launch_check_fsdp": ("framework",),
    "test_megatron_lm": ("framework",),
    "test_recompute_early_stop": ("framework",),
    "test_fuzz_cli": ("slow",),
    "runtime/test_bench": ("torchrun",),
    "runtime/test_bench_calibrate": ("torchrun",),
    "runtime/test_bench_host": ("torchrun",),
    "runtime/test_burnin": ("torchrun",),
    "runtime/test_burnin_rdzv": ("torchrun",),
    "runtime/test_burnin_slurm": ("torchrun", "server"),
    "runtime/test_doctor": ("torchrun",),
    "runtime/test_distributed": ("torchrun",),
    "runtime/test_monitor_distributed": ("torchrun",),
    "runtime/test_monitor_prometheus": ("server",),
    "runtime/test_monitor_rules": ("server",),
    "runtime/test_monitor_exporter": ("server",),
    "runtime/test_ckpt_cli": ("server",),
    "runtime/test_upload": ("server",),
    "runtime/test_upload_retry": ("server",),
    "runtime/test_sigkill": ("slow",),
    "runtime/test_damage": ("slow",),
    "runtime/test_crashpoints": ("slow",),
    "runtime/test_store_forgets": ("server",),
}

#: Single tests of otherwise fast modules that take more than a few seconds each (measured with --durations).
SLOW_TESTS = frozenset({
    "test_search_prune.py::test_a_pruned_search_ranks_and_counts_what_the_exhaustive_one_does",
    "test_search_prune.py::test_the_search_answers_what_the_plain_search_it_replaced_answered",
    "test_search_prune.py::test_the_step_floors_never_exceed_the_step",
    "test_search_prune.py::test_one_memory_model_for_all_layouts_gives_each_its_own_numbers",
    "test_plan_model_flags.py::test_the_pruned_search_equals_the_exhaustive_one_with_each_term_on",
    "test_fit.py::test_leave_one_source_out_error_meets_the_issue_targets",
    "test_fit.py::test_a_fold_refits_to_the_same_values_from_any_start",
    "test_fit.py::test_the_recorded_fits_are_what_refitting_the_run_files_gives",
    "test_sites.py::test_the_seeds_two_clusters_end_to_end",
    "test_sites.py::test_the_best_plan_over_two_sites_never_gets_faster_on_a_worse_link",
    "test_sites.py::test_the_table_says_the_plan_is_over_sites",
    "test_intervals.py::test_regression_guard_interval_table_rebuilds_to_the_recorded_numbers",
    "test_docs_validation.py::test_the_docs_regime_and_source_tables_are_what_validate_cross_validate_prints",
    "test_nccl_log.py::test_a_3_gb_sparse_log_is_streamed_in_bounded_memory",
    "test_input_bounds.py::test_megatron_degrees_below_one_are_one_line_not_a_modulo_by_zero",
    "test_input_bounds.py::test_a_5_mb_catalog_of_200k_records_is_refused_quickly",
    "test_input_bounds.py::test_the_node_budget_is_exact",
})


def pytest_configure(config: pytest.Config) -> None:
    for name, meaning in (("server", "starts a real server (Slurm, Prometheus, S3)"),
                          ("torchrun", "starts real torch.distributed processes"),
                          ("browser", "drives a real headless Chromium"),
                          ("framework", "loads a training framework's own config code"),
                          ("stress", "long fault-injection runs; selected only by `-m stress`")):
        config.addinivalue_line("markers", f"{name}: {meaning}")


def _module_key(item: pytest.Item) -> str:
    path = item.path.relative_to(item.config.rootpath / "tests") if item.path.is_relative_to(
        item.config.rootpath / "tests") else item.path
    return str(path.with_suffix(""))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker in MODULE_MARKERS.get(_module_key(item), ()):
            item.add_marker(getattr(pytest.mark, marker))
        name = f"{item.path.name}::{item.originalname if isinstance(item, pytest.Function) else item.name}"
        if name in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
