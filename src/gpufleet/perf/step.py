"""StepEstimate: seconds per optimizer step, part by part, each split into exposed and hidden time.

A step = the pipeline's critical path over all micro-batches (compute + exposed per-layer
communication on the slowest stage, plus the bubble) + the data-parallel synchronisation that
backward could not hide + the optimizer update + a fixed per-step overhead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.records import ModelSpec
from gpufleet.errors import InputError
from gpufleet.fabric.collectives import CollectiveCost, Op, collective_cost
from gpufleet.fabric.placement import GroupKind, GroupSpan, Placement, group_span
from gpufleet.fabric.topology import Cluster
from gpufleet.parallel.activations import activation_bytes_per_layer
from gpufleet.parallel.layout import (
    Layout,
    expert_parallel_degrees,
    expert_routed_tokens,
    local_expert_tokens,
    micro_batches_per_step,
    recomputed_fraction,
    stage_layer_split,
)
from gpufleet.parallel.memory import DEFAULT_ASSUMPTIONS, MemoryAssumptions
from gpufleet.perf.compute import (
    ACTIVATION_BYTES,
    CROSS_ENTROPY_BYTES_PER_LOGIT,
    LayerCompute,
    layer_compute,
    logits_compute_s,
)
from gpufleet.perf.dp_scaling import straggler_s
from gpufleet.perf.fsdp_overheads import fsdp2_copy_s
from gpufleet.perf.overlap_contention import COLLECTIVE_PARTS, contention_s
from gpufleet.workload.flops import flops_per_token
from gpufleet.workload.job import Job
from gpufleet.workload.params import embedding_params, layer_params, output_params

#: Share of the GPU-to-CPU link's line rate that pinned-memory copies reach (judgement: cudaMemcpy over PCIe Gen5
#: x16 moves ~50-55 of 64 GB/s).
HOST_LINK_FRACTION = 0.8
#: Megatron DDP's gradient bucket (elements); each bucket is one collective with its own latency.
DP_BUCKET_ELEMENTS = 40e6
#: Mixed-precision Adam update traffic per parameter: fp32 grad read (4), master, m, v read+write (24),
#: bf16 weight write (2).
OPTIMIZER_BYTES_PER_PARAM = 30
#: Kernels the host launches for one MoE layer's forward pass in Megatron-Core (alltoall dispatcher, Transformer
#: Engine grouped experts): router GEMM, top-k/softmax and the auxiliary losses (~10), dispatch bookkeeping,
#: permute, all-to-all and local sort (~10), un-permute, all-to-all back and combine (~6) = 26 per layer, plus
#: per local expert an input cast and a GEMM for fc1 and for fc2 and the activation's cast (~6). Backward
#: launches about twice that (data- and weight-gradient GEMMs). Counted from the code path (judgement).
MOE_FIXED_KERNELS_FWD = 26
MOE_KERNELS_PER_LOCAL_EXPERT_FWD = 6
BACKWARD_KERNEL_RATIO = 2.0


@dataclass(frozen=True)
class StepOptions:
    """Framework behaviours the step model needs; defaults follow Megatron-Core's recommended settings."""

    placement: Placement = "block"
    tp_comm_overlap: bool = False  # userbuffers TP overlap (off by default in Megatron-LM)
    #: Megatron overlaps a column-parallel GEMM's backward input-gradient all-reduce with its weight-gradient GEMM
    #: (--no-async-tensor-model-parallel-allreduce turns it off; under SP it always overlaps the reduce-scatter);
    #: PyTorch's DTensor TP (torchtitan without AsyncTP) and the 2021 Megatron stacks run it in line
    tp_async_backward: bool = True
    #: HBM bytes the cross-entropy moves per logit (compute.CROSS_ENTROPY_BYTES_PER_LOGIT: Megatron's unfused 52;
    #: 40 fused or PyTorch's)
    loss_bytes_per_logit: float = CROSS_ENTROPY_BYTES_PER_LOGIT
    dp_overlap: bool = True  # --overlap-grad-reduce / --overlap-param-gather, FSDP prefetch
    ep_imbalance: float = 1.2  # slowest expert rank / mean under top-k routing (judgement)
    step_overhead_s: float = 0.005  # data loading, logging, launch gaps per step (judgement)
    fabric_model: Literal["analytical", "sim"] = "analytical"  # sim: flow-level simulator (slower)
    memory: MemoryAssumptions = DEFAULT_ASSUMPTIONS  # what the framework keeps in memory (gradient dtype, ...)
    moe_dropless: bool = True  # Megatron-Core's default routing; False = capacity-bounded (token-drop)
    #: norms, rotary and the gated activation run as fused kernels (Transformer Engine, Apex, torch.compile);
    #: False: eager PyTorch, one kernel per op and an fp32 RMSNorm (torchtitan without --training.compile)
    fused_elementwise: bool = True
    #: the expert all-to-all runs while another micro-batch computes (DualPipe; Megatron-Core's
    #: --overlap-moe-expert-parallel-comm); only what the layer's compute cannot cover stays exposed
    ep_comm_overlap: bool = False
    #: "dedup": a token is sent once per destination, not once per routed expert: once per node over the network
    #: (forwarded over NVLink there) and, inside one node, once per GPU (DeepEP / HybridEP, DeepSeek-V3's
    #: dispatch); "all-to-all": one copy per routed expert (Megatron-Core's alltoall dispatcher)
    ep_dispatch: Literal["all-to-all", "dedup"] = "all-to-all"
    #: relative spread of per-GPU speed: the step waits for the slowest of the job's GPUs (perf/dp_scaling.py;
    #: dp_scaling.GPU_SPEED_SIGMA is the sourced value); 0: off. Scope "job": over a median GPU; "replicas": only
    #: what dp adds over one replica of tp*pp*cp GPUs
    straggler_sigma: float = 0.0
    straggler_scope: Literal["job", "replicas"] = "job"
    #: FSDP2's all-gather copy-out and reduce-scatter copy-in on the compute stream (perf/fsdp_overheads.py); for
    #: fully sharded layouts of stacks that run PyTorch's fully_shard; off: FSDP1, Megatron's buffers
    fsdp2_copies: bool = False
    #: compute that runs under a hidden collective runs this much slower (perf/overlap_contention.py:
    #: OVERLAP_COMPUTE_SLOWDOWN is the measured 18.9 %); 0: hidden collectives are free
    overlap_slowdown: float = 0.0


@dataclass(frozen=True, slots=True)
class Part:
    """One part of a step: seconds on the critical path (exposed) and overlapped (hidden)."""

    exposed_s: float
    hidden_s: float = 0.0
    link: str = ""

    @property
    def total_s(self) -> float:
        return self.exposed_s + self.hidden_s


@dataclass(frozen=True)
class StepEstimate:
    """Seconds per step by part, with throughput and utilisation."""

    step_s: float
    parts: dict[str, Part]
    tokens_per_step: int
    gpus: int
    model_flops_per_token: float
    hardware_flops_per_step_per_gpu: float
    peak_flops: float
    bubble_fraction: float
    micro_batches: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.gpus

    @property
    def mfu(self) -> float:
        """Model FLOPs (gpufleet's convention, see workload.flops) / peak of the job's GEMM precision."""
        return self.model_flops_per_token * self.tokens_per_s_per_gpu / self.peak_flops

    @property
    def hfu(self) -> float:
        """Hardware FLOPs actually executed (recompute included) / peak."""
        return self.hardware_flops_per_step_per_gpu / self.step_s / self.peak_flops


def _overlap(comm_s: float, window_s: float, granules: int) -> tuple[float, float]:
    """(exposed, hidden) when `comm_s` overlaps a compute window; the first/last granule never hides."""
    if comm_s <= 0:
        return 0.0, 0.0
    exposed = max(comm_s - window_s, comm_s / max(granules, 1))
    return exposed, comm_s - exposed


@dataclass(frozen=True, slots=True)
class _StageParams:
    dense: float  # parameters synchronised over dp*cp, per GPU
    expert: float  # routed-expert parameters synchronised over the expert-data-parallel group, per GPU


def stage_parameters(job: Job, layout: Layout, stage: int) -> _StageParams:
    """Parameters held by one GPU of pipeline stage `stage` (after tp, ep sharding)."""
    model = job.model
    first_moe = model.layers if model.moe is None else model.moe.dense_layers
    n_dense, n_moe = stage_layer_split(model.layers, layout.pp, layout.vpp, first_moe)[stage]
    etp, _ = expert_parallel_degrees(layout)
    dense = 0.0
    expert = 0.0
    for count, index in ((n_dense, 0), (n_moe, model.layers - 1)):
        if count == 0:
            continue
        layer = layer_params(model, index)
        dense += count * ((layer.attention + layer.dense_mlp + layer.shared_experts) / layout.tp
                          + layer.norms + layer.router)
        expert += count * layer.routed_experts / (layout.ep * etp)
    if stage == 0:
        dense += embedding_params(model) / layout.tp
    if stage == layout.pp - 1:
        dense += output_params(model) / layout.tp
    return _StageParams(dense, expert)


def _cost(op: Op, nbytes: float, kind: GroupKind, layout: Layout, cluster: Cluster,
          options: StepOptions) -> CollectiveCost:
    span = group_span(layout, kind, cluster, options.placement)
    if options.fabric_model == "sim" and span.size > 1 and nbytes > 0:
        return _simulated_cost(op, nbytes, span, cluster, options.placement)
    return collective_cost(op, nbytes, span, cluster)


@lru_cache(maxsize=1024)
def _simulated_cost(op: Op, nbytes: float, span: GroupSpan, cluster: Cluster, placement: Placement) -> CollectiveCost:
    """The flow-level simulator's time for this collective on this cluster's topology graph."""
    from gpufleet.fabric.simulate import simulate_collective

    result = simulate_collective(op, nbytes, span, cluster, placement=placement)
    where = ", ".join(f"{b.tier} ({b.links} links saturated)" for b in result.bottlenecks[:1]) or "no bottleneck"
    return CollectiveCost(op, nbytes, span.size, result.time_s, result.bus_bytes_per_s,
                          f"simulated {result.algorithm}: {where} ({result.bus_bytes_per_s / 1e9:.0f} GB/s bus)")


def _chunked_s(op: Op, nbytes: float, chunks: int, kind: GroupKind, layout: Layout, cluster: Cluster,
               options: StepOptions) -> tuple[float, str]:
    """Seconds for `nbytes` moved as `chunks` equal collectives (each pays its own latency), and the link."""
    chunks = max(1, chunks)
    one = _cost(op, nbytes / chunks, kind, layout, cluster, options)
    return chunks * one.time_s, one.link


@dataclass(frozen=True, slots=True)
class _DataParallelComm:
    exposed_s: float
    total_s: float
    link: str


def _data_parallel(layout: Layout, cluster: Cluster, options: StepOptions, params: _StageParams, *,
                   micro_batches: int, stage_layers: int, compute_per_micro_batch_s: float,
                   grad_wire_bytes: float) -> _DataParallelComm:
    """Gradient reduction and parameter gathering over dp*cp (and the expert-data-parallel group).

    FSDP/ZeRO-3 gather and reduce one transformer block at a time, every micro-batch (reshard after
    forward, no gradient-accumulation no_sync); DDP and the distributed optimizer reduce once per step
    in buckets of DP_BUCKET_ELEMENTS, overlapping the last micro-batch's backward (the parameter
    all-gather overlaps the next step's first forward). Each collective pays its own latency.
    """
    if layout.dp * layout.cp <= 1:
        return _DataParallelComm(0.0, 0.0, "")
    sharded = layout.sharding in ("zero3", "fsdp", "hsdp")
    units = stage_layers if sharded else math.ceil(params.dense / DP_BUCKET_ELEMENTS)
    reduce_op: Op = "all-reduce" if layout.sharding == "none" else "reduce-scatter"
    reduce_s, link = _chunked_s(reduce_op, params.dense * grad_wire_bytes, units, "dp_cp", layout, cluster, options)
    gather_s = 0.0
    if layout.sharding != "none":
        gather_s, _ = _chunked_s("all-gather", params.dense * ACTIVATION_BYTES, units, "dp_cp", layout, cluster,
                                 options)
    if params.expert and expert_parallel_degrees(layout)[1] > 1:
        expert_units = stage_layers if sharded else math.ceil(params.expert / DP_BUCKET_ELEMENTS)
        more, _ = _chunked_s(reduce_op, params.expert * grad_wire_bytes, expert_units, "edp", layout, cluster,
                             options)
        reduce_s += more
        if layout.sharding != "none":
            more, _ = _chunked_s("all-gather", params.expert * ACTIVATION_BYTES, expert_units, "edp", layout,
                                 cluster, options)
            gather_s += more
    forward_window = compute_per_micro_batch_s / 3
    backward_window = compute_per_micro_batch_s * 2 / 3
    granules = max(stage_layers, 1)
    if sharded:
        total = micro_batches * (2 * gather_s + reduce_s)
        if not options.dp_overlap:
            return _DataParallelComm(total, total, link)
        forward_exposed, _ = _overlap(gather_s, forward_window, granules)
        backward_exposed, _ = _overlap(gather_s + reduce_s, backward_window, granules)
        return _DataParallelComm(micro_batches * (forward_exposed + backward_exposed), total, link)
    total = reduce_s + gather_s
    if not options.dp_overlap:
        return _DataParallelComm(total, total, link)
    reduce_exposed, _ = _overlap(reduce_s, backward_window, granules)
    gather_exposed, _ = _overlap(gather_s, forward_window, granules)
    return _DataParallelComm(reduce_exposed + gather_exposed, total, link)


def _optimizer_s(layout: Layout, cluster: Cluster, calibration: CalibrationProfile, params: _StageParams) -> float:
    """Adam over this GPU's shard of the parameters: HBM-bound (CPU-bound when offloaded)."""
    shard = layout.dp * layout.cp if layout.sharding != "none" else 1
    expert_shard = expert_parallel_degrees(layout)[1] if layout.sharding != "none" else 1
    local_params = params.dense / shard + params.expert / expert_shard
    seconds = local_params * calibration.optimizer_seconds_per_param(
        OPTIMIZER_BYTES_PER_PARAM / (cluster.gpu.hbm_bytes_per_s * calibration.hbm_fraction))
    if layout.offload_optimizer:
        seconds *= 10.0  # CPU Adam over host memory: ~10x slower than HBM (judgement)
    return seconds


def _activation_offload_s(job: Job, layout: Layout, cluster: Cluster, options: StepOptions,
                          layers: tuple[tuple[LayerCompute | None, bool], ...]) -> tuple[float, float, str]:
    """(exposed, hidden, link) seconds per micro-batch of CPU activation offloading: each offloaded layer's saved
    activations go to the host while later layers compute forward and come back while earlier ones compute
    backward; a copy longer than that compute shows."""
    count = layout.offload_activation_layers or 0
    if not count:
        return 0.0, 0.0, ""
    link_gbytes = cluster.gpu.host_link_gbytes_per_s
    if link_gbytes is None:
        raise InputError(f"{cluster.gpu.id} has no host link (host_link_gbytes_per_s) in the catalog; activation "
                         "offloading needs it")
    bandwidth = link_gbytes * 1e9 * HOST_LINK_FRACTION
    model = job.model
    moe_from = model.layers if model.moe is None else model.moe.dense_layers
    exposed = hidden = 0.0
    for compute, moe in layers:
        if compute is None:
            continue
        share = (model.layers - moe_from if moe else moe_from) / model.layers
        nbytes = activation_bytes_per_layer(model, layout, seq_len=job.seq_len, micro_batch=layout.micro_batch,
                                            moe_layer=moe, flash_attention=options.memory.flash_attention,
                                            dropout=options.memory.dropout, recompute="none",
                                            fp8=job.precision == "fp8")
        copy_s = nbytes / bandwidth
        shown = max(0.0, copy_s - compute.forward_s) + max(0.0, copy_s - compute.backward_s)
        exposed += count * share * shown
        hidden += count * share * (2 * copy_s - shown)
    return exposed, hidden, f"host link {link_gbytes:g} GB/s x {HOST_LINK_FRACTION:g}"


def expected_destinations(experts: int, top_k: int, destinations: int) -> float:
    """Distinct destinations (nodes or GPUs) a token's top_k experts land on, experts spread evenly over
    `destinations` and chosen uniformly without replacement: N · (1 − C(E − E/N, k) / C(E, k))."""
    per_destination = experts / destinations
    miss = 1.0
    for i in range(top_k):
        miss *= max(0.0, experts - per_destination - i) / (experts - i)
    return destinations * (1.0 - miss)


def _moe_host_s(model: ModelSpec, layout: Layout, host_s_per_kernel: float, recomputed: float) -> float:
    """Host seconds to launch one MoE layer's kernels for one micro-batch: forward, backward and, for the
    `recomputed` share of layers, the forward again."""
    if model.moe is None:
        return 0.0
    local_experts = model.moe.experts / layout.ep
    forward = MOE_FIXED_KERNELS_FWD + MOE_KERNELS_PER_LOCAL_EXPERT_FWD * local_experts
    passes = 1.0 + BACKWARD_KERNEL_RATIO + recomputed
    return forward * passes * host_s_per_kernel


def estimate_step(job: Job, layout: Layout, cluster: Cluster, calibration: CalibrationProfile,
                  options: StepOptions | None = None) -> StepEstimate:
    """Estimate one optimizer step of `job` with `layout` on `cluster` (layout assumed valid)."""
    options = options or StepOptions()
    model = job.model
    seq = job.seq_len
    m = micro_batches_per_step(layout, job.global_batch)
    pp, vpp = layout.pp, layout.vpp
    per_stage_layers = math.ceil(model.layers / pp)
    moe_from = model.layers if model.moe is None else model.moe.dense_layers
    tokens_mb = layout.micro_batch * seq / layout.cp  # tokens one GPU processes per micro-batch

    dense_layer = layer_compute(model, layout, cluster.gpu, calibration, seq_len=seq, precision=job.precision,
                                moe_layer=False, fused_elementwise=options.fused_elementwise) if moe_from > 0 else None
    moe_layer = layer_compute(model, layout, cluster.gpu, calibration, seq_len=seq, precision=job.precision,
                              moe_layer=True, fused_elementwise=options.fused_elementwise) \
        if moe_from < model.layers else None

    # --- per-layer communication, per micro-batch -------------------------------------------
    act_bytes = tokens_mb * model.hidden * ACTIVATION_BYTES
    recomputed = recomputed_fraction(layout, per_stage_layers)  # share of layers whose forward runs twice

    def recompute_s(compute: LayerCompute) -> float:
        """The layer's recompute time, averaged over the stage's layers (block recompute covers a share)."""
        return (compute.recompute_s(layout.recompute, options.memory.selective_policy)
                * (recomputed if layout.recompute == "full" else 1.0))

    tp_cost = _cost("all-reduce", act_bytes, "tp", layout, cluster, options)
    sp = layout.sequence_parallel and layout.tp > 1

    def tp_block_s(column_gemm_fwd_s: float) -> tuple[float, float]:
        """(exposed, hidden) TP seconds of one block (a column- then a row-parallel GEMM) in all-reduce units
        (an all-gather or a reduce-scatter moves half what an all-reduce moves). Forward (and a recomputed
        forward): one all-reduce, or SP's all-gather + reduce-scatter. Backward: the column GEMM's input gradient
        is all-reduced (reduce-scattered under SP) and, under SP, the row GEMM's output gradient all-gathered.
        Megatron (and Megatron-DeepSpeed) keep only the sharded input under SP, re-gather it during the
        data-gradient GEMM and reduce-scatter the input gradient during the weight-gradient GEMM
        (LinearWithGradAccumulationAndAsyncCommunication); without SP they all-reduce it during the
        weight-gradient GEMM unless --no-async-tensor-model-parallel-allreduce (`tp_async_backward`). DTensor TP
        keeps the gathered input (`MemoryAssumptions.tp_gathered_inputs`) and runs the reduction in line. Each
        window is about the column GEMM's forward time. torchtitan's op-level selective checkpointing saves
        reduce-scatter outputs but re-runs the all-gather before the column GEMM (the all-reduce without SP)."""
        if layout.tp <= 1:
            return 0.0, 0.0
        exposed = (1 + recomputed + (0.5 if sp else 0.0)) * tp_cost.time_s
        if layout.recompute == "selective" and options.memory.selective_policy == "op":
            exposed += (0.5 if sp else 1.0) * tp_cost.time_s
        input_grad = (0.5 if sp else 1.0) * tp_cost.time_s
        megatron_sp = sp and not options.memory.tp_gathered_inputs
        regather = 0.5 * tp_cost.time_s if megatron_sp else 0.0
        hidden = min(regather, column_gemm_fwd_s)
        if options.tp_async_backward or megatron_sp:
            hidden += min(input_grad, column_gemm_fwd_s)
        return exposed + input_grad + regather - hidden, hidden

    def tp_layer_s(compute: LayerCompute | None, moe: bool) -> tuple[float, float]:
        """A layer's TP seconds: attention and MLP blocks. A MoE layer's routed experts gather over etp instead
        (below); its shared experts are a TP MLP of their own, and DTensor TP gathers the MoE input for the router
        and reduce-scatters the output (one block either way)."""
        if compute is None:
            return 0.0, 0.0
        attention = tp_block_s(compute.qkv_gemm_fwd_s)
        mlp_block = not moe or bool(model.moe and model.moe.shared_experts) or options.memory.tp_gathered_inputs
        mlp = tp_block_s(compute.mlp_up_gemm_fwd_s) if mlp_block else (0.0, 0.0)
        return attention[0] + mlp[0], attention[1] + mlp[1]

    (tp_per_layer_s, tp_hidden_per_layer_s) = tp_layer_s(dense_layer, False)
    (moe_tp_per_layer_s, moe_tp_hidden_per_layer_s) = tp_layer_s(moe_layer, True)

    cp_per_layer_s = 0.0
    cp_hidden_per_layer_s = 0.0
    cp_link = ""
    if layout.cp > 1:
        kv_bytes = tokens_mb * 2 * model.kv_heads * model.head_dim_ * ACTIVATION_BYTES / max(
            1, min(layout.tp, model.kv_heads))
        hop = _cost("send-recv", kv_bytes, "cp", layout, cluster, options)
        cp_link = hop.link
        layer_for_cp = dense_layer if dense_layer is not None else moe_layer
        # Ring attention: cp-1 hops forward, 2x that backward (KV and their gradients), each hop
        # overlapping one block of attention compute.
        comm = 3 * (layout.cp - 1) * hop.time_s
        window = (layer_for_cp.attention_fwd_s + layer_for_cp.attention_bwd_s) if layer_for_cp else 0.0
        exposed, hidden = _overlap(comm, window, layout.cp)
        cp_per_layer_s, cp_hidden_per_layer_s = exposed, hidden

    ep_per_layer_s = 0.0
    ep_link = ""
    etp, _ = expert_parallel_degrees(layout)
    ep_nodes = group_span(layout, "ep", cluster, options.placement).nodes if layout.ep > 1 else 1
    if model.moe is not None and (layout.ep > 1 or etp > 1):
        # Megatron-Core's alltoall dispatcher: each rank sends the tokens it routes itself over the EP group, then
        # the etp ranks that share an expert all-gather what they received (reduce-scatter on the way back).
        passes = 4 + 2 * recomputed  # dispatch + combine, forward and backward (and the recomputed forward)
        links = []
        if layout.ep > 1:
            copies = float(model.moe.top_k)
            if options.ep_dispatch == "dedup":  # DeepEP's layout: is the token bound for this node / this GPU
                destinations = ep_nodes if ep_nodes > 1 else layout.ep  # the network, else NVLink, is the cost
                copies = expected_destinations(model.moe.experts, model.moe.top_k, destinations)
            dispatch_bytes = local_expert_tokens(layout, tokens_mb) * copies * model.hidden * ACTIVATION_BYTES
            a2a = _cost("all-to-all", dispatch_bytes, "ep", layout, cluster, options)
            ep_per_layer_s += passes * a2a.time_s * options.ep_imbalance
            links.append(a2a.link + (f", once per destination ({copies:.1f} of {model.moe.top_k} copies)"
                                     if copies != model.moe.top_k else ""))
        if etp > 1:  # the AG + RS pair over the gathered buffer moves what one all-reduce of it moves
            gathered_bytes = expert_routed_tokens(layout, tokens_mb) * model.moe.top_k * model.hidden * ACTIVATION_BYTES
            gather = _cost("all-reduce", gathered_bytes, "etp", layout, cluster, options)
            ep_per_layer_s += passes / 2 * gather.time_s * options.ep_imbalance
            links.append(f"etp{etp} gather: {gather.link}")
        ep_link = "; ".join(links)

    ep_hidden_per_layer_s = 0.0
    if ep_per_layer_s and options.ep_comm_overlap and moe_layer is not None:
        # Paired with another micro-batch's forward/backward of the layer; the step's first and last phases
        # have no partner (granules: the stage's layers x micro-batches).
        moe_compute_s = moe_layer.forward_s + moe_layer.backward_s + recompute_s(moe_layer)
        ep_per_layer_s, ep_hidden_per_layer_s = _overlap(ep_per_layer_s, moe_compute_s, m * per_stage_layers)

    def device_layer_time(compute: LayerCompute, moe: bool) -> float:
        tp_s = moe_tp_per_layer_s if moe else tp_per_layer_s
        return (compute.forward_s + compute.backward_s + recompute_s(compute)
                + (0.0 if options.tp_comm_overlap else tp_s)
                + cp_per_layer_s + (ep_per_layer_s if moe else 0.0))

    moe_host_s = _moe_host_s(model, layout, calibration.host_s_per_kernel, recomputed)
    moe_device_s = device_layer_time(moe_layer, True) if moe_layer else 0.0
    # Dropless routing sizes the all-to-all and the grouped GEMMs from token counts copied to the host, so the
    # host cannot run ahead: it launches the layer's kernels while the GPU waits (serial). Token-drop routing has
    # fixed shapes and the host runs ahead; it only shows when it is slower than the GPU.
    moe_host_exposed_s = moe_host_s if options.moe_dropless else max(0.0, moe_host_s - moe_device_s)

    # Exposed communication that rides the network cards: the data-parallel reduction (which uses them too when
    # its group leaves the node) cannot hide behind it, only behind compute and scale-up traffic.
    cp_on_nics = ep_on_nics = 0.0
    if (cp_per_layer_s or ep_per_layer_s) and group_span(layout, "dp_cp", cluster, options.placement).nodes > 1:
        if cp_per_layer_s and group_span(layout, "cp", cluster, options.placement).nodes > 1:
            cp_on_nics = cp_per_layer_s
        if ep_per_layer_s and ep_nodes > 1:
            ep_on_nics = ep_per_layer_s

    dense_time = device_layer_time(dense_layer, False) if dense_layer else 0.0
    moe_time = moe_device_s + moe_host_exposed_s if moe_layer else 0.0
    logits_s, logits_flops = logits_compute_s(model, layout, cluster.gpu, calibration, seq_len=seq,
                                              precision=job.precision,
                                              loss_bytes_per_logit=options.loss_bytes_per_logit)

    # --- pipeline -----------------------------------------------------------------------------
    # Each tensor-parallel rank sends its 1/tp slice (sequence parallel, or Megatron's scatter-gather
    # optimisation without it); the receiver all-gathers it over the fast intra-node links.
    p2p_bytes = act_bytes / layout.tp
    p2p = _cost("send-recv", p2p_bytes, "pp", layout, cluster, options) if pp > 1 else None
    p2p_per_mb_s = 2 * vpp * p2p.time_s if p2p else 0.0
    offload_exposed_s, offload_hidden_s, offload_link = _activation_offload_s(
        job, layout, cluster, options, ((dense_layer, False), (moe_layer, True)))

    stage_times = []
    stage_nic_s = []  # per micro-batch, exposed seconds the stage's NICs carry EP/CP traffic
    for stage, (n_dense, n_moe) in enumerate(stage_layer_split(model.layers, pp, vpp, moe_from)):
        t = n_dense * dense_time + n_moe * moe_time + p2p_per_mb_s + offload_exposed_s
        if stage == pp - 1:
            t += logits_s
        stage_times.append(t)
        stage_nic_s.append((n_dense + n_moe) * cp_on_nics + n_moe * ep_on_nics)
    slowest = max(stage_times)
    mean_stage = sum(stage_times) / pp
    bubble_s = (pp - 1) / vpp * mean_stage if pp > 1 else 0.0
    pipeline_s = m * slowest + bubble_s

    worst_stage = max(range(pp), key=lambda stage: stage_times[stage])
    params = stage_parameters(job, layout, worst_stage)
    dp = _data_parallel(layout, cluster, options, params, micro_batches=m, stage_layers=per_stage_layers,
                        compute_per_micro_batch_s=slowest - p2p_per_mb_s - stage_nic_s[worst_stage],
                        grad_wire_bytes=options.memory.reduced_grad_bytes(job.precision))
    optimizer_s = _optimizer_s(layout, cluster, calibration, params)
    sync_s = straggler_s(pipeline_s, layout.gpus, options.straggler_sigma,  # perf/dp_scaling.py
                         layout.gpus // layout.dp if options.straggler_scope == "replicas" else 1)
    fsdp_copy_s = fsdp2_copy_s(params.dense + params.expert, m, param_bytes=ACTIVATION_BYTES,  # fsdp_overheads.py
                               reduce_bytes=options.memory.reduced_grad_bytes(job.precision),
                               regathered_in_backward=pp == 1, hbm_bytes_per_s=cluster.gpu.hbm_bytes_per_s,
                               hbm_fraction=calibration.hbm_fraction) \
        if options.fsdp2_copies and layout.sharding in ("zero3", "fsdp", "hsdp") else 0.0
    step_s = pipeline_s + dp.exposed_s + optimizer_s + options.step_overhead_s + sync_s + fsdp_copy_s

    # --- parts for --explain ------------------------------------------------------------------
    compute_parts = {"gemm": 0.0, "attention": 0.0, "elementwise": 0.0, "recompute": 0.0}
    hardware_flops = 0.0
    for compute, count in ((dense_layer, moe_from if moe_from < model.layers else model.layers),
                           (moe_layer, model.layers - moe_from)):
        if compute is None or count <= 0:
            continue
        layers_here = count / pp  # per GPU (average stage)
        compute_parts["gemm"] += m * layers_here * 3 * compute.gemm_fwd_s
        compute_parts["attention"] += m * layers_here * (compute.attention_fwd_s + compute.attention_bwd_s)
        compute_parts["elementwise"] += m * layers_here * 3 * compute.elementwise_fwd_s
        compute_parts["recompute"] += m * layers_here * recompute_s(compute)
        extra = compute.recompute_flops(layout.recompute, options.memory.selective_policy) * (
            recomputed if layout.recompute == "full" else 1.0)
        hardware_flops += m * layers_here * (3 * compute.flops_fwd + extra)
    hardware_flops += m * 3 * logits_flops / pp
    parts: dict[str, Part] = {
        "compute.gemm": Part(compute_parts["gemm"]),
        "compute.attention": Part(compute_parts["attention"]),
        "compute.elementwise": Part(compute_parts["elementwise"]),
        "compute.recompute": Part(compute_parts["recompute"]),
        "compute.logits+loss": Part(m * logits_s / pp),
    }
    if layout.tp > 1:
        moe_share = (model.layers - moe_from) / model.layers
        tp_exposed = m * per_stage_layers * ((1 - moe_share) * tp_per_layer_s + moe_share * moe_tp_per_layer_s)
        tp_hidden = m * per_stage_layers * ((1 - moe_share) * tp_hidden_per_layer_s
                                            + moe_share * moe_tp_hidden_per_layer_s)
        parts["comm.tp"] = Part(0.0 if options.tp_comm_overlap else tp_exposed,
                                tp_hidden + (tp_exposed if options.tp_comm_overlap else 0.0), tp_cost.link)
    if layout.cp > 1:
        parts["comm.cp"] = Part(m * per_stage_layers * cp_per_layer_s,
                                m * per_stage_layers * cp_hidden_per_layer_s, cp_link)
    moe_per_stage = (model.layers - moe_from) / pp
    if ep_per_layer_s or ep_hidden_per_layer_s:
        parts["comm.ep"] = Part(m * moe_per_stage * ep_per_layer_s, m * moe_per_stage * ep_hidden_per_layer_s,
                                ep_link + (", overlapped" if options.ep_comm_overlap else ""))
    if moe_host_s:
        kernels = round(moe_host_s / calibration.host_s_per_kernel)
        bound = (f"host launches {kernels} kernels/layer"
                 + (", dropless sync" if options.moe_dropless else ", runs ahead (token-drop)"))
        parts["host.moe"] = Part(m * moe_per_stage * moe_host_exposed_s, m * moe_per_stage * (
            moe_host_s - moe_host_exposed_s), bound)
    if offload_link:
        parts["offload.activations"] = Part(m * offload_exposed_s, m * offload_hidden_s, offload_link)
    if p2p:
        parts["comm.pp"] = Part(m * p2p_per_mb_s, 0.0, p2p.link)
        parts["bubble"] = Part(bubble_s)
    if dp.total_s:
        parts["comm.dp"] = Part(dp.exposed_s, dp.total_s - dp.exposed_s, dp.link)
    if sync_s:
        parts["sync.stragglers"] = Part(sync_s, 0.0, f"slowest of {layout.gpus} GPUs")
    if fsdp_copy_s:
        parts["fsdp.copies"] = Part(fsdp_copy_s, 0.0, "FSDP2 copy-out / reduce-scatter copy-in over HBM")
    parts["optimizer"] = Part(optimizer_s)
    parts["overhead"] = Part(options.step_overhead_s)
    imbalance = m * (slowest - mean_stage)
    if imbalance > 1e-9:
        parts["stage-imbalance"] = Part(imbalance)

    contention = contention_s((parts[name].hidden_s for name in COLLECTIVE_PARTS if name in parts),
                              options.overlap_slowdown)  # perf/overlap_contention.py
    if contention:
        step_s += contention
        parts["compute.overlap-contention"] = Part(contention, 0.0, "compute slowed under hidden collectives")
    tokens_per_step = job.global_batch * seq
    return StepEstimate(
        step_s=step_s,
        parts=parts,
        tokens_per_step=tokens_per_step,
        gpus=cluster.gpus,
        model_flops_per_token=flops_per_token(model, seq).training,
        hardware_flops_per_step_per_gpu=hardware_flops,
        peak_flops=cluster.gpu.peak_flops(job.precision),
        bubble_fraction=bubble_s / step_s if step_s > 0 else 0.0,
        micro_batches=m,
    )


def run_time_s(job: Job, step: StepEstimate) -> float:
    """Seconds to train `job.tokens` at this step rate (no failures; see reliability for goodput)."""
    return math.ceil(job.steps) * step.step_s
