"""Request objects are the Python API: they refuse what the CLI refuses, with the same message, and keep its
defaults (one definition, next to the owner)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from clirun import run_gpufleet
from gpufleet.catalog.registry import load_catalog
from gpufleet.economics.requests import (
    DEFAULT_ONPREM_GPUS,
    CostRequest,
    FacilityRequest,
    cost_report,
    facility_report,
)
from gpufleet.errors import InputError
from gpufleet.fabric.requests import FabricBuildRequest, FabricSimulateRequest, build_fabric, simulate_fabric
from gpufleet.parallel.memory_request import MemoryRequest
from gpufleet.planner.memory_report import memory_report
from gpufleet.reliability.request import DEFAULT_GPUS_PER_NODE, ReliabilityRequest, reliability_report


def _cli_error(*args: str) -> str:
    result = run_gpufleet(*args)
    assert result.returncode == 2, result.stderr
    return result.stderr.strip().removeprefix("error: ")


@pytest.mark.parametrize(("fields", "flags"), [
    ({"recompute": "some"}, ["--recompute", "some"]),
    ({"recompute": "full", "selective_policy": "op"}, ["--recompute", "full", "--selective-policy", "op"]),
    ({"sharding": "zero4"}, ["--sharding", "zero4"]),
    ({"precision": "fp4"}, ["--precision", "fp4"]),
    ({"gpus": 12, "tp": 8}, ["--gpus", "12", "--tp", "8"]),
])
def test_memory_request_refuses_what_the_cli_refuses(fields: dict[str, object], flags: list[str]) -> None:
    base = {"model": "llama3-8b", "gpu": "h100-sxm", "gpus": 8}
    with pytest.raises(InputError) as refused:
        MemoryRequest(**{**base, **fields})
    cli_flags = ["--gpus", "8"] if "gpus" not in fields else []
    assert str(refused.value) == _cli_error("memory", "-m", "llama3-8b", "-g", "h100-sxm", *cli_flags, *flags)


def test_memory_request_ranges_and_defaults() -> None:
    with pytest.raises(ValidationError):
        MemoryRequest(model="llama3-8b", gpu="h100-sxm", gpus=0)
    with pytest.raises(ValidationError):
        MemoryRequest(model="llama3-8b", gpu="h100-sxm", gpus=8, unknown=1)  # type: ignore[call-arg]
    request = MemoryRequest(model="llama3-8b", gpu="h100-sxm", gpus=64, tp=8, pp=2)
    assert (request.data_parallel, request.batch) == (4, 8)
    report = memory_report(request, load_catalog([]))
    assert report.data["fits"] and not report.problems()


@pytest.mark.parametrize("fields", [
    {"gpus": 0, "params": "1B"},
    {"gpus": 8},
    {"gpus": 8, "params": "1B", "checkpoint_gb": 3.0},
    {"gpus": 8, "checkpoint_gb": 1e12},
    {"gpus": 8, "params": "0.1"},
    {"gpus": 8, "params": "1B", "write_gbps": 5.0, "gpus_per_node": 4},
    {"gpus": 8, "params": "1B", "gpus_per_node": 0},
    {"gpus": 8, "params": "1B", "interval_min": -1.0},
    {"gpus": 8, "params": "1B", "train_time": "xx"},
])
def test_reliability_request_refuses_what_the_cli_refuses(fields: dict[str, object]) -> None:
    flags = {"gpus": "--gpus", "params": "--params", "checkpoint_gb": "--checkpoint-gb", "write_gbps": "--write-gbps",
             "gpus_per_node": "--gpus-per-node", "interval_min": "--interval-min", "train_time": "--train-time"}
    with pytest.raises(InputError) as refused:
        ReliabilityRequest(**fields)  # type: ignore[arg-type]
    args = [str(part) for name, value in fields.items() for part in (flags[name], value)]
    assert str(refused.value) == _cli_error("reliability", *args)


def test_reliability_request_defaults_the_node_size_and_sizes_the_checkpoint_from_the_catalog() -> None:
    catalog = load_catalog([])
    request = ReliabilityRequest(gpus=16384, params="405e9")
    assert request.gpus_per_node is None
    report = reliability_report(request, catalog)
    cli = json.loads(run_gpufleet("reliability", "--gpus", "16384", "--params", "405e9", "--json").stdout)
    assert report.data == pytest.approx(cli)
    per_node = ReliabilityRequest(gpus=16384, params="405e9", gpus_per_node=DEFAULT_GPUS_PER_NODE)
    assert reliability_report(per_node, catalog).data == report.data
    with pytest.raises(InputError, match="--params 1e30 needs a checkpoint over"):
        reliability_report(ReliabilityRequest(gpus=8, params="1e30"), catalog)


@pytest.mark.parametrize(("fields", "flags"), [
    ({}, []),
    ({"gpu_hours": "1e6", "utilization": 2.0}, ["--gpu-hours", "1e6", "--utilization", "2"]),
    ({"gpu_hours": "1e6", "pricing": ("foo",)}, ["--gpu-hours", "1e6", "--pricing", "foo"]),
    ({"gpu_hours": "1e6", "gpus": 0}, ["--gpu-hours", "1e6", "--gpus", "0"]),
    ({"gpu_hours": "inf"}, ["--gpu-hours", "inf"]),
])
def test_cost_request_refuses_what_the_cli_refuses(fields: dict[str, object], flags: list[str]) -> None:
    with pytest.raises(InputError) as refused:
        CostRequest(**fields)  # type: ignore[arg-type]
    assert str(refused.value) == _cli_error("cost", *flags)


def test_cost_request_prices_the_default_owned_cluster_and_names_a_bad_facility_flag() -> None:
    catalog = load_catalog([])
    report = cost_report(CostRequest(gpu_hours="1e6"), catalog)
    assert (report.gpu, report.gpus) == ("h100-sxm", DEFAULT_ONPREM_GPUS)
    assert report.data == json.loads(run_gpufleet("cost", "--gpu-hours", "1e6", "--json").stdout)
    with pytest.raises(InputError) as refused:
        cost_report(CostRequest(gpu_hours="1e6", years=0.0), catalog)
    assert str(refused.value) == _cli_error("cost", "--gpu-hours", "1e6", "--years", "0")


@pytest.mark.parametrize(("fields", "flags"), [
    ({"gpus": 0, "gpu": "h100-sxm"}, ["--gpus", "0", "--gpu", "h100-sxm"]),
    ({"gpus": 8, "gpu": "h100-sxm", "mfu": 2.0}, ["--gpus", "8", "--gpu", "h100-sxm", "--mfu", "2"]),
    ({"gpus": 8, "gpu": "h100-sxm", "rack_kw": 1e6}, ["--gpus", "8", "--gpu", "h100-sxm", "--rack-kw", "1e6"]),
])
def test_facility_request_refuses_what_the_cli_refuses(fields: dict[str, object], flags: list[str]) -> None:
    with pytest.raises(InputError) as refused:
        FacilityRequest(**fields)  # type: ignore[arg-type]
    assert str(refused.value) == _cli_error("facility", *flags)


def test_facility_request_needs_a_node_or_a_gpu() -> None:
    with pytest.raises(InputError) as refused:
        facility_report(FacilityRequest(gpus=8), load_catalog([]))
    assert str(refused.value) == _cli_error("facility", "--gpus", "8")



@pytest.mark.parametrize(("fields", "flags"), [
    ({"gpus": "1"}, ["--gpus", "1"]),
    ({"gpus": "64", "collective": "foo"}, ["--gpus", "64", "--collective", "foo"]),
    ({"gpus": "64", "routing": "foo"}, ["--gpus", "64", "--routing", "foo"]),
    ({"gpus": "64", "size": "0"}, ["--gpus", "64", "--size", "0"]),
    ({"gpus": "64", "placement": "x"}, ["--gpus", "64", "--placement", "x"]),
])
def test_fabric_simulate_request_refuses_what_the_cli_refuses(fields: dict[str, object], flags: list[str]) -> None:
    with pytest.raises(InputError) as refused:
        FabricSimulateRequest(**fields)  # type: ignore[arg-type]
    assert str(refused.value) == _cli_error("fabric", "simulate", *flags)


def test_fabric_requests_answer_as_the_cli_does() -> None:
    catalog = load_catalog([])
    with pytest.raises(InputError) as refused:
        simulate_fabric(FabricSimulateRequest(gpus="64", seed=3), catalog)
    assert str(refused.value) == _cli_error("fabric", "simulate", "--gpus", "64", "--seed", "3")
    built = build_fabric(FabricBuildRequest(gpus=1024, topology="rail-optimized"), catalog)
    cli = run_gpufleet("fabric", "build", "--gpus", "1024", "--topology", "rail-optimized", "--json")
    assert built.data == json.loads(cli.stdout)
    with pytest.raises(ValidationError):
        FabricBuildRequest(gpus=0)
