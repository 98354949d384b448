"""docs/moe.md, "Routing sets the copies a deduplicating dispatcher sends": its table against the model as shipped
(after) and the same model with the copies counted uniformly and the cuDNN fit at its former 0.74 (before), and
its leave-one-source-out figures against `gpufleet validate --cross-validate` (slow tier)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

import gpufleet.perf.layer_comm as layer_comm
from gpufleet.catalog.records import MoESpec
from gpufleet.catalog.registry import load_catalog
from gpufleet.perf.moe_routing import uniform_destinations
from gpufleet.planner.published_runs import PublishedRun, fitted_run_paths, load_runs
from gpufleet.planner.validate import predict_run
from test_docs_live import command_json, doc_section
from test_docs_live_more import table_row

SECTION = "## Routing sets the copies a deduplicating dispatcher sends"
ROWS = {"AutoModel Qwen3-30B-A3B, 8 H100": "automodel-h100-qwen3-30b-a3b-8gpu",
        "AutoModel DeepSeek-V3, 256 H100": "automodel-h100-deepseek-v3-256gpu",
        "AutoModel DeepSeek-V3, 1,024 H100": "automodel-h100-deepseek-v3-1024gpu",
        "DeepSeek-V3, 2,048 H800 (its own run)": "deepseek-v3-2048xh800",
        "Megatron-Bridge DeepSeek-V3, 256 GB200": "mbridge-2602-gb200-deepseek-v3-256gpu"}


def _section() -> str:
    return doc_section("docs/moe.md", SECTION)


def _signed(error: float) -> str:
    return f"{error * 100:+.1f} %".replace("-", "−")


def _copies(link: str) -> str:
    found = re.search(r"\(([0-9.]+) of [0-9]+ copies\)", link)
    return found.group(1) if found else ""


@pytest.fixture
def uniform_copies(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The model before the change: every gate's top-k falls uniformly on the experts."""
    monkeypatch.setattr(layer_comm, "token_destinations",
                        lambda moe, destinations, routing: uniform_destinations(moe.experts, moe.top_k, destinations))
    yield


def _runs() -> dict[str, PublishedRun]:
    return {run.id: run for path in fitted_run_paths() for run in load_runs(path)}


def test_after_column_and_copies_are_the_shipped_model() -> None:
    catalog, runs, text = load_catalog(), _runs(), _section()
    for label, run_id in ROWS.items():
        predicted = predict_run(runs[run_id], catalog)
        assert predicted.error is not None and predicted.step is not None
        row = table_row(text, label)
        assert row[3] == _signed(predicted.error), (label, row)
        assert row[4].split(" → ")[1].startswith(_copies(predicted.step.parts["comm.ep"].link)), (label, row)
        assert row[1] == f"{runs[run_id].target.tokens_per_s_per_gpu:,.0f}", (label, row)


def test_before_column_is_the_uniform_count_at_the_former_cudnn_fit(uniform_copies: None) -> None:
    catalog, runs, text = load_catalog(), _runs(), _section()
    for label, run_id in ROWS.items():
        predicted = predict_run(runs[run_id], catalog, fitted={"hopper-cudnn-attention-fraction": 0.74})
        assert predicted.error is not None and predicted.step is not None
        row = table_row(text, label)
        assert row[2] == _signed(predicted.error), (label, row)
        assert row[4].startswith(_copies(predicted.step.parts["comm.ep"].link)), (label, row)


def test_the_recorded_cudnn_fit_is_the_one_quoted() -> None:
    text = " ".join(_section().split())
    fitted = load_catalog().calibration("h100-sxm").cudnn_attention_fraction
    assert f"from 0.74 to {fitted:g}" in text


def test_deepseek_v3_router_counts_quoted() -> None:
    text = " ".join(_section().split())
    deepseek = load_catalog().model("deepseek-v3").moe
    assert isinstance(deepseek, MoESpec)
    nodes = layer_comm.token_destinations(deepseek, 8, "learned")
    gpus = layer_comm.token_destinations(deepseek, 64, "learned")
    assert f"{nodes:.1f} copies instead of {uniform_destinations(256, 8, 8):.1f}" in text
    assert f"{gpus:.1f} instead of {uniform_destinations(256, 8, 64):.1f}" in text


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_leave_one_source_out_figures() -> None:
    text = " ".join(_section().split())
    folds = command_json("validate", "--cross-validate")["cross_validated"]
    moe, everything, dense = (folds["moe"]["median_abs_error"], folds["median_abs_error"],
                              folds["dense"]["median_abs_error"])
    assert f"MoE leave-one-source-out median 15.4 → {moe * 100:.1f} %" in text
    assert f"all runs 5.6 → {everything * 100:.1f} %" in text
    assert f"dense 5.2 → {dense * 100:.1f} %" in text
