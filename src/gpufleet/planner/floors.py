"""Lower bounds on a layout's step time, cheap enough to compute for every layout a search finds that fits.

The search estimates the step of only the layouts whose floor could still beat the k-th fastest step found so far
(`search(..., keep=k)`); a floor must therefore never exceed `estimate_step(...).step_s`. tests/test_search_prune.py
checks that with hypothesis over random models, clusters, layouts and step options, and that a pruned search ranks
exactly the layouts the exhaustive one does.

`StepFloor`: a step is the pipeline (m·slowest stage + bubble: `StepEstimate.pipeline_s`) plus what data-parallel
synchronisation leaves exposed, the optimizer, a fixed overhead and per-step terms that are never negative (FSDP2's
copies, waiting for the slowest GPU, compute slowed under hidden collectives), and FP8 delayed scaling's amax wait: the
pipeline times a share that depends on dp alone, so the floor carries it as floor x (1 + share). Every transformer layer
costs the same per micro-batch (compute, recompute, TP, CP and EP communication, MoE host launches) whatever the
pipeline depth, data-parallel degree or sharding, as long as tp, cp, ep, the expert TP degree, the micro-batch, sequence
parallelism and the recompute mode are the same. So one estimate of a one-stage pipeline with those degrees gives S, the
time one micro-batch takes through all layers and the output head, and for any such layout

    step >= m·slowest + (pp - 1)/vpp · mean + overhead >= (m + (pp - 1)/vpp) · S/pp + overhead,

since the slowest stage is at least the mean and the mean is at least S/pp (the stages add point-to-point and
offload time on top). The one-stage layout runs B micro-batches (B the global batch, at least any layout's m), so
that where the expert all-to-all overlaps compute (its exposed share shrinks with more micro-batches in flight) its
S is no more than any layout's.

`ComputeFloor`: the step's compute parts without recompute (--explain's compute.gemm, .attention, .elementwise
and .logits+loss), computed the same way and in the same order as the step model adds them: the order in which the
search tries block recompute and offload variants (`search._add_cheaper_variants`).
"""

from __future__ import annotations

from dataclasses import replace

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.fabric.topology import Cluster
from gpufleet.parallel.layout import DEFAULT_ORDER, Layout, expert_parallel_degrees, micro_batches_per_step
from gpufleet.perf.compute import LayerCompute, logits_compute_s
from gpufleet.perf.dp_scaling import amax_sync_fraction
from gpufleet.perf.step import StepOptions, amax_over_replicas, pipeline_seconds
from gpufleet.perf.step_context import shared_layer_compute
from gpufleet.workload.job import Job

#: A floor is computed with other roundings than the step it bounds: a layout is ruled out only when its floor is
#: above the k-th best step by more than this share (floating-point error is ~1e-15 of a step).
FLOOR_MARGIN = 1e-9


def rules_out(floor_s: float, threshold_s: float) -> bool:
    """Whether a step of at least `floor_s` (to rounding) cannot be below `threshold_s`."""
    return floor_s * (1 - FLOOR_MARGIN) >= threshold_s


class StepFloor:
    """A lower bound on the step of any layout of one job on one cluster (module docstring): one step estimate per
    distinct (tp, cp, ep, expert tp, micro-batch, sequence parallelism, recompute)."""

    def __init__(self, job: Job, cluster: Cluster, calibration: CalibrationProfile, options: StepOptions) -> None:
        self.job = job
        self.cluster = cluster
        self.calibration = calibration
        self.options = options
        self._per_micro_batch: dict[tuple[object, ...], tuple[float, float]] = {}
        #: the FP8 amax wait's spread where the step adds that wait (perf/step.py _amax_sync_s), else None
        self._amax_sigma = (options.resolved_fp8_amax_sync_sigma
                            if job.precision == "fp8" and amax_over_replicas(options) else None)

    def __call__(self, layout: Layout) -> float:
        """Seconds the step of `layout` cannot go below; 0 for the layouts the argument does not cover (block
        recompute, activation offload, a non-default rank order)."""
        if (layout.recompute_layers is not None or layout.offload_activation_layers is not None
                or layout.order != DEFAULT_ORDER):
            return 0.0
        etp, _ = expert_parallel_degrees(layout)
        key = (layout.tp, layout.cp, layout.ep, etp, layout.micro_batch, layout.sequence_parallel, layout.recompute)
        found = self._per_micro_batch.get(key)
        if found is None:
            found = self._per_micro_batch[key] = self._one_stage(layout, etp)
        through_all_layers_s, overhead_s = found
        m = micro_batches_per_step(layout, self.job.global_batch)
        pipeline_floor_s = (m + (layout.pp - 1) / layout.vpp) * (through_all_layers_s / layout.pp)
        return pipeline_floor_s * (1 + self._amax_fraction(layout.dp)) + overhead_s

    def _amax_fraction(self, dp: int) -> float:
        """The FP8 amax wait's share of the pipeline (perf/dp_scaling.py amax_sync_fraction): the step adds
        pipeline_s x this, and pipeline_s is at least the pipeline floor; 0 where the step adds none."""
        return 0.0 if self._amax_sigma is None else amax_sync_fraction(dp, self._amax_sigma)

    def _one_stage(self, layout: Layout, etp: int) -> tuple[float, float]:
        """(S, overhead): one micro-batch through every layer and the head, and the fixed per-step overhead."""
        dp = self.cluster.gpus // (layout.tp * layout.cp)
        micro_batches = self.job.global_batch
        one_stage = Layout(tp=layout.tp, pp=1, dp=dp, cp=layout.cp, ep=layout.ep, vpp=1,
                           sequence_parallel=layout.sequence_parallel, micro_batch=layout.micro_batch,
                           recompute=layout.recompute,
                           expert_tp=etp if self.job.model.moe is not None else None)
        job = replace(self.job, global_batch=dp * layout.micro_batch * micro_batches)
        # the step's "overhead" part is StepOptions.step_overhead_s
        return (pipeline_seconds(job, one_stage, self.cluster, self.calibration, self.options) / micro_batches,
                self.options.resolved_step_overhead_s)


class ComputeFloor:
    """The step's compute without recompute, as --explain's compute parts add up (module docstring); the layer
    compute is computed once per distinct (tp, cp, micro-batch, sequence parallelism, ep, expert tp)."""

    def __init__(self, job: Job, cluster: Cluster, calibration: CalibrationProfile, options: StepOptions) -> None:
        self.job = job
        self.cluster = cluster
        self.calibration = calibration
        self.options = options
        self._layers: dict[tuple[object, ...], tuple[LayerCompute | None, LayerCompute | None, float]] = {}

    def __call__(self, layout: Layout) -> float:
        model = self.job.model
        etp, _ = expert_parallel_degrees(layout)
        key = (layout.tp, layout.cp, layout.micro_batch, layout.sequence_parallel, layout.ep, etp)
        found = self._layers.get(key)
        if found is None:
            found = self._layers[key] = self._compute(layout)
        dense_layer, moe_layer, logits_s = found
        m = micro_batches_per_step(layout, self.job.global_batch)
        pp = layout.pp
        moe_from = model.layers if model.moe is None else model.moe.dense_layers
        gemm = attention = elementwise = 0.0
        for compute, count in ((dense_layer, moe_from if moe_from < model.layers else model.layers),
                               (moe_layer, model.layers - moe_from)):
            if compute is None or count <= 0:
                continue
            layers_here = count / pp
            gemm += m * layers_here * 3 * compute.gemm_fwd_s
            attention += m * layers_here * (compute.attention_fwd_s + compute.attention_bwd_s)
            elementwise += m * layers_here * 3 * compute.elementwise_fwd_s
        return sum((gemm, attention, elementwise, m * logits_s / pp))

    def _compute(self, layout: Layout) -> tuple[LayerCompute | None, LayerCompute | None, float]:
        job, model = self.job, self.job.model
        moe_from = model.layers if model.moe is None else model.moe.dense_layers
        fused = self.options.fused_elementwise

        def layer(moe: bool) -> LayerCompute:
            return shared_layer_compute(model, layout, self.cluster.gpu, self.calibration, seq_len=job.seq_len,
                                        precision=job.precision, moe_layer=moe, judged=self.options.judged,
                                        fused_elementwise=fused)

        logits_s, _ = logits_compute_s(model, layout, self.cluster.gpu, self.calibration, seq_len=job.seq_len,
                                       precision=job.precision, loss_bytes_per_logit=self.options.loss_bytes_per_logit)
        return (layer(False) if moe_from > 0 else None, layer(True) if moe_from < model.layers else None, logits_s)
