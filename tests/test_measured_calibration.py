"""Measured collectives and checkpoint-disk bandwidth in a calibration profile: the collective model and the
reliability model use them, `plan --calibration FILE` changes by what they say, and a profile without them (or an
old profile file) plans exactly as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from clirun import one_error_line, run_gpufleet
from gpufleet.catalog.calibration import MeasuredCollective
from gpufleet.catalog.calibration_file import calibration_yaml, read_calibration_file
from gpufleet.catalog.registry import load_catalog
from gpufleet.fabric.collectives import collective_cost, modeled_cost
from gpufleet.fabric.placement import GroupSpan
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.workload.params import count_params

MIB = 2**20


def h100_cluster(gpus: int = 64, measured: tuple[MeasuredCollective, ...] = ()) -> Cluster:
    catalog = load_catalog()
    node = catalog.node("dgx-h100")
    return Cluster(catalog.gpu("h100-sxm"), node, gpus, Fabric(catalog.network("ndr400")),
                   collective_calibration=measured)


def points(op: str, busbw_gbytes_per_s: float, ranks: int = 8, per_node: int = 8,
           sizes: tuple[int, ...] = (MIB, 64 * MIB)) -> tuple[MeasuredCollective, ...]:
    return tuple(MeasuredCollective(op=op, size_bytes=size, ranks=ranks, ranks_per_node=per_node,  # type: ignore[arg-type]
                                    busbw_gbytes_per_s=busbw_gbytes_per_s) for size in sizes)


ONE_NODE = GroupSpan(size=8, per_node=8, nodes=1, nodes_per_leaf=1, leaves=1)
TWO_NODES = GroupSpan(size=16, per_node=8, nodes=2, nodes_per_leaf=2, leaves=1)


def test_the_measured_group_takes_the_measured_time_by_hand() -> None:
    """At a measured size, on the group that was measured, the time is the measurement's: 64 MiB all-gathered over
    8 GPUs at 300 GB/s bus bandwidth takes 64 MiB · 7/8 / 300e9 s (nccl-tests' bus factor)."""
    cost = collective_cost("all-gather", 64 * MIB, ONE_NODE, h100_cluster(measured=points("all-gather", 300.0)))
    assert cost.time_s == pytest.approx(64 * MIB * 7 / 8 / 300e9, rel=1e-12)
    assert "measured" in cost.link


def test_half_the_measured_bandwidth_doubles_the_time() -> None:
    for size in (4096, 3 * MIB, 64 * MIB, 2**30):  # below, between, at and beyond the measured sizes
        full = collective_cost("all-gather", size, ONE_NODE, h100_cluster(measured=points("all-gather", 300.0)))
        half = collective_cost("all-gather", size, ONE_NODE, h100_cluster(measured=points("all-gather", 150.0)))
        assert half.time_s == pytest.approx(2 * full.time_s, rel=1e-12), size


def test_between_measured_sizes_the_efficiency_is_interpolated_in_log_size() -> None:
    """Measured at 0.5 of the model's bus bandwidth at 1 MiB and 0.25 at 64 MiB: at 8 MiB, halfway in log size, the
    ratio is their mean, 0.375."""
    cluster = h100_cluster()
    model_1, model_64 = (modeled_cost("reduce-scatter", size, ONE_NODE, cluster).time_s for size in (MIB, 64 * MIB))
    bus = {size: size * 7 / 8 / t for size, t in ((MIB, model_1 * 2), (64 * MIB, model_64 * 4))}  # 0.5 and 0.25
    measured = tuple(MeasuredCollective(op="reduce-scatter", size_bytes=s, ranks=8, ranks_per_node=8,
                                        busbw_gbytes_per_s=b / 1e9) for s, b in bus.items())
    cost = collective_cost("reduce-scatter", 8 * MIB, ONE_NODE, h100_cluster(measured=measured))
    assert cost.time_s == pytest.approx(modeled_cost("reduce-scatter", 8 * MIB, ONE_NODE, cluster).time_s / 0.375,
                                        rel=1e-9)


def test_only_the_measured_op_and_tier_change() -> None:
    measured = h100_cluster(measured=points("all-gather", 100.0))  # a scale-up measurement
    plain = h100_cluster()
    for op, span in (("all-reduce", ONE_NODE), ("reduce-scatter", ONE_NODE), ("all-gather", TWO_NODES)):
        assert collective_cost(op, 16 * MIB, span, measured) == collective_cost(op, 16 * MIB, span, plain)  # type: ignore[arg-type]


def test_a_network_measurement_carries_over_to_more_nodes_through_the_model() -> None:
    """Measured on 2 nodes, applied to 8: the model's structure (ring latency over more ranks) stays, scaled by the
    efficiency the 2-node measurement showed."""
    cluster = h100_cluster()
    model_two = modeled_cost("all-reduce", 64 * MIB, TWO_NODES, cluster).time_s
    busbw = 64 * MIB * 2 * 15 / 16 / (model_two / 0.8) / 1e9  # measured: 0.8 of the model's bus bandwidth
    measured = h100_cluster(measured=points("all-reduce", busbw, ranks=16, sizes=(64 * MIB,)))
    eight = GroupSpan(size=64, per_node=8, nodes=8, nodes_per_leaf=8, leaves=1)
    assert collective_cost("all-reduce", 64 * MIB, eight, measured).time_s == pytest.approx(
        modeled_cost("all-reduce", 64 * MIB, eight, cluster).time_s / 0.8, rel=1e-9)


def test_a_measurement_names_a_whole_number_of_nodes() -> None:
    with pytest.raises(ValidationError, match="must divide ranks"):
        MeasuredCollective(op="all-gather", size_bytes=MIB, ranks=12, ranks_per_node=8, busbw_gbytes_per_s=1.0)
    assert MeasuredCollective(op="all-gather", size_bytes=MIB, ranks=16, ranks_per_node=8,
                              busbw_gbytes_per_s=1.0).tier == "network"


# --- the profile file and `plan --calibration` -------------------------------------------------------------------

PLAN = ("plan", "--model", "llama3-8b", "--tokens", "1T", "--gpu", "h100-sxm", "--gpus", "64", "--top", "1", "--json")


def write_profile(path: Path, **fields: Any) -> Path:
    built_in = load_catalog().calibration("h100-sxm")
    profile = built_in.model_copy(update={"source": "test profile", **fields})
    path.write_text(calibration_yaml([profile], "test"))
    return path


def plan_with(path: Path | None) -> dict[str, Any]:
    result = run_gpufleet(*PLAN, *(("--calibration", str(path)) if path else ()))
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout)["plans"][0])


def total(plan: dict[str, Any], part: str) -> float:
    return float(plan["parts"][part]["exposed_s"] + plan["parts"][part]["hidden_s"])


def dp_step(profile: Path) -> Any:
    """The plan's step for dp 64 (FSDP, tp 1, pp 1) of llama3-8b on 64 H100s with this profile, by the Python API
    (`plan` ranks every layout; a slower network may rank another first)."""
    from gpufleet.catalog.registry import Catalog
    from gpufleet.planner.plan import PlanRequest, make_plan
    from gpufleet.planner.search import SearchSpace

    space = SearchSpace(micro_batches=(2,), shardings=("zero3",), recomputes=("none",), vpps=(1,), cps=(1,),
                        max_tp=1, partial_recompute=False, activation_offload=False)
    result = make_plan(PlanRequest(model="llama3-8b", tokens=1e12, gpu="h100-sxm", gpus=64, search_space=space),
                       Catalog((profile,)))
    return next(c for c in result.search.feasible if (c.layout.tp, c.layout.pp, c.layout.dp) == (1, 1, 64)).step


def test_plan_comm_doubles_with_half_the_measured_bandwidth(tmp_path: Path) -> None:
    """dp 64 over 8 nodes: FSDP's reduce-scatter and all-gather ride the network; a profile that measured them at half
    the bandwidth doubles comm.dp (exposed + hidden), and one without measurements leaves it as the model has it."""
    network = (*points("reduce-scatter", 300.0, ranks=16), *points("all-gather", 300.0, ranks=16))
    halved = (*points("reduce-scatter", 150.0, ranks=16), *points("all-gather", 150.0, ranks=16))
    full = dp_step(write_profile(tmp_path / "full.yaml", collectives=network)).parts["comm.dp"]
    half = dp_step(write_profile(tmp_path / "half.yaml", collectives=halved)).parts["comm.dp"]
    plain = dp_step(write_profile(tmp_path / "plain.yaml")).parts["comm.dp"]
    assert half.total_s == pytest.approx(2 * full.total_s, rel=1e-9)
    assert full.total_s != pytest.approx(plain.total_s, rel=1e-3) and "measured" in full.link
    assert "measured" not in plain.link


@pytest.mark.timeout(120)
def test_plan_checkpoint_follows_the_measured_disk(tmp_path: Path) -> None:
    """`plan --calibration`: half the measured checkpoint write bandwidth doubles the checkpoint write time, which
    lengthens the checkpoint interval and lowers goodput."""
    full = plan_with(write_profile(tmp_path / "full.yaml", checkpoint_write_gbytes_per_s=2.0))
    half = plan_with(write_profile(tmp_path / "half.yaml", checkpoint_write_gbytes_per_s=1.0))
    write_full, write_half = (p["reliability"]["checkpoint_write_s"] for p in (full, half))
    assert write_half == pytest.approx(2 * write_full, rel=1e-9)
    # by hand: 8 nodes each write their shard at the measured 2 GB/s (below the storage system's cap), a checkpoint
    # being 14 bytes per parameter (planner.plan.CHECKPOINT_BYTES_PER_PARAM)
    params = count_params(load_catalog().model("llama3-8b")).total
    assert write_full == pytest.approx(params * 14 / (8 * 2e9), rel=1e-9)
    assert half["reliability"]["checkpoint_interval_s"] > full["reliability"]["checkpoint_interval_s"]
    assert half["goodput"] < full["goodput"]


@pytest.mark.timeout(120)
def test_a_profile_without_the_new_fields_plans_exactly_as_before(tmp_path: Path) -> None:
    old = tmp_path / "old.yaml"  # an older profile file: none of the measured-collective or disk keys
    entry = {key: value for key, value in load_catalog().calibration("h100-sxm").model_dump(
        mode="json", exclude_none=True).items() if key not in ("collectives", "checkpoint_write_gbytes_per_s",
                                                                "optimizer_s_per_param")}
    old.write_text(yaml.safe_dump({"calibrations": [entry]}))
    [profile] = read_calibration_file(old)
    assert profile.collectives == () and profile.checkpoint_write_gbytes_per_s is None
    assert plan_with(old) == plan_with(None)


def test_a_bad_measured_collective_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    data = load_catalog().calibration("h100-sxm").model_dump(mode="json", exclude_none=True)
    data["collectives"] = [{"op": "all-gather", "size_bytes": 1024, "ranks": 6, "ranks_per_node": 4,
                            "busbw_gbytes_per_s": 1.0}]
    bad.write_text(yaml.safe_dump({"calibrations": [data]}))
    line = one_error_line(run_gpufleet(*PLAN, "--calibration", str(bad)))
    assert "ranks_per_node" in line and "bad.yaml" in line
