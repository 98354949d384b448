"""`gpufleet calibrate`: the GEMM curve fit recovers known parameters, the profile is in the catalog's schema with
host, date and version, and plan/memory/validate read it with --calibration and change by the amount it says."""

from __future__ import annotations

import itertools
import json
import math
import socket
from pathlib import Path

import pytest
import yaml
from _torchrun import torchrun_gpufleet  # noqa: F401  (puts tests/ on sys.path for clirun)
from hypothesis import given, settings
from hypothesis import strategies as st

from clirun import one_error_line, run_gpufleet
from gpufleet import __version__
from gpufleet.catalog.calibration_file import read_calibration_file
from gpufleet.catalog.registry import load_catalog
from gpufleet.runtime.bench.calibrate import GemmPoint, fit_gemm_curve

PEAK = 989.4e12  # h100-sxm dense bf16, the catalog's figure
SIZES = (64, 256, 1024, 4096, 16384)


def curve(fraction: float, half: float, m: int, n: int, k: int) -> float:
    """The model's GEMM efficiency (perf/compute.py shape_factor) times the best-shape fraction."""
    return fraction * (m / (m + half)) * (n / (n + half)) * (k / (k + half))


@settings(max_examples=25, deadline=None)
@given(fraction=st.floats(0.05, 0.95), half=st.integers(8, 2048))
def test_fit_recovers_the_curve_it_was_sampled_from(fraction: float, half: int) -> None:
    points = [GemmPoint(m, n, k, "bf16", PEAK * curve(fraction, half, m, n, k))
              for m, n, k in itertools.product(SIZES, SIZES[1:], SIZES[2:])]
    fit = fit_gemm_curve(points, PEAK)
    assert fit.half_dim == pytest.approx(half, rel=0.01, abs=1)
    assert fit.fraction == pytest.approx(fraction, rel=0.01)


def test_a_half_dim_beyond_the_shapes_measured_stops_at_the_largest_one() -> None:
    """Shapes up to 256 whose efficiency keeps rising as if half_dim were 8192: the data cannot tell that from a
    smaller half_dim with a smaller fraction, so the fit stops at 256 instead of running to the grid's end with a
    fraction at the peak (what a loaded CPU's noisy timings did to `calibrate` here)."""
    sizes = (16, 64, 256)
    shapes = list(itertools.product(sizes, sizes, sizes))
    points = [GemmPoint(m, n, k, "bf16", PEAK * curve(0.9, 8192, m, n, k)) for m, n, k in shapes]
    fit = fit_gemm_curve(points, PEAK)
    assert fit.half_dim <= 256 and fit.half_dim_at_bound
    assert fit.fraction < 0.9 and not fit.capped
    inside = fit_gemm_curve([GemmPoint(m, n, k, "bf16", PEAK * curve(0.5, 32, m, n, k))
                             for m, n, k in itertools.product(sizes, sizes, sizes)], PEAK)
    assert inside.half_dim == pytest.approx(32, abs=1) and not inside.half_dim_at_bound


def gemm_json(tmp_path: Path, fraction: float, half: float = 128) -> Path:
    """`bench gemm --json` output of a device whose GEMMs follow the model's curve exactly."""
    rows = []
    for m, n, k in itertools.product(SIZES, SIZES[1:], SIZES[2:]):
        flops = PEAK * curve(fraction, half, m, n, k)
        rows.append({"shape": "x", "m": m, "n": n, "k": k, "dtype": "bf16", "time_s": 2 * m * n * k / flops,
                     "tflops": flops / 1e12, "device": "synthetic"})
    path = tmp_path / "gemm.json"
    path.write_text(json.dumps({"kind": "gemm", "model": "synthetic", "tokens": max(SIZES), "tp": 1, "rows": rows}))
    return path


def test_profile_is_the_catalog_schema_with_provenance(tmp_path: Path) -> None:
    memory = tmp_path / "memory.json"
    memory.write_text(json.dumps({"size_bytes": 2**30, "time_s": 1.0, "bandwidth_gbps": 2680.0,  # 0.8 of 3.35 TB/s
                                  "device": "cuda:0"}))
    out = tmp_path / "h100.yaml"
    result = run_gpufleet("calibrate", "--gpu", "h100-sxm", "--from", str(gemm_json(tmp_path, 0.5)),
                          "--from", str(memory), "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    [profile] = read_calibration_file(out)
    assert profile.id == "h100-sxm"
    assert profile.gemm_fraction_16bit == pytest.approx(0.5, rel=1e-3) and profile.gemm_half_dim == 128
    assert profile.hbm_fraction == pytest.approx(2680e9 / load_catalog().gpu("h100-sxm").hbm_bytes_per_s)
    built_in = load_catalog().calibration("h100-sxm")
    assert profile.attention_fraction == built_in.attention_fraction  # not measured: kept
    text = out.read_text()
    assert f"host: {socket.gethostname()}" in text and f"gpufleet_version: {__version__}" in text
    assert "date: 20" in text and __version__ in profile.source
    assert set(yaml.safe_load(text)) == {"calibrations"}


def test_plan_reads_the_profile_and_gemm_time_scales_with_its_fraction(tmp_path: Path) -> None:
    out = tmp_path / "half.yaml"
    built_in = load_catalog().calibration("h100-sxm").gemm_fraction_16bit
    assert run_gpufleet("calibrate", "--gpu", "h100-sxm", "--from", str(gemm_json(tmp_path, built_in / 2)),
                        "--out", str(out)).returncode == 0
    args = ("plan", "--model", "llama3-8b", "--tokens", "1T", "--gpu", "h100-sxm", "--gpus", "64", "--top", "1",
            "--json")
    before = json.loads(run_gpufleet(*args).stdout)["plans"][0]
    after = json.loads(run_gpufleet(*args, "--calibration", str(out)).stdout)["plans"][0]
    assert after["layout"] == before["layout"]
    # same shape curve (half_dim 128), half the best-shape fraction: every GEMM takes exactly twice as long
    ratio = after["parts"]["compute.gemm"]["exposed_s"] / before["parts"]["compute.gemm"]["exposed_s"]
    assert ratio == pytest.approx(2.0, rel=1e-3)
    assert after["step_s"] > before["step_s"]


def test_memory_and_validate_accept_it_and_a_wrong_file_is_one_line(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    assert run_gpufleet("calibrate", "--gpu", "h100-sxm", "--from", str(gemm_json(tmp_path, 0.6)),
                        "--out", str(out)).returncode == 0
    memory = run_gpufleet("memory", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--tp", "8",
                          "--calibration", str(out))
    assert memory.returncode == 0, memory.stderr
    validate = run_gpufleet("validate", "--calibration", str(out), "--json")
    assert validate.returncode in (0, 1), validate.stderr
    assert json.loads(validate.stdout)["runs"]
    assert "calibrations" in one_error_line(run_gpufleet("plan", "--model", "llama3-8b", "--tokens", "1T", "--gpu",
                                                         "h100-sxm", "--gpus", "8", "--calibration",
                                                         str(tmp_path / "gemm.json")))


def test_calibrate_bad_input(tmp_path: Path) -> None:
    junk = tmp_path / "junk.json"
    junk.write_text("not json")
    assert "is not JSON" in one_error_line(run_gpufleet("calibrate", "--gpu", "h100-sxm", "--from", str(junk),
                                                        "--out", str(tmp_path / "o.yaml")))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    assert "not the --json output" in one_error_line(run_gpufleet("calibrate", "--gpu", "h100-sxm", "--from",
                                                                  str(other), "--out", str(tmp_path / "o.yaml")))
    assert "--model" in one_error_line(run_gpufleet("calibrate", "--gpu", "h100-sxm", "--out",
                                                    str(tmp_path / "o.yaml")))
    assert not (tmp_path / "o.yaml").exists()


@pytest.mark.timeout(300)
def test_calibrate_runs_the_benches_here(tmp_path: Path) -> None:
    out = tmp_path / "here.yaml"
    tiny = Path(__file__).parent / "tiny_models.yaml"
    result = run_gpufleet("calibrate", "--gpu", "h100-sxm", "--model", "tiny-test", "--catalog", str(tiny),
                          "--tokens", "128", "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    [profile] = read_calibration_file(out)
    assert 0 < profile.gemm_fraction_16bit < 0.706 and 0 < profile.hbm_fraction <= 1  # a CPU against an H100's peaks
    # calibrate without --from runs the host bench too (tests/runtime/test_bench_host.py tests the bench itself)
    assert "host_s_per_kernel" in yaml.safe_load(out.read_text())["calibrations"][0]
    assert 0 < profile.host_s_per_kernel < math.inf and "(bench host)" in (profile.note or "")


def collectives_json(tmp_path: Path, busbw_gbps: float, per_node: int | None = 8) -> Path:
    """`bench collectives --json` output of 8 ranks on one node (the rows' keys as the bench writes them)."""
    rows = [{"collective": op, "size_bytes": size, "time_s": size * 7 / 8 / (busbw_gbps * 1e9),
             "algbw_gbps": busbw_gbps * 8 / 7, "busbw_gbps": busbw_gbps, "expected_busbw_gbps": None,
             "shortfall": False, "ranks": 8, "ranks_per_node": per_node}
            for op in ("all-gather", "reduce-scatter") for size in (2**20, 2**26)]
    path = tmp_path / f"coll-{busbw_gbps}.json"
    path.write_text(json.dumps({"ranks": 8, "backend": "nccl", "rows": rows}))
    return path


def test_collectives_and_disk_results_become_profile_fields(tmp_path: Path) -> None:
    disk = tmp_path / "disk.json"
    disk.write_text(json.dumps({"path": "/ckpt", "rows": [
        {"size_bytes": 2**28, "write_s": 0.1, "write_gbps": 2.5, "read_s": 0.05, "read_gbps": 5.0},
        {"size_bytes": 2**30, "write_s": 0.6, "write_gbps": 1.8, "read_s": 0.2, "read_gbps": 5.4}]}))
    out = tmp_path / "measured.yaml"
    result = run_gpufleet("calibrate", "--gpu", "h100-sxm", "--from", str(collectives_json(tmp_path, 300.0)),
                          "--from", str(disk), "--out", str(out))
    assert result.returncode == 0, result.stderr
    [profile] = read_calibration_file(out)
    assert profile.checkpoint_write_gbytes_per_s == 1.8  # the largest file: checkpoint shards are large
    assert {(p.op, p.size_bytes, p.ranks, p.ranks_per_node, p.busbw_gbytes_per_s) for p in profile.collectives} == {
        (op, size, 8, 8, 300.0) for op in ("all-gather", "reduce-scatter") for size in (2**20, 2**26)}
    built_in = load_catalog().calibration("h100-sxm")
    assert profile.gemm_fraction_16bit == built_in.gemm_fraction_16bit  # nothing measured it: kept


def test_collectives_without_ranks_per_node_is_one_line(tmp_path: Path) -> None:
    line = one_error_line(run_gpufleet("calibrate", "--gpu", "h100-sxm", "--from",
                                       str(collectives_json(tmp_path, 300.0, per_node=None)),
                                       "--out", str(tmp_path / "o.yaml")))
    assert "ranks_per_node" in line and "rerun bench collectives" in line
    assert not (tmp_path / "o.yaml").exists()
