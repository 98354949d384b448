"""A step broken into named parts for `--explain`: seconds per GPU on the critical path (exposed) and overlapped
(hidden), per step, with the link or bound behind each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpufleet.perf.layer_comm import ExpertParallelComm, LayerComm, TensorParallelComm
from gpufleet.perf.moe_host import MoeHost, graph_captured_kernels
from gpufleet.perf.pipeline import PipelineSchedule
from gpufleet.perf.step_context import Layers, StepContext

if TYPE_CHECKING:
    from gpufleet.perf.step import DataParallelComm


@dataclass(frozen=True, slots=True)
class Part:
    """One part of a step: seconds on the critical path (exposed) and overlapped (hidden)."""

    exposed_s: float
    hidden_s: float = 0.0
    link: str = ""

    @property
    def total_s(self) -> float:
        return self.exposed_s + self.hidden_s


@dataclass(frozen=True, slots=True)
class ComputeParts:
    """Per-step compute seconds of the average stage by kind, and the hardware FLOPs executed (recompute in)."""

    gemm_s: float
    attention_s: float
    elementwise_s: float
    recompute_s: float
    hardware_flops: float


def compute_parts(ctx: StepContext, layers: Layers, logits_flops: float) -> ComputeParts:
    """Compute seconds and hardware FLOPs per step on the average stage (layers / pp per GPU)."""
    model, m, pp = ctx.model, ctx.micro_batches, ctx.layout.pp
    moe_from = ctx.moe_from
    gemm = attention = elementwise = recompute = hardware_flops = 0.0
    for compute, count in ((layers.dense, moe_from if moe_from < model.layers else model.layers),
                           (layers.moe, model.layers - moe_from)):
        if compute is None or count <= 0:
            continue
        layers_here = count / pp  # per GPU (average stage)
        gemm += m * layers_here * 3 * compute.gemm_fwd_s
        attention += m * layers_here * (compute.attention_fwd_s + compute.attention_bwd_s)
        elementwise += m * layers_here * 3 * compute.elementwise_fwd_s
        recompute += m * layers_here * ctx.recompute_s(compute)
        hardware_flops += m * layers_here * (3 * compute.flops_fwd + ctx.recompute_flops(compute))
    hardware_flops += m * 3 * logits_flops / pp
    return ComputeParts(gemm, attention, elementwise, recompute, hardware_flops)


def _tp_part(ctx: StepContext, tp: TensorParallelComm) -> Part:
    model, overlapped = ctx.model, ctx.options.tp_comm_overlap
    moe_share = (model.layers - ctx.moe_from) / model.layers
    per_step = ctx.micro_batches * ctx.stage_layers
    exposed = per_step * ((1 - moe_share) * tp.dense.exposed_s + moe_share * tp.moe.exposed_s)
    hidden = per_step * ((1 - moe_share) * tp.dense.hidden_s + moe_share * tp.moe.hidden_s)
    return Part(0.0 if overlapped else exposed, hidden + (exposed if overlapped else 0.0), tp.link)


def _moe_host_part(ctx: StepContext, host: MoeHost, moe_per_stage: float) -> Part:
    kernels = round(host.launch_s / ctx.calibration.host_s_per_kernel)
    captured = graph_captured_kernels(ctx.options.moe_cuda_graph_modules, ctx.options.judged)
    graphed = " (router in a CUDA graph)" if captured else ""
    bound = (f"host launches {kernels} kernels/layer{graphed}"
             + (", dropless sync" if ctx.options.moe_dropless else ", runs ahead (token-drop)"))
    m = ctx.micro_batches
    return Part(m * moe_per_stage * host.exposed_s, m * moe_per_stage * (host.launch_s - host.exposed_s), bound)


def comm_parts(ctx: StepContext, tp: TensorParallelComm, cp: LayerComm, ep: ExpertParallelComm, host: MoeHost,
               offload: LayerComm, schedule: PipelineSchedule, dp: DataParallelComm) -> dict[str, Part]:
    """The communication, host, offload, pipeline and data-parallel parts a step has (absent ones left out)."""
    layout, m = ctx.layout, ctx.micro_batches
    parts: dict[str, Part] = {}
    if layout.tp > 1:
        parts["comm.tp"] = _tp_part(ctx, tp)
    if layout.cp > 1:
        parts["comm.cp"] = Part(m * ctx.stage_layers * cp.exposed_s, m * ctx.stage_layers * cp.hidden_s, cp.link)
    moe_per_stage = (ctx.model.layers - ctx.moe_from) / layout.pp
    if ep.comm.exposed_s or ep.comm.hidden_s:
        parts["comm.ep"] = Part(m * moe_per_stage * ep.comm.exposed_s, m * moe_per_stage * ep.comm.hidden_s,
                                ep.comm.link + (", overlapped" if ctx.options.ep_comm_overlap else ""))
    if host.launch_s:
        parts["host.moe"] = _moe_host_part(ctx, host, moe_per_stage)
    if offload.link:
        parts["offload.activations"] = Part(m * offload.exposed_s, m * offload.hidden_s, offload.link)
    if schedule.p2p_link is not None:
        parts["comm.pp"] = Part(m * schedule.p2p_per_mb_s, m * schedule.p2p_hidden_per_mb_s,
                                schedule.p2p_link + (", overlapped" if schedule.p2p_hidden_per_mb_s else ""))
        parts["bubble"] = Part(schedule.bubble_s)
    if dp.total_s:
        parts["comm.dp"] = Part(dp.exposed_s, dp.total_s - dp.exposed_s, dp.link)
    return parts


def step_parts(ctx: StepContext, compute: ComputeParts, logits_s: float, comm: dict[str, Part], optimizer_s: float,
               schedule: PipelineSchedule) -> dict[str, Part]:
    """Every part of the step in --explain's order: compute, communication, optimizer, overhead, imbalance."""
    m = ctx.micro_batches
    parts: dict[str, Part] = {
        "compute.gemm": Part(compute.gemm_s),
        "compute.attention": Part(compute.attention_s),
        "compute.elementwise": Part(compute.elementwise_s),
        "compute.recompute": Part(compute.recompute_s),
        "compute.logits+loss": Part(m * logits_s / ctx.layout.pp),
        **comm,
        "optimizer": Part(optimizer_s),
        "overhead": Part(ctx.options.resolved_step_overhead_s),
    }
    imbalance = m * (schedule.slowest_s - schedule.mean_stage_s)
    if imbalance > 1e-9:
        parts["stage-imbalance"] = Part(imbalance)
    return parts
