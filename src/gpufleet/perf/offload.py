"""CPU activation offloading: the saved activations of offloaded layers cross the GPU-to-host link."""

from __future__ import annotations

from gpufleet.errors import InputError
from gpufleet.parallel.activations import activation_bytes_per_layer
from gpufleet.perf.layer_comm import LayerComm
from gpufleet.perf.step_context import Layers, StepContext


def activation_offload(ctx: StepContext, layers: Layers) -> LayerComm:
    """Seconds per micro-batch (exposed, hidden) of CPU activation offloading: each offloaded layer's saved
    activations go to the host while later layers compute forward and come back while earlier ones compute
    backward; a copy longer than that compute shows."""
    job, layout, cluster, options = ctx.job, ctx.layout, ctx.cluster, ctx.options
    count = layout.offload_activation_layers or 0
    if not count:
        return LayerComm(0.0, 0.0, "")
    link_gbytes = cluster.gpu.host_link_gbytes_per_s
    if link_gbytes is None:
        raise InputError(f"{cluster.gpu.id} has no host link (host_link_gbytes_per_s) in the catalog; activation "
                         "offloading needs it")
    fraction = options.judged.host_link_fraction  # pinned-memory copies' share of line rate (catalog judgement)
    bandwidth = link_gbytes * 1e9 * fraction
    model = job.model
    moe_from = ctx.moe_from
    exposed = hidden = 0.0
    for compute, moe in ((layers.dense, False), (layers.moe, True)):
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
    return LayerComm(exposed, hidden, f"host link {link_gbytes:g} GB/s x {fraction:g}")
