"""What every part of a step needs to know: the job, layout, cluster, calibration and options, and the few
quantities derived from them that all parts share (micro-batches, layers per stage, tokens per micro-batch)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.judgements import Judgements
from gpufleet.catalog.records import GPUSpec, ModelSpec, Precision
from gpufleet.fabric.topology import Cluster
from gpufleet.parallel.layout import Layout, expert_parallel_degrees, micro_batches_per_step, recomputed_fraction
from gpufleet.perf.compute import ACTIVATION_BYTES, LayerCompute, layer_compute, recompute_stops_early
from gpufleet.workload.job import Job

if TYPE_CHECKING:
    from gpufleet.perf.step import StepOptions


@dataclass(frozen=True, slots=True)
class StepContext:
    """One step's inputs and shared derived quantities (per GPU, per micro-batch)."""

    job: Job
    layout: Layout
    cluster: Cluster
    calibration: CalibrationProfile
    options: StepOptions
    micro_batches: int
    stage_layers: int  # layers on the fullest pipeline stage
    moe_from: int  # index of the first MoE layer (= layers for a dense model)
    tokens_mb: float  # tokens one GPU processes per micro-batch
    recomputed: float  # share of layers whose forward runs twice (full recompute of some blocks)

    @classmethod
    def of(cls, job: Job, layout: Layout, cluster: Cluster, calibration: CalibrationProfile,
           options: StepOptions) -> StepContext:
        model = job.model
        stage_layers = math.ceil(model.layers / layout.pp)
        return cls(job, layout, cluster, calibration, options,
                   micro_batches=micro_batches_per_step(layout, job.global_batch), stage_layers=stage_layers,
                   moe_from=model.layers if model.moe is None else model.moe.dense_layers,
                   tokens_mb=layout.micro_batch * job.seq_len / layout.cp,
                   recomputed=recomputed_fraction(layout, stage_layers))

    @property
    def model(self) -> ModelSpec:
        return self.job.model

    @property
    def act_bytes(self) -> float:
        """Bytes of one micro-batch's hidden states on one GPU (what TP reduces and PP sends)."""
        return self.tokens_mb * self.model.hidden * ACTIVATION_BYTES

    @property
    def recompute_stops_early(self) -> bool:
        """Whether this job's full recompute stops before each layer's last GEMM (fused element-wise kernels read
        as a compiled block: what they mean for the stacks that compile, torchtitan)."""
        return recompute_stops_early(self.options.recompute_early_stop, self.job.precision,
                                     compiled=self.options.fused_elementwise)

    def recompute_s(self, compute: LayerCompute) -> float:
        """The layer's recompute time, averaged over the stage's layers (block recompute covers a share)."""
        return (compute.recompute_s(self.layout.recompute, self.options.memory.selective_policy,
                                    self.recompute_stops_early)
                * (self.recomputed if self.layout.recompute == "full" else 1.0))

    def recompute_flops(self, compute: LayerCompute) -> float:
        """Tensor-core FLOPs of `recompute_s`."""
        return compute.recompute_flops(self.layout.recompute, self.options.memory.selective_policy,
                                       self.recompute_stops_early) * (
            self.recomputed if self.layout.recompute == "full" else 1.0)


@dataclass(frozen=True, slots=True)
class Layers:
    """Compute of one dense and one MoE layer for one micro-batch (None: the model has no such layer)."""

    dense: LayerCompute | None
    moe: LayerCompute | None


#: layer_compute's answers, shared by every estimate of a process (a search estimates thousands of layouts that
#: differ only in pp, dp, vpp, sharding or recompute). layer_compute is a pure function of its arguments, and reads
#: of the layout only tp, cp, the micro-batch, sequence parallelism, ep and the expert TP degree
#: (expert_parallel_degrees: where it follows from dp, the derived etp is in the key). The key holds those, the
#: judgements' values, and the ids of the model, GPU and calibration; the entry keeps those three objects alive
#: (their ids cannot be reused while it exists) and a hit checks it holds the very same objects.
_LAYER_CACHE: dict[tuple[object, ...], tuple[tuple[object, ...], LayerCompute]] = {}
_LAYER_CACHE_MAX = 1 << 16  # emptied when full (a long-lived process stays bounded); a large MoE search needs ~6k


def shared_layer_compute(model: ModelSpec, layout: Layout, gpu: GPUSpec, calibration: CalibrationProfile, *,
                         seq_len: int, precision: Precision, moe_layer: bool, judged: Judgements,
                         fused_elementwise: bool = True) -> LayerCompute:
    """layer_compute's answer, computed once per process for its arguments (_LAYER_CACHE)."""
    key = (id(model), id(gpu), id(calibration), judged.key, seq_len, precision, moe_layer, fused_elementwise,
           layout.tp, layout.cp, layout.micro_batch, layout.sequence_parallel, layout.ep,
           expert_parallel_degrees(layout)[0])
    owners = (model, gpu, calibration)
    found = _LAYER_CACHE.get(key)
    if found is not None and all(a is b for a, b in zip(found[0], owners, strict=True)):
        return found[1]
    compute = layer_compute(model, layout, gpu, calibration, seq_len=seq_len, precision=precision,
                            moe_layer=moe_layer, judged=judged, fused_elementwise=fused_elementwise)
    if len(_LAYER_CACHE) >= _LAYER_CACHE_MAX:
        _LAYER_CACHE.clear()
    _LAYER_CACHE[key] = (owners, compute)
    return compute


def _layer(ctx: StepContext, moe_layer: bool) -> LayerCompute:
    return shared_layer_compute(ctx.model, ctx.layout, ctx.cluster.gpu, ctx.calibration, seq_len=ctx.job.seq_len,
                                precision=ctx.job.precision, moe_layer=moe_layer, judged=ctx.options.judged,
                                fused_elementwise=ctx.options.fused_elementwise)


def layer_computes(ctx: StepContext) -> Layers:
    """The compute of the model's dense and MoE layers on this layout."""
    return Layers(_layer(ctx, False) if ctx.moe_from > 0 else None,
                  _layer(ctx, True) if ctx.moe_from < ctx.model.layers else None)
