"""The pipeline schedule: each stage's time per micro-batch, the slowest stage, the bubble and the p2p sends.

A layer's time on the critical path is its compute (forward, backward, recompute) plus the per-layer
communication that stays exposed (TP unless overlapped, CP, EP) plus, for a MoE layer, the host time the GPU
waits for. A stage runs its layers, sends its activations on, and the last stage adds the output head and loss.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.fabric.placement import group_span
from gpufleet.parallel.layout import stage_layer_split
from gpufleet.perf.comm_cost import collective
from gpufleet.perf.compute import LayerCompute
from gpufleet.perf.layer_comm import ExpertParallelComm, LayerComm, TensorParallelComm
from gpufleet.perf.moe_host import MoeHost
from gpufleet.perf.step_context import Layers, StepContext


@dataclass(frozen=True, slots=True)
class DeviceLayerTimes:
    """GPU seconds of one dense and one MoE layer per micro-batch: compute + exposed per-layer communication."""

    dense_s: float
    moe_s: float


@dataclass(frozen=True, slots=True)
class NicShare:
    """Exposed per-layer CP and EP seconds that ride the network cards (the data-parallel reduction, when its
    group leaves the node, cannot hide behind them, only behind compute and scale-up traffic)."""

    cp_s: float = 0.0
    ep_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PipelineSchedule:
    """Per micro-batch: each stage's seconds and NIC-bound seconds; per step: the bubble and the pipeline."""

    stage_s: tuple[float, ...]
    stage_nic_s: tuple[float, ...]
    p2p_per_mb_s: float  # exposed send-recv seconds per micro-batch (in every stage's time)
    p2p_link: str | None  # None: one stage, no sends
    bubble_s: float
    pipeline_s: float  # micro-batches x slowest stage + bubble
    p2p_hidden_per_mb_s: float = 0.0  # send-recv seconds per micro-batch the next chunk's compute covers

    @property
    def slowest_s(self) -> float:
        return max(self.stage_s)

    @property
    def mean_stage_s(self) -> float:
        return sum(self.stage_s) / len(self.stage_s)

    @property
    def worst_stage(self) -> int:
        return max(range(len(self.stage_s)), key=lambda stage: self.stage_s[stage])


def _device_layer_s(ctx: StepContext, compute: LayerCompute, moe: bool, tp: TensorParallelComm, cp: LayerComm,
                    ep: ExpertParallelComm) -> float:
    tp_s = tp.moe.exposed_s if moe else tp.dense.exposed_s
    return (compute.forward_s + compute.backward_s + ctx.recompute_s(compute)
            + (0.0 if ctx.options.tp_comm_overlap else tp_s)
            + cp.exposed_s + (ep.comm.exposed_s if moe else 0.0))


def device_layer_times(ctx: StepContext, layers: Layers, tp: TensorParallelComm, cp: LayerComm,
                       ep: ExpertParallelComm) -> DeviceLayerTimes:
    """Each layer kind's GPU seconds per micro-batch (0 for a kind the model lacks)."""
    return DeviceLayerTimes(_device_layer_s(ctx, layers.dense, False, tp, cp, ep) if layers.dense else 0.0,
                            _device_layer_s(ctx, layers.moe, True, tp, cp, ep) if layers.moe else 0.0)


def nic_share(ctx: StepContext, cp: LayerComm, ep: ExpertParallelComm) -> NicShare:
    """The exposed CP and EP seconds whose groups leave the node while the data-parallel group does too."""
    layout, cluster, placement = ctx.layout, ctx.cluster, ctx.options.placement
    cp_s = ep_s = 0.0
    if (cp.exposed_s or ep.comm.exposed_s) and group_span(layout, "dp_cp", cluster, placement).nodes > 1:
        if cp.exposed_s and group_span(layout, "cp", cluster, placement).nodes > 1:
            cp_s = cp.exposed_s
        if ep.comm.exposed_s and ep.nodes > 1:
            ep_s = ep.comm.exposed_s
    return NicShare(cp_s, ep_s)


#: The share of a chunk's forward+backward seconds that is its forward, behind which an overlapped send or receive
#: runs (a judgement: the backward is about twice the forward; a recompute makes the cover longer, not counted).
P2P_COVER_SHARE = 1 / 3


def pipeline_schedule(ctx: StepContext, layers: Layers, device: DeviceLayerTimes, host: MoeHost,
                      offload: LayerComm, logits_s: float, nics: NicShare) -> PipelineSchedule:
    """Stage times from the layer split, the p2p sends and the interleaved 1F1B bubble: (pp-1)/vpp mean stages.

    Each tensor-parallel rank sends its 1/tp slice (sequence parallel, or Megatron's scatter-gather optimisation
    without it); the receiver all-gathers it over the fast intra-node links. A micro-batch crosses each chunk's
    boundary twice (forward and backward): 2 x vpp send-recvs. Overlapped (`StepOptions.pp_p2p_overlap`, interleaved
    schedules only), each runs while the next chunk computes and only what a mean chunk's forward cannot cover is
    exposed; otherwise all of it is."""
    layout, model = ctx.layout, ctx.model
    pp, vpp = layout.pp, layout.vpp
    p2p = collective("send-recv", ctx.act_bytes / layout.tp, "pp", layout, ctx.cluster, ctx.options) \
        if pp > 1 else None
    moe_time = device.moe_s + host.exposed_s if layers.moe else 0.0
    compute_s = []
    stage_nic_s = []  # per micro-batch, exposed seconds the stage's NICs carry EP/CP traffic
    for stage, (n_dense, n_moe) in enumerate(stage_layer_split(model.layers, pp, vpp, ctx.moe_from)):
        compute_s.append(n_dense * device.dense_s + n_moe * moe_time + offload.exposed_s
                         + (logits_s if stage == pp - 1 else 0.0))
        stage_nic_s.append((n_dense + n_moe) * nics.cp_s + n_moe * nics.ep_s)
    hop_s = p2p.time_s if p2p else 0.0
    cover_s = sum(compute_s) / pp / vpp * P2P_COVER_SHARE if ctx.options.pp_p2p_overlap and vpp > 1 else 0.0
    p2p_per_mb_s = 2 * vpp * max(0.0, hop_s - cover_s)
    stage_times = [seconds + p2p_per_mb_s for seconds in compute_s]
    slowest = max(stage_times)
    mean_stage = sum(stage_times) / pp
    bubble_s = (pp - 1) / vpp * mean_stage if pp > 1 else 0.0
    return PipelineSchedule(tuple(stage_times), tuple(stage_nic_s), p2p_per_mb_s, p2p.link if p2p else None,
                            bubble_s, ctx.micro_batches * slowest + bubble_s, 2 * vpp * hop_s - p2p_per_mb_s)
