"""Step-time model: hand-derived parts and physical invariants."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from functools import partial

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.judgements import shipped_judgements
from gpufleet.catalog.registry import load_catalog
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.parallel.activations import activation_bytes_per_layer
from gpufleet.parallel.layout import Layout, validate_layout
from gpufleet.parallel.memory import MemoryAssumptions
from gpufleet.perf.compute import gemm_time_s
from gpufleet.perf.compute import layer_compute as _layer_compute
from gpufleet.perf.step import StepOptions, estimate_step
from gpufleet.workload.job import Job

#: layer_compute priced with the shipped catalog's judgement constants
layer_compute = partial(_layer_compute, judged=shipped_judgements())

CATALOG = load_catalog()
H100 = CATALOG.gpu("h100-sxm")
DGX = CATALOG.node("dgx-h100")
NDR = CATALOG.network("ndr400")
#: H100's measured fractions (calibration.yaml) with the fitted constants (data/fits.yaml) pinned at round values of
#: the tests' own, so that the arithmetic below stays by hand whatever a refit records.
CAL = CATALOG.get("calibrations", "h100-sxm", CalibrationProfile).model_copy(
    update={"in_training_fraction": 0.87, "cudnn_attention_fraction": 0.6, "host_s_per_kernel": 10e-6})
LLAMA8 = CATALOG.model("llama3-8b")
LLAMA70 = CATALOG.model("llama3-70b")


def cluster(gpus: int, oversubscription: float = 1.0, nodes_per_leaf: int | None = None) -> Cluster:
    return Cluster(H100, DGX, gpus, Fabric(NDR, oversubscription=oversubscription, nodes_per_leaf=nodes_per_leaf))


def test_gemm_time_at_a_given_efficiency_by_hand() -> None:
    # 4096^3 bf16 GEMM on H100: 2*4096^3 FLOPs at 989.4 TFLOP/s x 0.706 (sustained benchmark) x 0.87
    # (in a training step) x (4096/(4096+128))^3 (shape).
    flops = 2 * 4096**3
    efficiency = 0.706 * 0.87 * (4096 / 4224) ** 3
    expected = flops / (989.4e12 * efficiency)
    assert math.isclose(gemm_time_s(4096, 4096, 4096, 989.4e12, CAL, "bf16"), expected, rel_tol=1e-9)
    assert math.isclose(expected, 2.480e-4, rel_tol=2e-3)


def test_first_generation_flash_attention_by_hand() -> None:
    # Llama 3 8B layer, tp 1, one sequence of 8192: causal score FLOPs 4·s·(q width)/2 per token =
    # 2·8192·4096 = 67.1 MFLOP; forward at 989.4 TFLOP/s x 0.33 (FA2 class) x 0.87 (in a step), backward
    # 2.5x. FlashAttention-1 kernels run at 0.325/0.615 of that (FA2 paper: 25-40 % vs 50-73 % of peak).

    layout = Layout(micro_batch=1)
    flops = 8192 * 2 * 8192 * 4096
    fa2 = layer_compute(LLAMA8, layout, H100, CAL, seq_len=8192, precision="bf16", moe_layer=False)
    assert math.isclose(fa2.attention_fwd_s, flops / (989.4e12 * 0.33 * 0.87), rel_tol=1e-9)
    fa1_cal = CAL.model_copy(update={"attention_kernel": "flash-v1"})
    fa1 = layer_compute(LLAMA8, layout, H100, fa1_cal, seq_len=8192, precision="bf16", moe_layer=False)
    assert math.isclose(fa1.attention_fwd_s, fa2.attention_fwd_s * 0.615 / 0.325, rel_tol=1e-9)
    assert math.isclose(fa1.attention_bwd_s, 2.5 * fa1.attention_fwd_s, rel_tol=1e-9)
    assert fa1.gemm_fwd_s == fa2.gemm_fwd_s


def test_cudnn_fused_attention_by_hand() -> None:
    # Transformer Engine's cuDNN fused attention on H100 at 0.6 of the bf16 peak (FA3-paper class) instead of
    # FA2's 0.33: the same score FLOPs, 0.33/0.6 of the time; backward stays 2.5x forward; a GPU without a
    # cuDNN figure falls back to its FA2-class fraction.

    layout = Layout(micro_batch=1)
    flops = 8192 * 2 * 8192 * 4096
    cudnn_cal = CAL.model_copy(update={"attention_kernel": "cudnn"})
    assert cudnn_cal.cudnn_attention_fraction == 0.6
    cudnn = layer_compute(LLAMA8, layout, H100, cudnn_cal, seq_len=8192, precision="bf16", moe_layer=False)
    assert math.isclose(cudnn.attention_fwd_s, flops / (989.4e12 * 0.6 * 0.87), rel_tol=1e-9)
    assert math.isclose(cudnn.attention_bwd_s, 2.5 * cudnn.attention_fwd_s, rel_tol=1e-9)
    no_figure = cudnn_cal.model_copy(update={"cudnn_attention_fraction": None})
    fa2 = layer_compute(LLAMA8, layout, H100, CAL, seq_len=8192, precision="bf16", moe_layer=False)
    fallback = layer_compute(LLAMA8, layout, H100, no_figure, seq_len=8192, precision="bf16", moe_layer=False)
    assert fallback.attention_fwd_s == fa2.attention_fwd_s


def test_fp8_casts_every_routed_copy_of_a_moe_layer_input_by_hand() -> None:
    # Transformer Engine casts each FP8 GEMM input bf16 -> fp8 (read 2 B, write 1 B: 1.5 bf16-element
    # equivalents per element). Qwen3-30B-A3B, tp 1, ep 8, one sequence of 4096: per token the casts cover
    # QKV's input (h = 2048), out-proj's (q width 32 x 128 = 4096), the experts' up-projection input once per
    # routed copy (top-8 x 2048 = 16384) and their down-projection input (8 x 768 = 6144): 28672 elements,
    # 4096 x 28672 x 1.5 x 2 B over 3.35 TB/s x 0.8.

    qwen = CATALOG.model("qwen3-30b-a3b")
    layout = Layout(ep=8, dp=8, micro_batch=1)
    fp8 = layer_compute(qwen, layout, H100, CAL, seq_len=4096, precision="fp8", moe_layer=True)
    bf16 = layer_compute(qwen, layout, H100, CAL, seq_len=4096, precision="bf16", moe_layer=True)
    cast_s = 4096 * (2048 + 4096 + 8 * 2048 + 8 * 768) * 1.5 * 2 / (3.35e12 * 0.8)
    assert math.isclose(fp8.elementwise_fwd_s - bf16.elementwise_fwd_s, cast_s, rel_tol=1e-9)
    # tp 2 without SP, experts whole (etp 1): out-proj's input halves (2048), the experts still take every token's
    # 8 copies at their full width 768
    split = Layout(tp=2, ep=4, dp=4, micro_batch=1, expert_tp=1)
    fp8 = layer_compute(qwen, split, H100, CAL, seq_len=4096, precision="fp8", moe_layer=True)
    bf16 = layer_compute(qwen, split, H100, CAL, seq_len=4096, precision="bf16", moe_layer=True)
    cast_s = 4096 * (2048 + 2048 + 8 * 2048 + 8 * 768) * 1.5 * 2 / (3.35e12 * 0.8)
    assert math.isclose(fp8.elementwise_fwd_s - bf16.elementwise_fwd_s, cast_s, rel_tol=1e-9)


def test_eager_elementwise_by_hand() -> None:
    # Eager PyTorch, counted from torchtitan's ops in 2-byte passes per token. Llama 3.1 8B (h 4096, 32 q and 8 kv
    # heads of 128, SwiGLU width 14336), tp 1: two fp32 RMSNorms 2 x 16 x 4096, rotary on q and k 8 x 5120,
    # silu-then-multiply 2 x 14336 = 200,704 more elements per token; one sequence of 8192 at 2 B over
    # 3.35 TB/s x 0.8.

    layout = Layout(micro_batch=1)
    fused = layer_compute(LLAMA8, layout, H100, CAL, seq_len=8192, precision="bf16", moe_layer=False)
    eager = layer_compute(LLAMA8, layout, H100, CAL, seq_len=8192, precision="bf16", moe_layer=False,
                          fused_elementwise=False)
    extra_s = 8192 * (2 * 16 * 4096 + 8 * (32 + 8) * 128 + 2 * 14336) * 2 / (3.35e12 * 0.8)
    assert math.isclose(eager.elementwise_fwd_s - fused.elementwise_fwd_s, extra_s, rel_tol=1e-9)
    assert eager.gemm_fwd_s == fused.gemm_fwd_s and eager.attention_fwd_s == fused.attention_fwd_s
    # tp 2 without SP: the norms still see the whole hidden, rotary and the MLP only this rank's half
    half = Layout(tp=2, dp=4, micro_batch=1)
    fused = layer_compute(LLAMA8, half, H100, CAL, seq_len=8192, precision="bf16", moe_layer=False)
    eager = layer_compute(LLAMA8, half, H100, CAL, seq_len=8192, precision="bf16", moe_layer=False,
                          fused_elementwise=False)
    extra_s = 8192 * (2 * 16 * 4096 + 8 * (32 + 8) * 128 / 2 + 2 * 14336 / 2) * 2 / (3.35e12 * 0.8)
    assert math.isclose(eager.elementwise_fwd_s - fused.elementwise_fwd_s, extra_s, rel_tol=1e-9)


def test_eager_adds_nothing_where_eager_pytorch_runs_one_kernel_anyway() -> None:
    # GPT-3 style: LayerNorm (one ATen kernel), learned positions (no rotary), GELU MLP (one kernel).

    gpt = LLAMA8.model_copy(update={"norm": "layernorm", "learned_positions": 2048, "gated_mlp": False,
                                    "linear_bias": True})
    layout = Layout(micro_batch=1)
    fused = layer_compute(gpt, layout, H100, CAL, seq_len=2048, precision="bf16", moe_layer=False)
    eager = layer_compute(gpt, layout, H100, CAL, seq_len=2048, precision="bf16", moe_layer=False,
                          fused_elementwise=False)
    assert eager.elementwise_fwd_s == fused.elementwise_fwd_s


def test_an_eager_step_is_slower_by_its_elementwise_traffic_only() -> None:
    # The whole step: eager adds forward, backward (2x) and the op-level recompute of the element-wise ops, and
    # nothing else (same GEMMs, attention, communication).
    job = Job(LLAMA8, tokens=1e12, seq_len=8192, global_batch=16)
    layout = Layout(dp=8, micro_batch=2, sharding="fsdp", recompute="selective")
    op_level = StepOptions(memory=replace(StepOptions().memory, selective_policy="op"))  # torchtitan's policy
    fused = estimate_step(job, layout, cluster(8), CAL, op_level)
    eager = estimate_step(job, layout, cluster(8), CAL, replace(op_level, fused_elementwise=False))
    assert eager.step_s > fused.step_s
    for name in ("compute.gemm", "compute.attention", "comm.dp"):
        assert eager.parts[name].exposed_s == pytest.approx(fused.parts[name].exposed_s)
    # per layer and micro-batch: forward plus backward is 3x the forward's extra, and op-level recompute re-runs
    # the forward's element-wise ops once more (tests above pin the forward's extra by hand)

    extra_fwd_s = (layer_compute(LLAMA8, layout, H100, CAL, seq_len=8192, precision="bf16", moe_layer=False,
                                 fused_elementwise=False).elementwise_fwd_s
                   - layer_compute(LLAMA8, layout, H100, CAL, seq_len=8192, precision="bf16",
                                   moe_layer=False).elementwise_fwd_s)
    micro_batches_x_layers = 1 * 32  # global batch 16 over dp 8 at micro-batch 2; 32 layers
    assert (eager.parts["compute.elementwise"].exposed_s - fused.parts["compute.elementwise"].exposed_s
            == pytest.approx(micro_batches_x_layers * 3 * extra_fwd_s))
    assert (eager.parts["compute.recompute"].exposed_s - fused.parts["compute.recompute"].exposed_s
            == pytest.approx(micro_batches_x_layers * extra_fwd_s))


def test_torchtitan_op_level_selective_recompute_by_hand() -> None:
    # torchtitan's op-level selective checkpointing saves every matmul output except every second one, in call
    # order q, k, v, out, up (w1), gate (w3), down (w2), so the backward re-runs k, out and gate, plus every
    # element-wise op; the attention kernel's output is saved. Megatron's selective re-runs only the attention
    # core. Llama 3 8B (GQA: k is 8 x 128 = 1024 wide, ffn 14336), tp 1, one sequence of 8192.

    layer = layer_compute(LLAMA8, Layout(micro_batch=1), H100, CAL, seq_len=8192, precision="bf16", moe_layer=False)
    peak = 989.4e12
    alternate_s = (gemm_time_s(8192, 1024, 4096, peak, CAL, "bf16") + gemm_time_s(8192, 4096, 4096, peak, CAL, "bf16")
                   + gemm_time_s(8192, 14336, 4096, peak, CAL, "bf16"))
    assert math.isclose(layer.recompute_s("selective", "op"), alternate_s + layer.elementwise_fwd_s, rel_tol=1e-9)
    assert layer.recompute_s("selective") == layer.attention_fwd_s
    # 2·8192·4096·(1024 + 4096 + 14336) FLOPs: 36.5 % of the layer's projection and MLP FLOPs
    assert math.isclose(layer.recompute_flops("selective", "op"), 2 * 8192 * 4096 * 19456, rel_tol=1e-9)
    assert math.isclose(layer.recompute_flops("selective", "op") / layer.gemm_flops_fwd, 19456 / 53248, rel_tol=1e-9)
    # through the step: the recompute part grows by (op - attention) per layer and micro-batch
    job = Job(LLAMA8, tokens=1e12, seq_len=8192, global_batch=16)
    layout = Layout(dp=8, micro_batch=2, sharding="fsdp", recompute="selective")
    megatron = estimate_step(job, layout, cluster(8), CAL)
    titan = estimate_step(job, layout, cluster(8), CAL, StepOptions(memory=MemoryAssumptions(selective_policy="op")))
    # one micro-batch of 2 x 8192 tokens: twice the GEMM rows of the layer above
    wide_alternate_s = (gemm_time_s(16384, 1024, 4096, peak, CAL, "bf16")
                        + gemm_time_s(16384, 4096, 4096, peak, CAL, "bf16")
                        + gemm_time_s(16384, 14336, 4096, peak, CAL, "bf16"))
    wide = layer_compute(LLAMA8, layout, H100, CAL, seq_len=8192, precision="bf16", moe_layer=False)
    assert math.isclose(wide.alternate_matmul_fwd_s, wide_alternate_s, rel_tol=1e-9)
    extra_s = 32 * (wide_alternate_s + wide.elementwise_fwd_s - wide.attention_fwd_s)
    assert math.isclose(titan.parts["compute.recompute"].exposed_s - megatron.parts["compute.recompute"].exposed_s,
                        extra_s, rel_tol=1e-9)
    # and the hardware FLOPs count the re-run matmuls instead of the attention core's score FLOPs
    attention_flops = 16384 * 2 * 8192 * 4096  # causal: 4·s·d/2 per query
    assert math.isclose(titan.hardware_flops_per_step_per_gpu - megatron.hardware_flops_per_step_per_gpu,
                        32 * (2 * 16384 * 4096 * 19456 - attention_flops), rel_tol=1e-9)


def test_1f1b_bubble_and_interleaving() -> None:
    # pp=4 inside one node (p2p over NVLink is negligible); the bubble is (pp-1)/vpp mean stage times,
    # so its share of the pipeline is (pp-1)/(m+pp-1) for uniform stages. A tiny vocabulary keeps the
    # output head (on the last stage only) from unbalancing the stages.
    tiny_vocab = LLAMA8.model_copy(update={"vocab": 64})
    job = Job(tiny_vocab, tokens=1e12, seq_len=2048, global_batch=32)
    c = cluster(8)
    plain = Layout(tp=2, pp=4, dp=1, micro_batch=1)
    inter = Layout(tp=2, pp=4, dp=1, vpp=2, micro_batch=1)
    for layout in (plain, inter):
        validate_layout(layout, LLAMA8, 8, 32, 2048)
    step_plain = estimate_step(job, plain, c, CAL)
    step_inter = estimate_step(job, inter, c, CAL)
    m = 32
    bubble_plain = step_plain.parts["bubble"].exposed_s
    pipeline = step_plain.step_s - step_plain.parts["optimizer"].exposed_s - step_plain.parts["overhead"].exposed_s
    assert math.isclose(bubble_plain / pipeline, 3 / (m + 3), rel_tol=0.01)
    assert math.isclose(step_inter.parts["bubble"].exposed_s / bubble_plain, 0.5, rel_tol=0.05)


def test_dp_part_matches_the_hand_derived_all_reduce() -> None:
    # DDP (no sharding) of Llama 3.1 8B over 2 nodes with overlap off: the whole all-reduce is exposed. Megatron-LM
    # reduces bf16 training's gradients in fp32 (its fp32 main_grad buffer): 4 bytes per parameter.
    job = Job(LLAMA8, tokens=1e12, seq_len=4096, global_batch=16)
    layout = Layout(dp=16, micro_batch=1, recompute="full")
    step = estimate_step(job, layout, cluster(16), CAL, StepOptions(dp_overlap=False))
    bus = min(8 * 400e9 / 8 * 0.96, 450e9 * 0.82)
    bandwidth_s = 8.03e9 * 4 * 2 * 15 / 16 / bus  # ~163 ms
    # 40M-element buckets: ceil(8.03e9 / 40e6) = 201 all-reduces, each a tree of 2*log2(16) = 8 steps of
    # (5 us NIC/software + 0.3 us switch hop) latency: ~8.5 ms.
    latency_s = 201 * 8 * (5e-6 + 0.3e-6)
    assert math.isclose(step.parts["comm.dp"].exposed_s, bandwidth_s + latency_s, rel_tol=0.01)
    # a bf16 gradient buffer (Megatron-Bridge's grad_reduce_in_fp32=False) moves half the bytes
    bf16 = estimate_step(job, layout, cluster(16), CAL,
                         StepOptions(dp_overlap=False, memory=MemoryAssumptions(grad_dtype="bf16")))
    assert math.isclose(bf16.parts["comm.dp"].exposed_s, bandwidth_s / 2 + latency_s, rel_tol=0.01)


def test_sequence_parallel_ranks_route_only_their_own_tokens() -> None:
    # Qwen3-30B-A3B on 2 nodes, tp 2 + SP, ep 8, dp 8: ep does not divide dp, so the experts are not
    # tensor-parallel (etp 1) and each TP rank dispatches its own half of the sequence: the all-to-all
    # moves half the bytes it moves without SP. At 32k tokens each rank's share is ~0.5 GB, so per-message
    # latency is under 1 % and the time halves.
    qwen = CATALOG.model("qwen3-30b-a3b")
    job = Job(qwen, tokens=1e12, seq_len=32768, global_batch=64)
    options = StepOptions(dp_overlap=False)
    sharded = estimate_step(job, Layout(tp=2, ep=16, dp=8, sequence_parallel=True, micro_batch=1), cluster(16),
                            CAL, options)
    whole = estimate_step(job, Layout(tp=2, ep=16, dp=8, sequence_parallel=False, micro_batch=1), cluster(16),
                          CAL, options)
    assert math.isclose(sharded.parts["comm.ep"].exposed_s / whole.parts["comm.ep"].exposed_s, 0.5, rel_tol=0.01)
    # With the experts split over the TP pair (ep 4 divides dp 8: etp = tp by default) each rank still sends only its
    # own half over the EP group (Megatron-Core's alltoall dispatcher); the pair then all-gathers what it received
    # and reduce-scatters it back, forward and backward: 2 all-reduce-equivalents of the gathered buffer, 32768
    # tokens x 8 copies x 2048 x 2 bytes = 1.07 GB, over NVLink (450 GB/s x 0.82) plus 2 steps of 2 us.
    whole = Layout(tp=2, ep=4, dp=8, sequence_parallel=True, micro_batch=1, expert_tp=1)
    split = whole.with_(expert_tp=2)
    ep_whole = estimate_step(job, whole, cluster(16), CAL, options).parts["comm.ep"].exposed_s
    ep_split = estimate_step(job, split, cluster(16), CAL, options).parts["comm.ep"].exposed_s
    gather_s = 32768 * 8 * 2048 * 2 / (450e9 * 0.82) + 2 * 2e-6
    m, layers = 64 // 8, qwen.layers
    assert math.isclose(ep_split - ep_whole, m * layers * 2 * gather_s * options.resolved_ep_imbalance, rel_tol=0.01)


def test_dropless_moe_layers_wait_for_the_host_by_hand() -> None:
    # Qwen3-30B-A3B, ep 8 on one node: 16 local experts. The host launches 26 + 6 x 16 = 122 kernels per MoE
    # layer forward and twice that backward, 366 x 10 us = 3.66 ms per layer and micro-batch. Dropless routing
    # syncs the host every layer, so all of it adds to the layer; with token-drop the host runs ahead and a
    # layer whose GPU work takes longer than 3.66 ms hides it completely.
    qwen = CATALOG.model("qwen3-30b-a3b")
    job = Job(qwen, tokens=1e12, seq_len=4096, global_batch=64)
    layout = Layout(tp=1, ep=8, dp=8, micro_batch=1)
    dropless = estimate_step(job, layout, cluster(8), CAL, StepOptions(dp_overlap=False))
    token_drop = estimate_step(job, layout, cluster(8), CAL, StepOptions(dp_overlap=False, moe_dropless=False))
    m, layers = 8, 48
    host_s = 366 * 10e-6
    assert math.isclose(dropless.parts["host.moe"].exposed_s, m * layers * host_s, rel_tol=1e-9)
    # an H100 spends longer than 3.66 ms on this layer's GPU work (~7 ms), so token-drop hides all of it
    assert token_drop.parts["host.moe"].exposed_s == 0.0
    assert math.isclose(token_drop.parts["host.moe"].hidden_s, m * layers * host_s, rel_tol=1e-9)
    assert math.isclose(dropless.step_s - token_drop.step_s, m * layers * host_s, rel_tol=1e-9)
    # dense models launch no expert kernels
    assert "host.moe" not in estimate_step(Job(LLAMA8, tokens=1e12, seq_len=4096, global_batch=64),
                                           Layout(dp=8, micro_batch=1), cluster(8), CAL).parts


def test_grouped_expert_gemms_launch_once_for_all_local_experts_by_hand() -> None:
    # The same Qwen3-30B-A3B layer with a grouped GEMM over its 16 local experts (grouped_gemm's gmm, as NeMo
    # AutoModel runs them): the host launches one expert's 6 kernels instead of 16 x 6, so 26 + 6 = 32 per layer
    # forward, 3 x 32 = 96 with the backward, 0.96 ms per layer and micro-batch at 10 us a kernel. With 64 local
    # experts (ep 2) the grouped count is the same and the per-expert one grows to 26 + 6 x 64 = 410.
    qwen = CATALOG.model("qwen3-30b-a3b")
    job = Job(qwen, tokens=1e12, seq_len=4096, global_batch=64)
    m, layers = 8, 48
    for ep, per_expert_kernels in ((8, 366), (2, 3 * 410)):
        layout = Layout(tp=1, ep=ep, dp=8, micro_batch=1)
        grouped = estimate_step(job, layout, cluster(8), CAL, StepOptions(dp_overlap=False,
                                                                         moe_expert_kernels="grouped"))
        per_expert = estimate_step(job, layout, cluster(8), CAL, StepOptions(dp_overlap=False))
        assert math.isclose(grouped.parts["host.moe"].exposed_s, m * layers * 96 * 10e-6, rel_tol=1e-9)
        assert math.isclose(per_expert.parts["host.moe"].exposed_s, m * layers * per_expert_kernels * 10e-6,
                            rel_tol=1e-9)
        assert "host launches 96 kernels/layer" in grouped.parts["host.moe"].link


def test_cuda_graphed_router_and_preprocess_launch_once_by_hand() -> None:
    # Megatron-Bridge's Blackwell MoE presets capture the router and the dispatcher's preprocessing in CUDA graphs
    # (cuda_graph_modules moe_router, moe_preprocess). Their 10 + 6 of the layer's 26 fixed forward kernels become
    # one graph launch: 26 - 16 + 1 + 6 x 16 = 107 forward, 3 x 107 = 321 with the backward, 3.21 ms per layer and
    # micro-batch at 10 us (366 without graphs). The router alone: 26 - 10 + 1 + 96 = 113, 339 in all; the
    # attention's graph is not a MoE kernel and changes nothing here.
    qwen = CATALOG.model("qwen3-30b-a3b")
    job = Job(qwen, tokens=1e12, seq_len=4096, global_batch=64)
    layout = Layout(tp=1, ep=8, dp=8, micro_batch=1)
    m, layers = 8, 48
    for modules, kernels in ((("moe_router", "moe_preprocess"), 321), (("moe_router",), 339), (("attn",), 366),
                             ((), 366)):
        step = estimate_step(job, layout, cluster(8), CAL, StepOptions(dp_overlap=False,
                                                                        moe_cuda_graph_modules=modules))
        assert math.isclose(step.parts["host.moe"].exposed_s, m * layers * kernels * 10e-6, rel_tol=1e-9)
        assert (f"host launches {kernels} kernels/layer" in step.parts["host.moe"].link)
        assert ("CUDA graph" in step.parts["host.moe"].link) == ("moe_router" in modules)


def test_dedup_dispatch_across_nodes_sends_each_token_once_per_destination_node() -> None:
    # Qwen3-30B-A3B, ep 16 over 2 nodes (tp 1): plain all-to-all sends one copy per routed expert (8); DeepEP-style
    # dispatch sends one per destination node, 2·(1 − C(64,8)/C(128,8)) of them. At 64K tokens per rank the
    # all-to-all is bandwidth-bound (2.1 GB per rank, 22 ms; its 15 latency steps, 79 us, are 1.4 % of the
    # deduplicated 5.6 ms), so the EP part scales by that ratio within 2 %.
    qwen = CATALOG.model("qwen3-30b-a3b")
    job = Job(qwen, tokens=1e12, seq_len=65536, global_batch=16)
    layout = Layout(tp=1, ep=16, dp=16, micro_batch=1)
    plain = estimate_step(job, layout, cluster(16), CAL, StepOptions(dp_overlap=False))
    dedup = estimate_step(job, layout, cluster(16), CAL, StepOptions(dp_overlap=False, ep_dispatch="dedup"))
    miss = math.prod((128 - 64 - i) / (128 - i) for i in range(8))
    ratio = 2 * (1 - miss) / 8
    assert dedup.parts["comm.ep"].exposed_s / plain.parts["comm.ep"].exposed_s == pytest.approx(ratio, rel=0.02)
    assert "once per destination" in dedup.parts["comm.ep"].link



def test_dedup_dispatch_inside_one_node_sends_each_token_once_per_destination_gpu() -> None:
    # DeepEP's intranode dispatch sends a token to each GPU holding one of its experts once (is_token_in_rank):
    # ep 8 on one node, 16 of Qwen3-30B-A3B's 128 experts per GPU, top-8: 8·(1 − C(112,8)/C(128,8)) = 5.34 copies
    # instead of 8. At 64K tokens per rank (2.1 GB of dispatch) NVLink's latency steps are under 1 % of it.
    qwen = CATALOG.model("qwen3-30b-a3b")
    job = Job(qwen, tokens=1e12, seq_len=65536, global_batch=8)
    one_node = Layout(tp=1, ep=8, dp=8, micro_batch=1)
    plain = estimate_step(job, one_node, cluster(8), CAL, StepOptions(dp_overlap=False))
    dedup = estimate_step(job, one_node, cluster(8), CAL, StepOptions(dp_overlap=False, ep_dispatch="dedup"))
    miss = math.prod((112 - i) / (128 - i) for i in range(8))
    assert 8 * (1 - miss) == pytest.approx(5.34, abs=0.01)
    ratio = 8 * (1 - miss) / 8
    assert dedup.parts["comm.ep"].exposed_s / plain.parts["comm.ep"].exposed_s == pytest.approx(ratio, rel=0.02)
    assert "once per destination (5.3 of 8 copies)" in dedup.parts["comm.ep"].link


def test_overlapped_expert_all_to_all_hides_under_the_layer_compute() -> None:
    # Same job, 2 nodes: with --overlap-ep the all-to-all of each MoE layer runs under another micro-batch's
    # compute of that layer. Where the compute is longer, only the step's first and last phases (1 of the
    # m × layers granules) stay exposed; exposed + hidden is the whole all-to-all time.
    qwen = CATALOG.model("qwen3-30b-a3b")
    job = Job(qwen, tokens=1e12, seq_len=8192, global_batch=64)
    layout = Layout(tp=1, ep=16, dp=16, micro_batch=1)
    plain = estimate_step(job, layout, cluster(16), CAL)
    overlapped = estimate_step(job, layout, cluster(16), CAL, StepOptions(ep_comm_overlap=True))
    total = plain.parts["comm.ep"].exposed_s
    part = overlapped.parts["comm.ep"]
    assert part.exposed_s + part.hidden_s == pytest.approx(total)
    granules = overlapped.micro_batches * qwen.layers
    assert part.exposed_s == pytest.approx(total / granules)
    assert overlapped.step_s < plain.step_s
    # Over the TCP socket transport the all-to-all outlasts the layer's compute: what the compute covers is hidden,
    # the rest stays exposed, per layer and micro-batch: exposed = all-to-all − (forward + backward) compute.
    slow = Cluster(H100, DGX, 16, Fabric(CATALOG.network("socket")))
    plain_slow = estimate_step(job, layout, slow, CAL)
    overlapped_slow = estimate_step(job, layout, slow, CAL, StepOptions(ep_comm_overlap=True))
    compute_s = sum(plain_slow.parts[name].exposed_s for name in ("compute.gemm", "compute.attention",
                                                                 "compute.elementwise", "compute.recompute"))
    ep_plain = plain_slow.parts["comm.ep"].exposed_s
    assert ep_plain > compute_s
    assert overlapped_slow.parts["comm.ep"].exposed_s == pytest.approx(ep_plain - compute_s, rel=1e-6)
    assert overlapped_slow.parts["comm.ep"].hidden_s == pytest.approx(compute_s, rel=1e-6)


LAYOUTS = [
    Layout(tp=8, pp=1, dp=4, micro_batch=1, sequence_parallel=True, sharding="zero1", recompute="selective"),
    Layout(tp=4, pp=2, dp=4, micro_batch=2, sequence_parallel=True, recompute="full"),
    Layout(tp=2, pp=4, dp=4, vpp=2, micro_batch=1, sharding="zero1"),
    Layout(tp=1, pp=1, dp=32, micro_batch=1, sharding="zero3", recompute="full"),
    Layout(tp=8, pp=2, dp=2, micro_batch=1, sequence_parallel=True, recompute="full"),
]


@settings(max_examples=60, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), seq=st.sampled_from([2048, 4096, 8192]),
       model=st.sampled_from([LLAMA8, LLAMA70]), oversubscription=st.sampled_from([1.0, 2.0, 4.0]))
def test_a_step_never_beats_peak_flops(layout: Layout, seq: int, model: object, oversubscription: float) -> None:
    job = Job(model, tokens=1e12, seq_len=seq, global_batch=64)  # type: ignore[arg-type]
    step = estimate_step(job, layout, cluster(32, oversubscription, nodes_per_leaf=1), CAL)
    floor = step.model_flops_per_token * step.tokens_per_step / (H100.peak_flops("bf16") * 32)
    assert step.step_s >= floor
    assert 0 < step.mfu <= 1 and 0 < step.hfu <= 1
    assert step.hfu >= step.mfu * 0.999 or layout.recompute == "none"


@settings(max_examples=40, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), placement=st.sampled_from(["block", "scatter"]))
def test_more_oversubscription_never_speeds_a_step(layout: Layout, placement: str) -> None:
    job = Job(LLAMA70, tokens=1e12, seq_len=4096, global_batch=64)
    times = [estimate_step(job, layout, cluster(32, os_ratio, nodes_per_leaf=1),
                           CAL, StepOptions(placement=placement)).step_s  # type: ignore[arg-type]
             for os_ratio in (1.0, 2.0, 4.0, 8.0)]
    assert all(a <= b * (1 + 1e-12) for a, b in itertools.pairwise(times))


@settings(max_examples=30, deadline=None)
@given(tp=st.sampled_from([2, 4, 8]), seq=st.sampled_from([2048, 4096]))
def test_a_tp_group_moved_across_nodes_never_gets_faster(tp: int, seq: int) -> None:
    job = Job(LLAMA70, tokens=1e12, seq_len=seq, global_batch=64)
    inside = Layout(tp=tp, dp=64 // tp, micro_batch=1, sequence_parallel=True, sharding="zero3", recompute="full")
    across = inside.with_(order=("dp", "cp", "ep", "tp", "pp"))  # dp fastest: tp ranks land on other nodes
    c = cluster(64)
    tp_inside = estimate_step(job, inside, c, CAL).parts["comm.tp"]
    tp_across = estimate_step(job, across, c, CAL).parts["comm.tp"]
    assert "scale-up" in tp_inside.link and "NIC" in tp_across.link
    assert tp_across.exposed_s > tp_inside.exposed_s


def test_parts_add_up_to_the_step() -> None:
    job = Job(LLAMA70, tokens=1e12, seq_len=4096, global_batch=64)
    step = estimate_step(job, LAYOUTS[1], cluster(32), CAL)
    assert math.isclose(sum(p.exposed_s for p in step.parts.values()), step.step_s, rel_tol=1e-6)


@settings(max_examples=25, deadline=None)
@given(ep=st.sampled_from([2, 4, 8, 16, 32]), tp=st.sampled_from([1, 2]), micro_batch=st.sampled_from([1, 2]),
       gpus=st.sampled_from([16, 32, 64]))
def test_ep_overlap_and_dedup_dispatch_never_slow_a_step(ep: int, tp: int, micro_batch: int, gpus: int) -> None:
    qwen = CATALOG.model("qwen3-30b-a3b")
    dp = gpus // tp
    assume(ep <= gpus)
    layout = Layout(tp=tp, dp=dp, ep=ep, micro_batch=micro_batch, sequence_parallel=tp > 1)
    job = Job(qwen, tokens=1e12, seq_len=4096, global_batch=dp * micro_batch * 2)
    validate_layout(layout, qwen, gpus, job.global_batch, job.seq_len)
    plain = estimate_step(job, layout, cluster(gpus), CAL)
    for options in (StepOptions(ep_comm_overlap=True), StepOptions(ep_dispatch="dedup"),
                    StepOptions(ep_comm_overlap=True, ep_dispatch="dedup")):
        assert estimate_step(job, layout, cluster(gpus), CAL, options).step_s <= plain.step_s * (1 + 1e-12)


def test_block_recompute_adds_its_share_of_the_recompute_work() -> None:
    # Llama 3.1 8B, tp 2 + SP on one node: recomputing 8 of the 32 layers costs a quarter of full recompute's extra
    # forward, and adds a quarter of its extra TP all-reduce units to the exposed ones (3 per layer without
    # recompute, 5 with: 3 + 2 x 8/32 = 3.5; see the async-backward test below).
    job = Job(LLAMA8, tokens=1e12, seq_len=4096, global_batch=64)
    plain = Layout(tp=2, dp=4, micro_batch=1, sequence_parallel=True)
    full = estimate_step(job, plain.with_(recompute="full"), cluster(8), CAL)
    block = estimate_step(job, plain.with_(recompute="full", recompute_layers=8), cluster(8), CAL)
    none = estimate_step(job, plain, cluster(8), CAL)
    assert block.parts["compute.recompute"].exposed_s == pytest.approx(full.parts["compute.recompute"].exposed_s / 4)
    assert block.parts["comm.tp"].exposed_s == pytest.approx(none.parts["comm.tp"].exposed_s * 3.5 / 3)
    assert none.step_s < block.step_s < full.step_s


def test_activation_offload_copies_each_offloaded_layer_out_and_back_over_the_host_link() -> None:
    # Llama 3.1 8B, 8 of 32 layers offloaded, dp 8 on one H100 node (PCIe Gen5 x16: 64 GB/s x 0.8 per direction):
    # each offloaded layer's activations go to the host in forward and come back in backward; what the layer's
    # own forward or backward compute does not cover shows. On GB200 (NVLink-C2C, 450 GB/s) nothing shows.
    job = Job(LLAMA8, tokens=1e12, seq_len=4096, global_batch=16)
    layout = Layout(dp=8, micro_batch=2, sharding="zero1", offload_activation_layers=8)
    step = estimate_step(job, layout, cluster(8), CAL)
    part = step.parts["offload.activations"]
    layer_bytes = activation_bytes_per_layer(LLAMA8, layout, seq_len=4096, micro_batch=2)
    copy_s = layer_bytes / (64e9 * 0.8)
    assert part.exposed_s + part.hidden_s == pytest.approx(step.micro_batches * 8 * 2 * copy_s)
    plain = estimate_step(job, layout.with_(offload_activation_layers=None), cluster(8), CAL)
    assert step.step_s == pytest.approx(plain.step_s + part.exposed_s)
    gb200 = CATALOG.gpu("gb200")
    rack = Cluster(gb200, CATALOG.node_for_gpu("gb200"), 8, Fabric(CATALOG.network("ndr400")))
    fast = estimate_step(job, layout, rack, CATALOG.calibration("gb200")).parts["offload.activations"]
    assert fast.exposed_s == 0 and fast.hidden_s > 0



def test_megatron_hides_the_backward_input_gradient_reduction_by_hand() -> None:
    # Llama 3.1 8B, tp 2 on one node, one sequence of 4096, no recompute. Per layer and micro-batch, in units of one
    # all-reduce of the 4096 x 4096 x 2 B activation (33.5 MB): the forward all-reduces after the attention and MLP
    # row-parallel GEMMs (2, exposed); the backward all-reduces the input gradients of QKV and the MLP up GEMM
    # (2), which Megatron runs during their weight-gradient GEMMs (hidden: at tp 2 each GEMM outlasts it). Under
    # SP the forward's all-gathers and reduce-scatters are the same 2 units, the backward gathers the row GEMMs'
    # output gradients (1, exposed), reduce-scatters the input gradients (1, hidden) and re-gathers the sharded
    # inputs during the data-gradient GEMMs (1, hidden). Without the overlap (torchtitan's DTensor TP) both run
    # 4 units in line.
    from gpufleet.fabric.collectives import collective_cost
    from gpufleet.fabric.placement import group_span

    job = Job(LLAMA8, tokens=1e12, seq_len=4096, global_batch=1)
    for tp in (2, 8):
        c = cluster(tp)
        unit_s = collective_cost("all-reduce", 4096 * 4096 * 2, group_span(Layout(tp=tp), "tp", c), c).time_s
        for sequence_parallel, exposed, hidden in ((False, 2, 2), (True, 3, 2)):
            layout = Layout(tp=tp, micro_batch=1, sequence_parallel=sequence_parallel)
            megatron = estimate_step(job, layout, c, CAL).parts["comm.tp"]
            dtensor = StepOptions(tp_async_backward=False, memory=MemoryAssumptions(tp_gathered_inputs=True))
            inline = estimate_step(job, layout, c, CAL, dtensor).parts["comm.tp"]
            assert inline.exposed_s == pytest.approx(32 * 4 * unit_s, rel=1e-9) and inline.hidden_s == 0.0
            # --no-async-tensor-model-parallel-allreduce only governs the all-reduce without SP: under SP Megatron
            # always reduce-scatters during the weight-gradient GEMM and re-gathers during the data-gradient GEMM
            no_async = estimate_step(job, layout, c, CAL, StepOptions(tp_async_backward=False)).parts["comm.tp"]
            if sequence_parallel:
                assert no_async == megatron
            else:
                assert no_async.exposed_s == pytest.approx(32 * 4 * unit_s, rel=1e-9) and no_async.hidden_s == 0.0
            layer = layer_compute(LLAMA8, layout, H100, CAL, seq_len=4096, precision="bf16", moe_layer=False)
            # the column GEMMs' forward times: QKV (4096 + 2 x 1024 wide) and the gated up-projection (2 x 14336)
            assert layer.qkv_gemm_fwd_s == pytest.approx(gemm_time_s(4096, 6144 / tp, 4096, 989.4e12, CAL, "bf16"))
            assert layer.mlp_up_gemm_fwd_s == pytest.approx(gemm_time_s(4096, 28672 / tp, 4096, 989.4e12, CAL,
                                                                        "bf16"))
            if tp == 2:
                assert megatron.exposed_s == pytest.approx(32 * exposed * unit_s, rel=1e-9)
                assert megatron.hidden_s == pytest.approx(32 * hidden * unit_s, rel=1e-9)
            else:
                # at tp 8 the sharded GEMMs are shorter than the reductions: each hides only its own length
                windows = (layer.qkv_gemm_fwd_s, layer.mlp_up_gemm_fwd_s)
                reductions = ((0.5, 0.5) if sequence_parallel else (1.0,))  # input gradient (+ input re-gather)
                per_layer = sum(min(share * unit_s, window) for window in windows for share in reductions)
                assert layer.qkv_gemm_fwd_s < unit_s
                assert megatron.hidden_s == pytest.approx(32 * per_layer, rel=1e-9)
                assert megatron.exposed_s + megatron.hidden_s == pytest.approx(32 * (exposed + hidden) * unit_s)


def test_op_level_checkpointing_re_runs_the_tp_gathers_by_hand() -> None:
    # torchtitan's op-level policy keeps reduce-scatter outputs but not all-gathers: with tp 2 + SP each block's
    # recomputation re-gathers the column GEMM's input (half an all-reduce unit), 1 unit per layer on top of
    # DTensor TP's 4 in-line units.
    from gpufleet.fabric.collectives import collective_cost
    from gpufleet.fabric.placement import group_span

    job = Job(LLAMA8, tokens=1e12, seq_len=4096, global_batch=1)
    c = cluster(2)
    unit_s = collective_cost("all-reduce", 4096 * 4096 * 2, group_span(Layout(tp=2), "tp", c), c).time_s
    layout = Layout(tp=2, micro_batch=1, sequence_parallel=True, recompute="selective")
    titan = StepOptions(tp_async_backward=False,
                        memory=MemoryAssumptions(selective_policy="op", tp_gathered_inputs=True))
    assert estimate_step(job, layout, c, CAL, titan).parts["comm.tp"].exposed_s == pytest.approx(32 * 5 * unit_s)
    # the same DTensor TP under the attention-core policy re-runs no collectives
    attention_policy = StepOptions(tp_async_backward=False, memory=MemoryAssumptions(tp_gathered_inputs=True))
    assert estimate_step(job, layout, c, CAL, attention_policy).parts["comm.tp"].exposed_s == pytest.approx(
        32 * 4 * unit_s)


def test_moe_layers_tp_blocks_by_hand() -> None:
    # A MoE layer's own TP traffic is its attention block; shared experts are a TP MLP of their own, and DTensor TP
    # also gathers the MoE input for the router and reduce-scatters the output. Qwen3-30B-A3B (no shared experts),
    # tp 2 + SP, ep 8, 48 layers, one sequence of 4096 (2048 x 4096 x 2 B per all-reduce unit), no async windows
    # needed: DTensor runs 2 units per block in line.
    from gpufleet.fabric.collectives import collective_cost
    from gpufleet.fabric.placement import group_span

    qwen = CATALOG.model("qwen3-30b-a3b")
    job = Job(qwen, tokens=1e12, seq_len=4096, global_batch=8)
    c = cluster(16)
    layout = Layout(tp=2, ep=8, dp=8, micro_batch=1, sequence_parallel=True, expert_tp=1)
    unit_s = collective_cost("all-reduce", 4096 * 2048 * 2, group_span(layout, "tp", c), c).time_s
    dtensor = StepOptions(tp_async_backward=False, memory=MemoryAssumptions(tp_gathered_inputs=True))
    megatron_inline = StepOptions(tp_async_backward=False)
    per_layer = {name: estimate_step(job, layout, c, CAL, options).parts["comm.tp"].exposed_s / 48
                 for name, options in (("dtensor", dtensor), ("megatron", megatron_inline))}
    assert per_layer["dtensor"] == pytest.approx(2 * 2 * unit_s)  # attention + the MoE block, 2 units each
    # Megatron: attention only; of its 2.5 units under SP the reduce-scatter and the re-gather (1) hide under QKV
    assert per_layer["megatron"] == pytest.approx(1.5 * unit_s)


def test_cross_entropy_moves_its_op_sequence_bytes_by_hand() -> None:
    # Megatron's unfused vocab-parallel cross-entropy per logit: upcast (2 + 4), max (4), subtract (4 + 4), exp
    # (4 + 4), row sum (4), divide (4 + 4); backward scale (4 + 4) and cast back (4 + 2): 52 bytes. Llama 3 8B, one
    # sequence of 8192 at tp 2: 8192 x 128256 / 2 logits on 3.35 TB/s x 0.8; the head GEMM is the rest.
    from gpufleet.perf.compute import CROSS_ENTROPY_BYTES_PER_LOGIT, logits_compute_s

    assert CROSS_ENTROPY_BYTES_PER_LOGIT == (2 + 4) + 4 + (4 + 4) + (4 + 4) + 4 + (4 + 4) + (4 + 4) + (4 + 2)
    layout = Layout(tp=2, micro_batch=1)
    head_s = 3 * gemm_time_s(8192, 128256 / 2, 4096, 989.4e12, CAL, "bf16")
    loss_s = 8192 * 128256 / 2 * 52 / (3.35e12 * 0.8)
    total_s, _ = logits_compute_s(LLAMA8, layout, H100, CAL, seq_len=8192, precision="bf16")
    assert math.isclose(total_s, head_s + loss_s, rel_tol=1e-9)
    fused_s, _ = logits_compute_s(LLAMA8, layout, H100, CAL, seq_len=8192, precision="bf16", loss_bytes_per_logit=40)
    assert math.isclose(total_s - fused_s, 8192 * 128256 / 2 * 12 / (3.35e12 * 0.8), rel_tol=1e-9)


@pytest.mark.parametrize("layout", [
    Layout(tp=4, sequence_parallel=True, ep=32, dp=512, sharding="zero3", recompute="full", micro_batch=1),
    Layout(tp=2, sequence_parallel=True, ep=128, dp=1024, sharding="zero3", recompute="full", micro_batch=1),
])
def test_gradient_traffic_cannot_hide_behind_expert_traffic_on_the_same_nics(layout: Layout) -> None:
    # DeepSeek-V3 on 2,048 H100s: the expert all-to-all and the ZeRO-3 gathers/reductions both leave the node
    # through the same NICs, so the NICs' busy time — all of the data-parallel traffic plus the all-to-all the
    # step exposes — is a lower bound on the step.
    model = CATALOG.model("deepseek-v3")
    job = Job(model=model, tokens=int(1e12), seq_len=4096, global_batch=2048, precision="fp8")
    big = cluster(2048)
    validate_layout(layout, model, big.gpus, job.global_batch, job.seq_len)
    step = estimate_step(job, layout, big, CAL, StepOptions())
    assert step.parts["comm.ep"].link.startswith("ndr400") and step.parts["comm.dp"].link.startswith("ndr400")
    nic_busy_s = step.parts["comm.dp"].total_s + step.parts["comm.ep"].exposed_s
    assert step.step_s >= nic_busy_s


def test_a_full_recompute_that_stops_early_skips_the_down_projection_by_hand() -> None:
    # Llama 3 8B layer, tp 1, one sequence of 8192 tokens: the down projection is an 8192 x 4096 x 14336 GEMM,
    # 2·8192·4096·14336 = 962 GFLOP. A full recompute that stops early (PyTorch's non-reentrant checkpoint,
    # tests/test_recompute_early_stop.py) re-runs the forward less exactly that GEMM; one that does not, all of it.
    from gpufleet.perf.compute import recompute_stops_early

    compute = layer_compute(LLAMA8, Layout(micro_batch=1), H100, CAL, seq_len=8192, precision="bf16",
                            moe_layer=False)
    down_s = gemm_time_s(8192, 4096, 14336, H100.peak_flops("bf16"), CAL, "bf16")
    assert math.isclose(compute.mlp_down_gemm_flops_fwd, 2 * 8192 * 4096 * 14336, rel_tol=1e-12)
    assert math.isclose(compute.recompute_s("full"), compute.forward_s, rel_tol=1e-12)
    assert math.isclose(compute.recompute_s("full", early_stop=True), compute.forward_s - down_s, rel_tol=1e-9)
    assert math.isclose(compute.recompute_flops("full") - compute.recompute_flops("full", early_stop=True),
                        2 * 8192 * 4096 * 14336, rel_tol=1e-12)
    # the 8B layer's down projection is 14336·4096 of its 218 M GEMM parameters per token: about 27 % of its GEMMs
    assert 0.25 < down_s / compute.gemm_fwd_s < 0.29
    # selective recompute and no recompute are untouched
    assert compute.recompute_s("selective", early_stop=True) == compute.recompute_s("selective")
    assert compute.recompute_s("none", early_stop=True) == 0.0
    # which GEMMs stop early: 16-bit aten GEMMs; FP8 ones (custom autograd Functions) only in a compiled block
    assert not recompute_stops_early("off", "bf16", compiled=True)
    assert recompute_stops_early("aten", "bf16", compiled=False)
    assert not recompute_stops_early("aten", "fp8", compiled=True)
    assert recompute_stops_early("aten-or-compiled", "fp8", compiled=True)
    assert not recompute_stops_early("aten-or-compiled", "fp8", compiled=False)


def test_a_stack_that_stops_early_shortens_only_the_recompute_part() -> None:
    # torchtitan@0.1 against torchtitan (the same settings but the early stop): on a full-recompute 8B FSDP job the
    # step's recompute part shrinks by m x layers x the down projection; every other compute part is the same.
    from gpufleet.planner.published_runs import stack_step_options

    job = Job(LLAMA8, tokens=1e12, seq_len=8192, global_batch=8)
    layout = Layout(dp=8, micro_batch=1, sharding="fsdp", recompute="full")
    estimates = {}
    for stack in ("torchtitan", "torchtitan@0.1"):
        options = stack_step_options(CATALOG.stack(stack), StepOptions())
        estimates[stack] = estimate_step(job, layout, cluster(8), CAL, options)
    plain, early = estimates["torchtitan"].parts, estimates["torchtitan@0.1"].parts
    down_s = gemm_time_s(8192, 4096, 14336, H100.peak_flops("bf16"), CAL, "bf16")
    assert math.isclose(plain["compute.recompute"].exposed_s - early["compute.recompute"].exposed_s,
                        32 * down_s, rel_tol=1e-9)
    for part in ("compute.gemm", "compute.attention", "compute.elementwise"):
        assert plain[part] == early[part]
