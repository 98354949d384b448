"""`gpufleet bench host`: a positive, finite host cost per launched op in the documented JSON shape; `calibrate
--from` writes it into the profile; `plan --calibration` scales the MoE host part by it (kernels × passes × seconds
per kernel, counted by hand here), and a profile without the field plans as the recorded fit does."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from _torchrun import torchrun_gpufleet  # noqa: F401  (puts tests/ on sys.path for clirun)

from clirun import one_error_line, run_gpufleet
from gpufleet.catalog.calibration_file import read_calibration_file
from gpufleet.catalog.judgements import shipped_judgements
from gpufleet.catalog.registry import load_catalog
from gpufleet.runtime.bench.host import OP_KINDS, bench_host

PLAN = ("plan", "--model", "mixtral-8x7b", "--tokens", "1T", "--gpu", "h100-sxm", "--gpus", "64", "--top", "3",
        "--json")


def test_bench_runs_here_and_gives_a_positive_finite_figure_per_op() -> None:
    result = bench_host(iters=50, warmup=5, repeats=3)
    assert {row.op for row in result.rows} == set(OP_KINDS)
    for row in result.rows:
        assert 0 < row.host_s_per_kernel < math.inf and len(row.repeats) == 3
        assert row.host_s_per_kernel == sorted(row.repeats)[1]  # the median of three
        assert row.device_s_per_kernel >= row.host_s_per_kernel  # the loop, then the sync: never shorter
    assert result.host_s_per_kernel == pytest.approx(sum(r.host_s_per_kernel for r in result.rows) / len(OP_KINDS))


@pytest.mark.timeout(120)
def test_cli_json_shape(tmp_path: Path) -> None:
    result = run_gpufleet("bench", "host", "--iters", "50", "--warmup", "5", "--repeats", "3", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert {"host_s_per_kernel", "by_op", "device", "repeats"} <= set(data)
    assert set(data["by_op"]) == set(OP_KINDS) and data["repeats"] == 3 and data["device"] == "cpu"
    assert 0 < data["host_s_per_kernel"] < math.inf
    assert all(0 < op["host_s_per_kernel"] < math.inf and op["device_kernels_per_s"] > 0
               for op in data["by_op"].values())


def host_json(tmp_path: Path, seconds: float) -> Path:
    path = tmp_path / f"host-{seconds}.json"
    row = {"host_s_per_kernel": seconds, "device_s_per_kernel": seconds / 2, "device_kernels_per_s": 2 / seconds,
           "repeats_s": [seconds] * 5}  # a whole `bench host --json` document (bench_file.HostBench)
    path.write_text(json.dumps({"kind": "host", "host_s_per_kernel": seconds, "by_op": {"index": row},
                                "device": "cuda:0", "repeats": 5, "iters": 2000, "autograd": True}))
    return path


def test_calibrate_from_the_json_writes_the_field_and_keeps_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "host.yaml"
    result = run_gpufleet("calibrate", "--gpu", "h100-sxm", "--from", str(host_json(tmp_path, 7.5e-6)),
                          "--out", str(out))
    assert result.returncode == 0, result.stderr
    [profile] = read_calibration_file(out)
    assert profile.host_s_per_kernel == 7.5e-6
    assert yaml.safe_load(out.read_text())["calibrations"][0]["host_s_per_kernel"] == 7.5e-6
    assert profile.gemm_fraction_16bit == load_catalog().calibration("h100-sxm").gemm_fraction_16bit  # kept


def moe_host_by_layout(*extra: str) -> dict[str, tuple[float, dict[str, object], int]]:
    result = run_gpufleet(*PLAN, *extra)
    assert result.returncode == 0, result.stderr
    return {p["layout"]["label"]: (p["parts"]["host.moe"]["exposed_s"], p["layout"], p["micro_batches"])
            for p in json.loads(result.stdout)["plans"]}


def test_plan_scales_the_moe_host_part_by_the_profile(tmp_path: Path) -> None:
    fitted = load_catalog().calibration("h100-sxm").host_s_per_kernel  # the recorded fit, 16 µs
    doubled = tmp_path / "doubled.yaml"
    assert run_gpufleet("calibrate", "--gpu", "h100-sxm", "--from", str(host_json(tmp_path, 2 * fitted)),
                        "--out", str(doubled)).returncode == 0
    before, after = moe_host_by_layout(), moe_host_by_layout("--calibration", str(doubled))
    shared = set(before) & set(after)
    assert shared
    model, judged = load_catalog().model("mixtral-8x7b"), shipped_judgements()
    for label in shared:
        (seconds, layout, micro_batches), (doubled_s, _, _) = before[label], after[label]
        assert doubled_s == pytest.approx(2 * seconds, rel=1e-9)
        # by hand: micro-batches × MoE layers of one stage × forward kernels × (fwd + bwd + recomputed fwd) × s per
        # kernel
        forward = judged.moe_fixed_kernels_fwd + judged.moe_kernels_per_local_expert_fwd * (
            model.moe.experts / layout["ep"])
        recomputed = layout["recompute_layers"] / model.layers if layout["recompute"] == "full" else 0.0
        passes = 1 + judged.moe_backward_kernel_ratio + recomputed
        pp = int(str(layout["pp"]))
        assert model.layers % pp == 0  # every layer is MoE in Mixtral, split evenly over the stages
        stage_layers = model.layers // pp
        assert doubled_s == pytest.approx(micro_batches * stage_layers * forward * passes * 2 * fitted, rel=1e-9)


def test_a_profile_without_the_field_plans_as_the_recorded_fit(tmp_path: Path) -> None:
    entry = load_catalog().calibration("h100-sxm").model_dump(mode="json", exclude_none=True)
    entry.pop("host_s_per_kernel")
    for name in ("in_training_fraction", "gemm_sustained_fraction", "cudnn_attention_fraction"):
        entry.pop(name, None)  # the other fits too: a profile that sets none of them
    profile = tmp_path / "no-host.yaml"
    profile.write_text(yaml.safe_dump({"calibrations": [entry]}))
    assert moe_host_by_layout("--calibration", str(profile)) == moe_host_by_layout()


@pytest.mark.parametrize(("value", "says"), [(0.0, "greater than 0"), (-1e-6, "greater than 0"), ("16us", "number"),
                                             (float("inf"), "finite")])
def test_a_bad_figure_is_one_line_and_writes_nothing(tmp_path: Path, value: object, says: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"host_s_per_kernel": value, "by_op": {}}))
    out = tmp_path / "o.yaml"
    line = one_error_line(run_gpufleet("calibrate", "--gpu", "h100-sxm", "--from", str(bad), "--out", str(out)))
    assert "host_s_per_kernel" in line and says in line
    assert not out.exists()


def test_bench_bad_ops_is_one_line() -> None:
    line = one_error_line(run_gpufleet("bench", "host", "--ops", "index,softmax"))
    assert "index, matmul, elementwise, cast" in line
