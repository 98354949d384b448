"""Per-layer communication of one micro-batch on one GPU: tensor-, context- and expert-parallel collectives.

Each function returns a `LayerComm`: the seconds one layer's collectives of that kind put on the critical path
(exposed) and those a compute window hides, with the link that carries them.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.fabric.placement import group_span
from gpufleet.parallel.layout import expert_parallel_degrees, expert_routed_tokens, local_expert_tokens
from gpufleet.perf.comm_cost import collective, overlap
from gpufleet.perf.compute import ACTIVATION_BYTES, LayerCompute
from gpufleet.perf.moe_routing import token_destinations
from gpufleet.perf.step_context import Layers, StepContext


@dataclass(frozen=True, slots=True)
class LayerComm:
    """Seconds of one kind of collective per layer and micro-batch: exposed and hidden, and the link."""

    exposed_s: float = 0.0
    hidden_s: float = 0.0
    link: str = ""


@dataclass(frozen=True, slots=True)
class TensorParallelComm:
    """TP seconds of a dense and of a MoE layer (they differ: a MoE layer's routed experts gather over etp)."""

    dense: LayerComm
    moe: LayerComm
    link: str


@dataclass(frozen=True, slots=True)
class ExpertParallelComm:
    """The expert all-to-all (and etp gather) of one MoE layer; `nodes`: the nodes the EP group spans."""

    comm: LayerComm
    nodes: int


def _tp_block_s(ctx: StepContext, unit_s: float, column_gemm_fwd_s: float) -> tuple[float, float]:
    """(exposed, hidden) TP seconds of one block (a column- then a row-parallel GEMM) in all-reduce units
    (`unit_s`; an all-gather or a reduce-scatter moves half what an all-reduce moves). Forward (and a recomputed
    forward): one all-reduce, or SP's all-gather + reduce-scatter. Backward: the column GEMM's input gradient is
    all-reduced (reduce-scattered under SP) and, under SP, the row GEMM's output gradient all-gathered. Megatron
    (and Megatron-DeepSpeed) keep only the sharded input under SP, re-gather it during the data-gradient GEMM and
    reduce-scatter the input gradient during the weight-gradient GEMM (LinearWithGradAccumulationAndAsyncCommunication);
    without SP they all-reduce it during the weight-gradient GEMM unless --no-async-tensor-model-parallel-allreduce
    (`tp_async_backward`). DTensor TP keeps the gathered input (`MemoryAssumptions.tp_gathered_inputs`) and runs the
    reduction in line. Each window is about the column GEMM's forward time. torchtitan's op-level selective
    checkpointing saves reduce-scatter outputs but re-runs the all-gather before the column GEMM (the all-reduce
    without SP)."""
    layout, options = ctx.layout, ctx.options
    if layout.tp <= 1:
        return 0.0, 0.0
    sp = layout.sequence_parallel and layout.tp > 1
    exposed = (1 + ctx.recomputed + (0.5 if sp else 0.0)) * unit_s
    if layout.recompute == "selective" and options.memory.selective_policy == "op":
        exposed += (0.5 if sp else 1.0) * unit_s
    input_grad = (0.5 if sp else 1.0) * unit_s
    megatron_sp = sp and not options.memory.tp_gathered_inputs
    regather = 0.5 * unit_s if megatron_sp else 0.0
    hidden = min(regather, column_gemm_fwd_s)
    if options.tp_async_backward or megatron_sp:
        hidden += min(input_grad, column_gemm_fwd_s)
    return exposed + input_grad + regather - hidden, hidden


def _tp_layer(ctx: StepContext, unit_s: float, compute: LayerCompute | None, moe: bool, link: str) -> LayerComm:
    """A layer's TP seconds: attention and MLP blocks. A MoE layer's routed experts gather over etp instead
    (expert_parallel_comm); its shared experts are a TP MLP of their own, and DTensor TP gathers the MoE input for
    the router and reduce-scatters the output (one block either way)."""
    if compute is None:
        return LayerComm(0.0, 0.0, link)
    model = ctx.model
    attention = _tp_block_s(ctx, unit_s, compute.qkv_gemm_fwd_s)
    mlp_block = not moe or bool(model.moe and model.moe.shared_experts) or ctx.options.memory.tp_gathered_inputs
    mlp = _tp_block_s(ctx, unit_s, compute.mlp_up_gemm_fwd_s) if mlp_block else (0.0, 0.0)
    return LayerComm(attention[0] + mlp[0], attention[1] + mlp[1], link)


def tensor_parallel_comm(ctx: StepContext, layers: Layers) -> TensorParallelComm:
    """TP collectives of a dense and a MoE layer: all-reduces of the hidden states (or SP's gather/scatter)."""
    unit = collective("all-reduce", ctx.act_bytes, "tp", ctx.layout, ctx.cluster, ctx.options)
    return TensorParallelComm(_tp_layer(ctx, unit.time_s, layers.dense, False, unit.link),
                              _tp_layer(ctx, unit.time_s, layers.moe, True, unit.link), unit.link)


def context_parallel_comm(ctx: StepContext, layers: Layers) -> LayerComm:
    """Ring attention: cp-1 hops forward, 2x that backward (KV and their gradients), each hop overlapping one
    block of attention compute."""
    layout, model = ctx.layout, ctx.model
    if layout.cp <= 1:
        return LayerComm()
    kv_bytes = ctx.tokens_mb * 2 * model.kv_heads * model.head_dim_ * ACTIVATION_BYTES / max(
        1, min(layout.tp, model.kv_heads))
    hop = collective("send-recv", kv_bytes, "cp", layout, ctx.cluster, ctx.options)
    layer = layers.dense if layers.dense is not None else layers.moe
    comm = 3 * (layout.cp - 1) * hop.time_s
    window = (layer.attention_fwd_s + layer.attention_bwd_s) if layer else 0.0
    exposed, hidden = overlap(comm, window, layout.cp)
    return LayerComm(exposed, hidden, hop.link)


def expert_parallel_comm(ctx: StepContext, layers: Layers) -> ExpertParallelComm:
    """Megatron-Core's alltoall dispatcher: each rank sends the tokens it routes itself over the EP group, then
    the etp ranks that share an expert all-gather what they received (reduce-scatter on the way back). With
    `ep_comm_overlap` it pairs with another micro-batch's compute of the layer."""
    layout, model, options, cluster = ctx.layout, ctx.model, ctx.options, ctx.cluster
    etp, _ = expert_parallel_degrees(layout)
    nodes = group_span(layout, "ep", cluster, options.placement).nodes if layout.ep > 1 else 1
    if model.moe is None or not (layout.ep > 1 or etp > 1):
        return ExpertParallelComm(LayerComm(), nodes)
    exposed = 0.0
    passes = 4 + 2 * ctx.recomputed  # dispatch + combine, forward and backward (and the recomputed forward)
    links = []
    if layout.ep > 1:
        copies = float(model.moe.top_k)
        if options.ep_dispatch == "dedup":  # DeepEP's layout: is the token bound for this node / this GPU
            destinations = nodes if nodes > 1 else layout.ep  # the network, else NVLink, is the cost
            copies = token_destinations(model.moe, destinations, options.ep_routing)
        dispatch_bytes = local_expert_tokens(layout, ctx.tokens_mb) * copies * model.hidden * ACTIVATION_BYTES
        a2a = collective("all-to-all", dispatch_bytes, "ep", layout, cluster, options)
        exposed += passes * a2a.time_s * options.resolved_ep_imbalance
        links.append(a2a.link + (f", once per destination ({copies:.1f} of {model.moe.top_k} copies)"
                                 if copies != model.moe.top_k else ""))
    if etp > 1:  # the AG + RS pair over the gathered buffer moves what one all-reduce of it moves
        gathered_bytes = expert_routed_tokens(layout, ctx.tokens_mb) * model.moe.top_k * model.hidden * ACTIVATION_BYTES
        gather = collective("all-reduce", gathered_bytes, "etp", layout, cluster, options)
        exposed += passes / 2 * gather.time_s * options.resolved_ep_imbalance
        links.append(f"etp{etp} gather: {gather.link}")
    hidden = 0.0
    if exposed and options.ep_comm_overlap and layers.moe is not None:
        # Paired with another micro-batch's forward/backward of the layer; the step's first and last phases
        # have no partner (granules: the stage's layers x micro-batches).
        moe = layers.moe
        moe_compute_s = moe.forward_s + moe.backward_s + ctx.recompute_s(moe)
        exposed, hidden = overlap(exposed, moe_compute_s, ctx.micro_batches * ctx.stage_layers)
    return ExpertParallelComm(LayerComm(exposed, hidden, "; ".join(links)), nodes)
