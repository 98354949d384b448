"""The model's judgement constants and constant fits are catalog data: shipped with a reason each, read through the
Catalog (so `--catalog` overrides one and `plan` answers differently), and what the model uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from clirun import one_error_line
from clirun import run_gpufleet as gpufleet
from gpufleet.catalog.judgements import Judgements, shipped_judgements
from gpufleet.catalog.registry import Catalog, load_catalog
from gpufleet.errors import CatalogError
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.parallel.layout import Layout
from gpufleet.parallel.memory import MemoryAssumptions
from gpufleet.perf.step import StepOptions, estimate_step
from gpufleet.planner.plan import PlanRequest, make_plan
from gpufleet.reliability.defaults import checkpoint_bytes_per_param, reliability_defaults
from gpufleet.workload.job import Job

GIB = 2**30
# the overlap contention off: with it, the doubled allowance moves the best plan to another layout, and the memory
# formula below is checked on one layout
PLAN = ("plan", "-m", "llama3-8b", "-g", "h100-sxm", "-n", "64", "--top", "1", "--json", "--overlap-contention", "off")


def _override(tmp_path: Path, **values: float) -> Path:
    path = tmp_path / f"judged-{'-'.join(values)}.yaml"  # one file per override (catalogs are cached by path)
    records = [{"id": name, "value": value, "source": "judgement: a test's override"} for name, value in values.items()]
    path.write_text(yaml.safe_dump({"judgements": records}), encoding="utf-8")
    return path


def _plan(*extra: str) -> dict:
    result = gpufleet(*PLAN, *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["plans"][0]


def test_every_judgement_the_model_uses_is_shipped_with_its_reason() -> None:
    catalog = load_catalog()
    judged = catalog.records("judgements")
    fits = catalog.records("constant_fits")
    names = {name.replace("_", "-") for name in Judgements.model_fields} - {"sources"}
    assert set(judged) | set(fits) == names and not set(judged) & set(fits)
    for record in judged.values():
        # a call says so; the two shared conventions cite their source instead
        assert record.source.startswith("judgement") or record.id in ("optimizer-bytes-per-param",
                                                                        "dp-bucket-elements"), record.id
    for fit in fits.values():
        assert fit.source.startswith("fit") and fit.chosen_on and "TBD" not in fit.out_of_sample


def test_the_step_and_the_memory_model_use_the_shipped_values() -> None:
    catalog = load_catalog()
    judged = shipped_judgements()
    job = Job(catalog.model("llama3-8b"), tokens=1e12, seq_len=4096, global_batch=64)
    cluster = Cluster(catalog.gpu("h100-sxm"), catalog.node("dgx-h100"), 8, Fabric(catalog.network("ndr400")))
    step = estimate_step(job, Layout(dp=8, sharding="zero1", micro_batch=1, recompute="full"), cluster,
                         catalog.calibration("h100-sxm"))
    assert step.parts["overhead"].exposed_s == judged.step_overhead_s == 0.005
    assert StepOptions().resolved_ep_imbalance == judged.ep_imbalance == 1.2
    assert cluster.scale_up_step_latency_s == judged.scale_up_step_latency_s == 2e-6
    memory = MemoryAssumptions()
    assert (memory.resolved_overhead_fixed_bytes, memory.resolved_overhead_fraction) == (1.5 * GIB, 0.10)
    assert (memory.resolved_dp_bucket_elements, memory.resolved_optimizer_bytes_per_param) == (40e6, 12.0)
    # one bucket for both models
    assert StepOptions().memory.resolved_dp_bucket_elements == memory.resolved_dp_bucket_elements


def test_judgements_are_a_value_the_options_carry_never_ambient_state() -> None:
    changed = shipped_judgements().model_copy(update={"ep_imbalance": 1.5, "memory_overhead_fraction": 0.2})
    options = StepOptions(judgements=changed)
    assert options.resolved_ep_imbalance == 1.5
    assert options.memory.resolved_overhead_fraction == 0.2  # the memory model prices with the options' judgements
    assert StepOptions(judgements=changed, ep_imbalance=1.0).resolved_ep_imbalance == 1.0  # a value given wins
    assert StepOptions().resolved_ep_imbalance == 1.2  # building one elsewhere changed nothing
    # a catalog's judgements fill only options that name none
    assert options.with_judgements(shipped_judgements()) is options
    assert StepOptions().with_judgements(changed).resolved_ep_imbalance == 1.5


def _overhead_catalog(tmp_path: Path, overhead_s: float) -> Catalog:
    return load_catalog([_override(tmp_path, **{"step-overhead-s": overhead_s})])


def test_the_same_request_built_in_two_places_prices_the_same_with_a_catalog_that_overrides(tmp_path: Path) -> None:
    """make_plan(request, catalog) prices with catalog's judgements whatever was in force when the request was made
    (the judgements were a context variable: a request built outside `with using(...)` priced 0.005 s of overhead,
    one built inside it 0.5 s)."""
    catalog = _overhead_catalog(tmp_path, 0.505)
    here = PlanRequest(model="llama3-8b", gpus=64, top=1)

    def elsewhere() -> PlanRequest:
        return PlanRequest(model="llama3-8b", gpus=64, top=1)

    first, second = make_plan(here, catalog).plans[0], make_plan(elsewhere(), catalog).plans[0]
    shipped = make_plan(here, load_catalog()).plans[0]
    assert first.candidate.step.parts["overhead"].exposed_s == 0.505
    assert second.candidate.step.step_s == first.candidate.step.step_s
    assert shipped.candidate.step.parts["overhead"].exposed_s == 0.005
    # the result says which judgements priced it
    assert make_plan(here, catalog).request.options.judged.step_overhead_s == 0.505


def test_catalog_override_of_the_step_overhead_changes_plans_step_by_exactly_that(tmp_path: Path) -> None:
    before = _plan()
    after = _plan("--catalog", str(_override(tmp_path, **{"step-overhead-s": 0.505})))
    assert after["layout"] == before["layout"]  # every layout pays the same half second more
    assert after["step_s"] == pytest.approx(before["step_s"] + 0.5, rel=1e-12)
    assert after["parts"]["overhead"]["exposed_s"] == 0.505
    assert _plan()["parts"]["overhead"]["exposed_s"] == 0.005  # the command's catalog stayed inside the command


def test_catalog_override_of_the_memory_allowance_changes_plans_memory_as_its_formula_says(tmp_path: Path) -> None:
    path = tmp_path / "allowance.yaml"
    shipped = load_catalog().records("constant_fits")["memory-overhead-fraction"]
    path.write_text(yaml.safe_dump({"constant_fits": [{**shipped.model_dump(mode="json"), "value": 0.2}]}))
    before, after = _plan(), _plan("--catalog", str(path))
    assert after["layout"] == before["layout"]
    rest = before["peak_memory_bytes"] - before["memory"]["overhead"]  # everything but the allowance
    assert after["memory"]["overhead"] == pytest.approx(1.5 * GIB + 0.2 * rest, rel=1e-12)
    assert after["peak_memory_bytes"] == pytest.approx(rest + 1.5 * GIB + 0.2 * rest, rel=1e-12)


def test_an_unknown_or_out_of_range_judgement_is_one_line_naming_it(tmp_path: Path) -> None:
    line = one_error_line(gpufleet(*PLAN, "--catalog", str(_override(tmp_path, **{"elementwise-passes": 3}))))
    assert "judgement 'elementwise-passes' is not one the model uses" in line
    assert "judged-elementwise-passes.yaml" in line
    line = one_error_line(gpufleet(*PLAN, "--catalog", str(_override(tmp_path, **{"host-link-fraction": 1.5}))))
    assert "host_link_fraction" in line and "1.5" in line


def test_a_judgement_needs_its_reason() -> None:
    with pytest.raises(CatalogError, match="source"):
        Catalog((), {"judgements": [(Path("x.yaml"), {"id": "ep-imbalance", "value": 1.1})]}).records("judgements")


def test_the_checkpoint_size_per_parameter_has_one_definition() -> None:
    catalog = load_catalog()
    defaults = reliability_defaults(catalog)
    assert checkpoint_bytes_per_param(catalog) == defaults.weight_bytes_per_param + defaults.optimizer_bytes_per_param
    # the optimizer's bytes in a checkpoint are the memory model's optimizer state
    assert defaults.optimizer_bytes_per_param == shipped_judgements().optimizer_bytes_per_param
