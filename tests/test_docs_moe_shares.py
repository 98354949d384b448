"""docs/residuals.md, "## MoE": the EP and host shares of each MoE run group are the exposed `comm.ep` and `host.moe`
parts of the runs' predicted steps (what `plan --explain` shows), with the recorded fits."""

from __future__ import annotations

from collections import defaultdict

from gpufleet.catalog.registry import load_catalog
from gpufleet.planner.published_runs import fitted_run_paths, load_runs
from gpufleet.planner.validate import predict_run
from test_docs_live import doc
from test_docs_live_more import table_row

#: the table's first cell -> the run-id fragment of its group
GROUPS = {"Qwen3-30B-A3B (128 experts, top-8, ep 8)": "qwen3-30b-a3b",
          "Qwen3-235B-A22B (ep 8 / 32)": "qwen3-235b-a22b",
          "DeepSeek-V3 (256 experts, ep 64)": "deepseek-v3",
          "Mixtral 8x7B (ep 8, one expert per GPU)": "mixtral-8x7b"}


def _span(values: list[float]) -> str:
    low, high = round(100 * min(values)), round(100 * max(values))
    return f"{low} %" if low == high else f"{low}–{high} %"


def test_ep_and_host_shares_are_the_predicted_parts() -> None:
    catalog = load_catalog()
    shares: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for path in fitted_run_paths():
        for run in load_runs(path):
            group = next((label for label, fragment in GROUPS.items() if fragment in run.id), None)
            if group is None or run.model.moe is None:
                continue
            step = predict_run(run, catalog).step
            assert step is not None, run.id
            ep, host = step.parts.get("comm.ep"), step.parts.get("host.moe")
            shares[group].append(((ep.exposed_s if ep else 0.0) / step.step_s,
                                  (host.exposed_s if host else 0.0) / step.step_s))
    text = doc("docs/residuals.md")
    for label in GROUPS:
        row = table_row(text, label)
        assert row[3] == _span([ep for ep, _ in shares[label]]), (label, row)
        assert row[4] == _span([host for _, host in shares[label]]), (label, row)
