"""Benchmarks: nccl-tests' algbw/busbw arithmetic checked by hand, the fabric model's expectation checked against
the catalog's own link figures, and the real commands under a real gloo torchrun."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _torchrun import torchrun_gpufleet

from clirun import one_error_line, run_gpufleet
from gpufleet.catalog.registry import load_catalog
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.runtime.bench.busbw import SHORTFALL_FRACTION, expected_busbw_gbps, measured_row, parse_ops, size_sweep
from gpufleet.runtime.bench.collectives import from_slurm
from gpufleet.runtime.bench.disk import bench_disk
from gpufleet.runtime.bench.shapes import model_gemm_shapes

TINY = Path(__file__).parent / "tiny_models.yaml"
ISSUE_KEYS = {"collective", "size_bytes", "time_s", "algbw_gbps", "busbw_gbps", "expected_busbw_gbps"}


@pytest.mark.parametrize(("op", "busbw"), [
    # 1e9 bytes in 0.1 s on 4 ranks: algbw 10 GB/s; busbw ×2·3/4 (all-reduce), ×3/4 (gathers, a2a), ×1 (bcast, p2p)
    ("all-reduce", 15.0), ("all-gather", 7.5), ("reduce-scatter", 7.5), ("all-to-all", 7.5),
    ("broadcast", 10.0), ("send-recv", 10.0),
])
def test_busbw_follows_nccl_tests_factors(op: str, busbw: float) -> None:
    row = measured_row(op, 10**9, 4, 0.1, None)  # type: ignore[arg-type]
    assert row.algbw_gbps == pytest.approx(10.0)
    assert row.busbw_gbps == pytest.approx(busbw)


def test_shortfall_flags_the_seeds_tcp_fallback_and_not_a_healthy_link() -> None:
    # the seeds: 120 Gb/s measured where 380 was expected (0.32); 340 of 380 (0.89) is healthy. A busbw of B GB/s
    # over 8 ranks takes S · 2·7/8 / (B · 1e9) seconds.
    def seconds(busbw_gbps: float) -> float:
        return 10**9 * 1.75 / (busbw_gbps * 1e9)

    slow = measured_row("all-reduce", 10**9, 8, seconds(120 / 8), 380 / 8)
    assert slow.busbw_gbps == pytest.approx(15.0) and slow.shortfall
    assert not measured_row("all-reduce", 10**9, 8, seconds(340 / 8), 380 / 8).shortfall
    assert 0.32 < SHORTFALL_FRACTION < 0.89


def test_expected_busbw_on_one_node_approaches_the_catalogs_scale_up_figure() -> None:
    catalog = load_catalog()
    node = catalog.node("dgx-h100")
    gpu = catalog.gpu(node.gpu)
    cluster = Cluster(gpu, node, 8, Fabric(catalog.network(node.default_network)))
    link = cluster.scale_up.bytes_per_s_per_direction * cluster.scale_up.achievable_fraction / 1e9
    big = expected_busbw_gbps("all-reduce", 2**32, cluster)
    small = expected_busbw_gbps("all-reduce", 2**10, cluster)
    assert big == pytest.approx(link, rel=0.02)  # 4 GiB: latency is noise, the bus figure shows through
    assert small < 0.1 * big  # 1 KiB: latency-bound, as nccl-tests shows


def test_size_sweep_is_nccl_tests_b_e_f() -> None:
    assert size_sweep(1024, 65536, 4) == [1024, 4096, 16384, 65536]
    assert size_sweep(8, 8, 2) == [8]
    assert parse_ops("broadcast,all-reduce") == ["all-reduce", "broadcast"]


def test_model_gemm_shapes_by_hand() -> None:
    model = load_catalog([TINY]).model("tiny-test")
    shapes = {shape.name: (shape.m, shape.n, shape.k) for shape in model_gemm_shapes(model, 128, tp=2)}
    assert shapes == {"qkv": (128, 256, 256), "attn-out": (128, 256, 128), "mlp-up": (128, 512, 256),
                      "mlp-down": (128, 256, 256), "logits": (128, 500, 256)}


def test_bench_disk_writes_reads_and_leaves_nothing(tmp_path: Path) -> None:
    rows = bench_disk(tmp_path, (3 * 2**20, 8 * 2**20 + 5), repeats=2, block_bytes=2**20)
    assert [row.size_bytes for row in rows] == [3 * 2**20, 8 * 2**20 + 5]
    assert all(row.write_s > 0 and row.read_s > 0 for row in rows)
    assert list(tmp_path.iterdir()) == []


def test_cli_disk_json_and_bad_path(tmp_path: Path) -> None:
    result = run_gpufleet("bench", "disk", str(tmp_path), "--sizes", "4MiB", "--json")
    assert result.returncode == 0, result.stderr
    [row] = json.loads(result.stdout)["rows"]
    assert row["size_bytes"] == 4 * 2**20
    assert row["write_gbps"] == pytest.approx(row["size_bytes"] / row["write_s"] / 1e9)
    assert "is not a folder" in one_error_line(run_gpufleet("bench", "disk", str(tmp_path / "nope")))
    assert "byte size" in one_error_line(run_gpufleet("bench", "disk", str(tmp_path), "--sizes", "lots"))


@pytest.mark.timeout(180)
def test_cli_gemm_runs_the_models_shapes() -> None:
    result = run_gpufleet("bench", "gemm", "--model", "tiny-test", "--catalog", str(TINY), "--tokens", "64",
                          "--dtype", "fp32", "--iters", "2", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["rows"]
    assert [row["shape"] for row in rows] == ["qkv", "attn-out", "mlp-up", "mlp-down", "logits"]
    for row in rows:
        assert row["tflops"] == pytest.approx(2 * row["m"] * row["n"] * row["k"] / row["time_s"] / 1e12)
    assert "dtype" in one_error_line(run_gpufleet("bench", "gemm", "--model", "tiny-test", "--catalog", str(TINY),
                                                  "--dtype", "int3"))


def test_cli_memory_counts_read_and_write() -> None:
    result = run_gpufleet("bench", "memory", "--size", "16MiB", "--iters", "3", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["bandwidth_gbps"] == pytest.approx(2 * data["size_bytes"] / data["time_s"] / 1e9)


def test_srun_tasks_get_the_torch_distributed_variables() -> None:
    slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "MASTER_ADDR": "node001"}
    assert from_slurm(slurm) == {"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "MASTER_PORT": "29500"}
    assert from_slurm({**slurm, "RANK": "5"}) == {}  # torchrun inside srun: torchrun's own variables win
    assert from_slurm({"SLURM_PROCID": "0"}) == {}  # no rendezvous host: nothing to build a group from


def test_collectives_without_a_process_group_say_how_to_launch() -> None:
    line = one_error_line(run_gpufleet("bench", "collectives"))
    assert "process group" in line and "torchrun" in line


@pytest.mark.timeout(300)
def test_collectives_under_a_real_gloo_torchrun() -> None:
    result = torchrun_gpufleet(2, "bench", "collectives", "--ops", "all-reduce,all-gather,send-recv",
                               "--min-bytes", "4KiB", "--max-bytes", "64KiB", "--iters", "3", "--warmup", "1",
                               "--node-type", "dgx-h100", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)  # rank 0 alone prints
    assert data["ranks"] == 2 and data["backend"] == "gloo"
    rows = data["rows"]
    assert [(row["collective"], row["size_bytes"]) for row in rows] == [
        (op, size) for op in ("all-reduce", "all-gather", "send-recv") for size in (4096, 16384, 65536)]
    factor = {"all-reduce": 1.0, "all-gather": 0.5, "send-recv": 1.0}  # 2(n-1)/n, (n-1)/n, 1 at n = 2
    for row in rows:
        assert set(row) >= ISSUE_KEYS
        assert row["algbw_gbps"] == pytest.approx(row["size_bytes"] / row["time_s"] / 1e9)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor[row["collective"]])
        assert row["expected_busbw_gbps"] > 0
    # gloo over loopback TCP against two H100s on NVLink: the 64 KiB all-reduce must be flagged
    assert next(row for row in rows if row["collective"] == "all-reduce" and row["size_bytes"] == 65536)["shortfall"]
    assert all(row["ranks_per_node"] == 2 for row in rows)  # both ranks on this host: the scale-up tier
