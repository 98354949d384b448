"""The step model's judgement constants are data: the shipped file loads, says why for each, and is what the model
uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.catalog.judgements import judgements_path, load_step_judgements, step_judgements
from gpufleet.catalog.registry import load_catalog
from gpufleet.errors import CatalogError
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.parallel.layout import Layout
from gpufleet.perf.step import StepOptions, estimate_step
from gpufleet.workload.job import Job


def test_every_shipped_judgement_says_it_is_one() -> None:
    judged = step_judgements()
    for name in type(judged).model_fields:
        assert getattr(judged, name).source.startswith("judgement"), name


def test_the_step_uses_the_judged_overhead_and_imbalance() -> None:
    catalog = load_catalog()
    job = Job(catalog.model("llama3-8b"), tokens=1e12, seq_len=4096, global_batch=64)
    cluster = Cluster(catalog.gpu("h100-sxm"), catalog.node("dgx-h100"), 8, Fabric(catalog.network("ndr400")))
    step = estimate_step(job, Layout(dp=8, sharding="zero1", micro_batch=1, recompute="full"), cluster,
                         catalog.calibration("h100-sxm"))
    assert step.parts["overhead"].exposed_s == step_judgements().step_overhead_s.value == 0.005
    assert StepOptions().ep_imbalance == step_judgements().ep_imbalance.value == 1.2


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "judgements.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_judgement_without_its_reason_or_out_of_range_is_one_catalog_error(tmp_path: Path) -> None:
    shipped = judgements_path().read_text(encoding="utf-8")
    unsourced = shipped.replace('source: "judgement: the MoE router', 'source: "guess: the MoE router', 1)
    with pytest.raises(CatalogError, match=r"router_gemm_fraction\.source"):
        load_step_judgements(_write(tmp_path, unsourced))
    too_big = shipped.replace("router_gemm_fraction:\n  value: 0.5", "router_gemm_fraction:\n  value: 1.5", 1)
    with pytest.raises(CatalogError, match=r"router_gemm_fraction\.value"):
        load_step_judgements(_write(tmp_path, too_big))
