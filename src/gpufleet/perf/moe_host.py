"""The host side of a MoE layer: the framework launches many small kernels per layer, and under dropless routing
the GPU waits for it (token counts are copied to the host to size the all-to-all and the grouped GEMMs)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.catalog.judgements import Judgements
from gpufleet.catalog.records import ModelSpec
from gpufleet.catalog.stacks import CudaGraphModule, MoeExpertKernels
from gpufleet.parallel.layout import Layout
from gpufleet.perf.step_context import StepContext


@dataclass(frozen=True, slots=True)
class MoeHost:
    """Host seconds per MoE layer and micro-batch: all of it (`launch_s`) and what the GPU waits for."""

    launch_s: float = 0.0
    exposed_s: float = 0.0


def moe_host_s(model: ModelSpec, layout: Layout, host_s_per_kernel: float, recomputed: float, judged: Judgements,
               expert_kernels: MoeExpertKernels = "per-expert",
               graphed: tuple[CudaGraphModule, ...] = ()) -> float:
    """Host seconds to launch one MoE layer's kernels for one micro-batch: forward, backward and, for the
    `recomputed` share of layers, the forward again. A grouped GEMM launches one expert's kernels for all of the
    rank's local experts; "per-expert" launches them once per local expert. The kernels of the `graphed` parts
    (the router, the dispatcher's preprocessing) cost one graph launch. The kernel counts per MoE layer are
    `judged`'s, counted from Megatron-Core's and TE's code paths."""
    if model.moe is None:
        return 0.0
    local_experts = model.moe.experts / layout.ep if expert_kernels == "per-expert" else 1.0
    forward = (judged.moe_fixed_kernels_fwd - graph_captured_kernels(graphed, judged)
               + judged.moe_kernels_per_local_expert_fwd * local_experts)
    passes = 1.0 + judged.moe_backward_kernel_ratio + recomputed
    return forward * passes * host_s_per_kernel


def graph_captured_kernels(graphed: tuple[CudaGraphModule, ...], judged: Judgements) -> int:
    """Forward kernel launches a MoE layer saves with `graphed` parts: the router's kernels ("moe_router") and the
    dispatcher's preprocessing ("moe_preprocess", captured with the router) become one graph launch."""
    captured = judged.moe_router_kernels_fwd if "moe_router" in graphed else 0
    if "moe_router" in graphed and "moe_preprocess" in graphed:
        captured += judged.moe_preprocess_kernels_fwd
    return captured - 1 if captured else 0


def moe_host_launch(ctx: StepContext, device_moe_s: float) -> MoeHost:
    """Dropless routing sizes the all-to-all and the grouped GEMMs from token counts copied to the host, so the
    host cannot run ahead: it launches the layer's kernels while the GPU waits (serial). Token-drop routing has
    fixed shapes and the host runs ahead; it only shows when it is slower than the GPU (`device_moe_s`)."""
    launch = moe_host_s(ctx.model, ctx.layout, ctx.calibration.host_s_per_kernel, ctx.recomputed,
                        ctx.options.judged, ctx.options.moe_expert_kernels, ctx.options.moe_cuda_graph_modules)
    exposed = launch if ctx.options.moe_dropless else max(0.0, launch - device_moe_s)
    return MoeHost(launch, exposed)
