"""The answer to a MemoryRequest: memory per pipeline stage, the peak, the pinned host memory, fit or no fit.

The model half of `gpufleet memory`: it reads the catalog, builds and checks the layout, prices each stage
and says why it does not fit (HBM or the node's pinned host memory), with the hint the user needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from gpufleet.catalog.records import GPUSpec, ModelSpec, NodeSpec, Precision
from gpufleet.catalog.registry import Catalog
from gpufleet.errors import InputError
from gpufleet.fabric.topology import node_as_used
from gpufleet.parallel.layout import Layout, validate_layout
from gpufleet.parallel.memory import MemoryBreakdown, memory_per_stage
from gpufleet.parallel.memory_request import MemoryRequest
from gpufleet.planner.published_runs import framework_options
from gpufleet.planner.search import host_memory_bytes, host_memory_fits

GIB = 2**30


@dataclass(frozen=True)
class MemoryReport:
    """Everything `gpufleet memory` prints: `data` is its JSON document, the rest names what it is about."""

    request: MemoryRequest
    model: ModelSpec
    gpu: GPUSpec
    node: NodeSpec
    layout: Layout
    gpus_per_node: int
    stages: list[MemoryBreakdown]
    host_fits: bool
    data: dict[str, Any]
    #: the share of a node's RAM that may be pinned (the host budget's rule: the catalog's judgement)
    host_usable_fraction: float

    def problems(self) -> list[str]:
        """Why it does not fit, the pinned host memory first (empty: it fits)."""
        found = []
        data = self.data
        if not self.host_fits:
            hint = ("offload fewer layers or use more GPUs" if self.layout.offload_activation_layers else
                    "shard the optimizer (--sharding zero1/zero3) or use more GPUs")
            found.append(
                f"does not fit: the offloaded tensors need {data['host_bytes_per_node'] / GIB:,.0f} GiB of pinned "
                f"memory per {self.node.id} node but {data['host_budget_bytes_per_node'] / GIB:,.0f} GiB is usable; "
                + hint)
        if data["peak_bytes"] > data["hbm_bytes"]:
            peak = self.stages[data["peak_stage"]].as_dict()
            largest = max(peak, key=lambda kind: peak[kind])
            found.append(
                f"does not fit: stage {data['peak_stage']} needs {data['peak_bytes'] / GIB:.1f} GiB per GPU "
                f"but {self.gpu.id} has {data['hbm_bytes'] / GIB:.1f} GiB (largest part: {largest} "
                f"{peak[largest] / GIB:.1f} GiB; try more tp/pp, --sharding, --recompute or a smaller "
                "--micro-batch)")
        return found


def _host_per_gpu(stages: list[MemoryBreakdown]) -> float:
    """Pinned host bytes per GPU of the stage that pins the most."""
    return max(breakdown.host_bytes for breakdown in stages)


def _document(stages: list[MemoryBreakdown], hbm_bytes: float, node: NodeSpec, gpus_per_node: int,
              host_fits: bool, host_usable_fraction: float) -> dict[str, Any]:
    peak_stage = max(range(len(stages)), key=lambda i: stages[i].total_bytes)
    peak_bytes = stages[peak_stage].total_bytes
    return {
        "stages": [
            {"stage": i, "bytes": breakdown.as_dict(), "total_bytes": breakdown.total_bytes,
             "host_bytes": breakdown.host_bytes}
            for i, breakdown in enumerate(stages)
        ],
        "peak_stage": peak_stage,
        "peak_bytes": peak_bytes,
        "hbm_bytes": hbm_bytes,
        "host_bytes_per_node": _host_per_gpu(stages) * gpus_per_node,
        "host_budget_bytes_per_node": host_memory_bytes(node, host_usable_fraction),
        "fits": peak_bytes <= hbm_bytes and host_fits,
    }


def memory_report(request: MemoryRequest, catalog: Catalog) -> MemoryReport:
    """Memory per GPU for every pipeline stage of `request`'s layout, and fit / no fit (HBM and pinned host)."""
    spec = catalog.model(request.model)
    gpu = catalog.gpu(request.gpu)
    gpu.peak_flops(cast(Precision, request.precision))  # a GPU without that precision: one line, as plan says
    layout = request.layout()
    validate_layout(layout, spec, request.gpus, request.batch, request.seq)
    record = catalog.stack(request.stack) if request.stack is not None else None
    if record is not None and record.value("activation_offload") is False and request.offload_activations:
        raise InputError(f"--offload-activations: {request.stack} cannot keep activations in CPU memory")
    judged = catalog.judgements()
    assumptions = framework_options(record, dtensor_tp=request.dtensor_tp,
                                    selective_policy=request.selective_policy).with_judgements(judged).memory
    stages = memory_per_stage(spec, layout, seq_len=request.seq, global_batch=request.batch,
                              precision=request.precision, assumptions=assumptions)
    node = catalog.node_for_gpu(gpu.id)
    try:  # as plan places it: a count that does not fill whole nodes spreads evenly over them
        gpus_per_node = min(request.gpus, node_as_used(node, request.gpus).gpus)
    except InputError:
        gpus_per_node = min(request.gpus, node.gpus)
    usable = judged.host_ram_usable_fraction
    host_fits = host_memory_fits(_host_per_gpu(stages), node, gpus_per_node, usable)
    return MemoryReport(request=request, model=spec, gpu=gpu, node=node, layout=layout, gpus_per_node=gpus_per_node,
                        stages=stages, host_fits=host_fits, host_usable_fraction=usable,
                        data=_document(stages, gpu.hbm_bytes, node, gpus_per_node, host_fits, usable))
