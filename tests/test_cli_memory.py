"""`gpufleet memory` through the real console-script entry point, in a separate process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clirun import one_error_line
from clirun import run_gpufleet as gpufleet

KINDS = {"weights", "gradients", "optimizer", "activations", "buffers", "overhead"}
BASE = ("memory", "--model", "llama3-8b", "--gpu", "h100-sxm")



def test_json_shape_and_fit() -> None:
    result = gpufleet(*BASE, "--gpus", "8", "--tp", "2", "--pp", "2", "--sharding", "zero1", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(data) == {"stages", "peak_stage", "peak_bytes", "hbm_bytes", "fits", "host_bytes_per_node",
                         "host_budget_bytes_per_node"}
    assert [stage["stage"] for stage in data["stages"]] == [0, 1]
    assert data["host_bytes_per_node"] == 0  # nothing offloaded
    for stage in data["stages"]:
        assert set(stage) == {"stage", "bytes", "total_bytes", "host_bytes"}
        assert set(stage["bytes"]) == KINDS
        assert stage["total_bytes"] == pytest.approx(sum(stage["bytes"].values()))
        assert all(value >= 0 for value in stage["bytes"].values())
    totals = [stage["total_bytes"] for stage in data["stages"]]
    assert data["peak_bytes"] == max(totals)
    assert data["stages"][data["peak_stage"]]["total_bytes"] == data["peak_bytes"]
    assert data["hbm_bytes"] == 80 * 2**30  # H100 SXM5: 80 GB HBM3
    assert data["fits"] is True
    # 8.03B parameters, tp2 × pp2: a quarter of the model per GPU, 2 bytes each (± embedding imbalance)
    weights = data["stages"][0]["bytes"]["weights"]
    assert 0.8 * 2 * 8.03e9 / 4 < weights < 1.3 * 2 * 8.03e9 / 4


def test_torchtitan_selective_policy_keeps_less() -> None:
    # Llama 3 8B, FSDP 8, 2 x 8192 tokens: torchtitan's op-level policy keeps 63,616 bytes per token and layer where
    # Megatron's selective (flash attention: nothing dropped) keeps 139,392; the layer being recomputed holds the
    # difference once: (139,392 - 63,616) x 16,384 x (32 - 1) fewer bytes of activations.
    args = (*BASE, "--gpus", "8", "--seq", "8192", "--micro-batch", "2", "--global-batch", "16", "--sharding", "fsdp",
            "--recompute", "selective", "--json")
    megatron = json.loads(gpufleet(*args).stdout)["stages"][0]["bytes"]["activations"]
    titan = json.loads(gpufleet(*args, "--selective-policy", "op").stdout)["stages"][0]["bytes"]["activations"]
    assert megatron - titan == pytest.approx((139392 - 63616) * 16384 * 31)


def test_stack_torchtitan_reproduces_its_measured_peak() -> None:
    # torchtitan's Table 1 (benchmarks/llama3_h100_202412_torchtitan.md): Llama 3.1 8B, FSDP over 8 H100 96GB,
    # local batch 2 x 8192, selective (op) checkpointing, eager: 82.4 GiB peak reserved.
    done = gpufleet("memory", "--model", "llama3-8b", "--gpu", "h100-sxm-96gb", "--gpus", "8", "--seq", "8192",
                    "--micro-batch", "2", "--global-batch", "16", "--sharding", "fsdp", "--recompute", "selective",
                    "--stack", "torchtitan", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["peak_bytes"] / 2**30 == pytest.approx(82.4, rel=0.04)


def test_dtensor_tp_keeps_gathered_inputs() -> None:
    # Llama 3 8B, tp 2 + SP, 4096 tokens: DTensor keeps QKV's and the MLP's gathered inputs, 1/2 x 4096 x 2 x 2 x 4096
    # bytes more per layer than Megatron's shards, over 32 layers.
    args = (*BASE, "--gpus", "8", "--tp", "2", "--json")
    megatron = json.loads(gpufleet(*args).stdout)["stages"][0]["bytes"]["activations"]
    dtensor = json.loads(gpufleet(*args, "--dtensor-tp").stdout)["stages"][0]["bytes"]["activations"]
    assert dtensor - megatron == pytest.approx(32 * 0.5 * 4096 * 2 * 2 * 4096)


def test_does_not_fit_exits_1_and_says_why() -> None:
    result = gpufleet(*BASE, "--gpus", "1", "--seq", "8192", "--json")
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert data["fits"] is False
    assert data["peak_bytes"] > data["hbm_bytes"]
    # 8B params × 18 bytes (bf16 weights, fp32 grads, Adam) alone is ~135 GiB > 80 GiB
    assert data["stages"][0]["bytes"]["optimizer"] == pytest.approx(12 * 8.03e9, rel=0.01)
    assert "does not fit" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_tables_for_people() -> None:
    result = gpufleet(*BASE, "--gpus", "64", "--tp", "2", "--sharding", "zero1", "--recompute", "selective")
    assert result.returncode == 0, result.stderr
    assert "GiB" in result.stdout
    assert "fits" in result.stdout
    assert "headroom" in result.stdout


def test_dp_is_derived_and_a_wrong_dp_is_rejected() -> None:
    ok = gpufleet(*BASE, "--gpus", "16", "--tp", "4", "--sharding", "zero3", "--json")
    assert ok.returncode == 0, ok.stderr
    line = one_error_line(gpufleet(*BASE, "--gpus", "16", "--tp", "4", "--dp", "2"))
    assert "16" in line


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--model", "llama3-9b", "--gpu", "h100-sxm", "--gpus", "8"), "llama3-8b"),
        (("--model", "llama3-8b", "--gpu", "h100-sxmm", "--gpus", "8"), "h100-sxm"),
        (("--model", "llama3-8b", "--gpu", "a100-sxm-80gb", "--gpus", "8", "--precision", "fp8"), "no dense fp8"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--tp", "3"), "tp"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "6", "--tp", "3", "--dp", "2"), "tp=3"),
        (
            (
                "--model",
                "llama3-8b",
                "--gpu",
                "h100-sxm",
                "--gpus",
                "8",
                "--pp",
                "64",
                "--dp",
                "1",
                "--tp",
                "1",
            ),
            "pp",
        ),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--ep", "2"), "ep"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "0"), "--gpus"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq", "-4"), "--seq"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--micro-batch", "0"), "--micro-batch"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--sharding", "zero4"), "sharding"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--recompute", "some"), "recompute"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--precision", "fp32"), "precision"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "3"), "batch"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--recompute-layers", "4"), "recompute full"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--recompute", "full", "--recompute-layers",
          "33"), "1..32"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--pp", "2", "--offload-activations", "4"),
         "pp=1"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--offload-activations", "32"), "1..31"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--tp", "2", "--expert-tp", "1"),
         "mixture-of-experts"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--selective-policy", "most"), "selective"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--selective-policy", "op"), "--recompute"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--stack", "megatron"), "torchtitan"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--stack", ""), "--stack must not be empty"),
        (("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--stack", "torchtitan", "--offload-activations",
          "4"), "CPU memory"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: tuple[str, ...], needle: str) -> None:
    line = one_error_line(gpufleet("memory", *args))
    assert needle in line


def test_malformed_catalog_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - id: x\n    layers: [\n", encoding="utf-8")
    line = one_error_line(gpufleet(*BASE, "--gpus", "8", "--catalog", str(bad)))
    assert "bad.yaml" in line


def test_user_catalog_model_is_used(tmp_path: Path) -> None:
    user = tmp_path / "tiny.yaml"
    user.write_text(
        "models:\n"
        "  - id: tiny\n    name: tiny\n    source: test\n    layers: 4\n    hidden: 256\n    heads: 4\n"
        "    kv_heads: 4\n    ffn_hidden: 1024\n    gated_mlp: false\n    vocab: 1000\n",
        encoding="utf-8",
    )
    result = gpufleet(
        "memory",
        "--model",
        "tiny",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "2",
        "--pp",
        "2",
        "--catalog",
        str(user),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["stages"]) == 2


def test_offloaded_tensors_are_checked_against_the_nodes_ram() -> None:
    # ZeRO-Offload of Llama 3.1 8B without sharding: 12 B of Adam state per parameter on every GPU's host
    # share; a DGX H100 node of 8 GPUs pins 8 x 12 x 8.03e9 B = 771 GB, within 80 % of its 2 TiB.
    from gpufleet.catalog.registry import load_catalog
    from gpufleet.workload.params import count_params

    params = count_params(load_catalog().model("llama3-8b")).total
    done = gpufleet(*BASE, "--gpus", "8", "--offload-optimizer", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["host_bytes_per_node"] == pytest.approx(8 * 12 * params, rel=1e-6)
    assert data["host_budget_bytes_per_node"] == pytest.approx(0.8 * 2048 * 2**30)
    half = json.loads(gpufleet(*BASE, "--gpus", "4", "--offload-optimizer", "--json").stdout)
    assert half["host_bytes_per_node"] == pytest.approx(4 * 12 * params, rel=1e-6)  # 4 GPUs share the node
    # Llama 3.1 405B at 8K, ZeRO-3 on 2,048 GPUs, 115 of 126 layers offloaded: several TiB per node
    big = gpufleet("memory", "-m", "llama3-405b", "-g", "h100-sxm", "-n", "2048", "--sharding", "zero3",
                   "--seq", "8192", "--global-batch", "2048", "--offload-activations", "115")
    assert big.returncode == 1 and "pinned memory per dgx-h100 node" in big.stderr
    assert len(big.stderr.strip().splitlines()) == 1
