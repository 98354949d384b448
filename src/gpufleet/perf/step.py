"""StepEstimate: seconds per optimizer step, part by part, each split into exposed and hidden time.

A step = the pipeline's critical path over all micro-batches (compute + exposed per-layer
communication on the slowest stage, plus the bubble) + the data-parallel synchronisation that
backward could not hide + the optimizer update + a fixed per-step overhead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.judgements import Judgements, shipped_judgements
from gpufleet.catalog.stacks import (
    CudaGraphModule,
    EpRouting,
    Fp8AmaxGroup,
    Fp8Recipe,
    MoeExpertKernels,
    RecomputeEarlyStop,
)
from gpufleet.errors import InputError
from gpufleet.fabric.collectives import Op
from gpufleet.fabric.placement import Placement
from gpufleet.fabric.topology import Cluster
from gpufleet.parallel.layout import Layout, expert_parallel_degrees, stage_layer_split
from gpufleet.parallel.memory import MemoryAssumptions
from gpufleet.perf.comm_cost import chunked_s as _chunked_s
from gpufleet.perf.comm_cost import overlap as _overlap
from gpufleet.perf.compute import ACTIVATION_BYTES, CROSS_ENTROPY_BYTES_PER_LOGIT, logits_compute_s
from gpufleet.perf.dp_scaling import amax_sync_s, interleaved_exposed_s, straggler_s
from gpufleet.perf.fsdp_overheads import fsdp2_copy_s
from gpufleet.perf.layer_comm import (
    ExpertParallelComm,
    LayerComm,
    TensorParallelComm,
    context_parallel_comm,
    expert_parallel_comm,
    tensor_parallel_comm,
)
from gpufleet.perf.moe_host import MoeHost, moe_host_launch
from gpufleet.perf.offload import activation_offload
from gpufleet.perf.overlap_contention import COLLECTIVE_PARTS, OVERLAP_COMPUTE_SLOWDOWN, contention_s
from gpufleet.perf.parts import Part, comm_parts, compute_parts, step_parts
from gpufleet.perf.pipeline import PipelineSchedule, device_layer_times, nic_share, pipeline_schedule
from gpufleet.perf.step_context import Layers, StepContext, layer_computes
from gpufleet.workload.flops import flops_per_token
from gpufleet.workload.job import Job
from gpufleet.workload.params import embedding_params, layer_params, output_params

__all__ = ["Part", "StepEstimate", "StepOptions", "estimate_step", "pipeline_seconds",
           "run_time_s", "stage_parameters"]

#: Mixed-precision Adam update traffic per parameter: fp32 grad read (4), master, m, v read+write (24),
#: bf16 weight write (2).
OPTIMIZER_BYTES_PER_PARAM = 30


#: StepOptions' numeric fields and the least value each may take (a multiplier of at least 1, the rest not negative)
_NUMBER_FLOORS = (("ep_imbalance", 1.0), ("step_overhead_s", 0.0), ("straggler_sigma", 0.0),
                  ("overlap_slowdown", 0.0), ("fp8_amax_sync_sigma", 0.0), ("loss_bytes_per_logit", 0.0))


@dataclass(frozen=True)
class StepOptions:
    """Framework behaviours the step model needs; defaults follow Megatron-Core's recommended settings.

    The model's judgement constants are a value here, never looked up: `judgements` (None: the catalog that prices
    the request passes its own down, `with_judgements`; priced directly, the shipped catalog's). A field that
    defaults to a judgement is None until set, and its `resolved_*` property reads the value that prices a step.
    """

    #: the judgement constants and constant fits that price this step (catalog/judgements.py); None: see above
    judgements: Judgements | None = field(default=None, repr=False)
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
    #: what an interleaved pipeline's data-parallel reduction and gather (DDP, distributed optimizer) hide behind:
    #: "micro-batch": one micro-batch's backward (forward) of the stage, the last layer exposed;
    #: "chunks" (the default): each model chunk's buckets behind the chunks after it (Megatron-Core launches a chunk's
    #: buckets after its last micro-batch; Calculon's window; perf/dp_scaling.py interleaved_exposed_s;
    #: docs/dp-scaling.md). With vpp = 1 the two are the same
    dp_overlap_window: Literal["micro-batch", "chunks"] = "chunks"
    #: slowest expert rank / mean under top-k routing (None: the judgement, catalog data/judgements.yaml)
    ep_imbalance: float | None = None
    #: data loading, logging, launch gaps per step (None: the judgement, catalog data/judgements.yaml)
    step_overhead_s: float | None = None
    fabric_model: Literal["analytical", "sim"] = "analytical"  # sim: flow-level simulator (slower)
    #: what the framework keeps in memory (gradient dtype, ...; its judged numbers from `judgements`)
    memory: MemoryAssumptions = field(default_factory=MemoryAssumptions)
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
    #: the gate tokens route through, which sets how many destinations a deduplicating dispatcher sends a token to
    #: (perf/moe_routing.py): "learned" (the router as trained, group-limited where the model's router is) or
    #: "round-robin" (NeMo AutoModel's benchmark FakeBalancedGate: k consecutive experts per token)
    ep_routing: EpRouting = "learned"
    #: "per-expert": the host launches each local expert's GEMMs and casts (Transformer Engine's GroupedLinear, as
    #: Megatron-Core's TEGroupedMLP runs it); "grouped": one grouped GEMM covers every local expert (grouped_gemm's
    #: gmm, torch._grouped_mm), so the MoE host cost does not grow with the local experts (perf/moe_host.py)
    moe_expert_kernels: MoeExpertKernels = "per-expert"
    #: layer parts captured in CUDA graphs (Megatron-Core's cuda_graph_modules): the MoE router's and the
    #: dispatcher's preprocessing kernels then cost the host one graph launch (perf/moe_host.py); none by default
    moe_cuda_graph_modules: tuple[CudaGraphModule, ...] = ()
    #: relative spread of per-GPU speed: the step waits for the slowest of the job's GPUs (perf/dp_scaling.py;
    #: dp_scaling.GPU_SPEED_SIGMA is the sourced value); 0: off. Scope "job": over a median GPU; "replicas": only
    #: what dp adds over one replica of tp*pp*cp GPUs
    straggler_sigma: float = 0.0
    straggler_scope: Literal["job", "replicas"] = "job"
    #: FP8 delayed scaling's amax all-reduce spans the data-parallel replicas (Megatron-Core's default amax group
    #: tp x dp x cp) and each replica's time between two of them scatters by this relative spread: the pipeline waits
    #: for the slowest of dp replicas at every chunk forward (perf/dp_scaling.py: amax_sync_fraction; the default is
    #: the recorded constant fit, judgements' fp8_amax_sync_sigma: docs/dp-scaling.md); 0: off; FP8 jobs under
    #: delayed scaling over tp x dp x cp only (fp8_recipe, fp8_amax_group below)
    fp8_amax_sync_sigma: float | None = None
    #: the FP8 recipe (catalog/stacks.py Fp8Recipe) and the ranks a delayed-scaling amax history is reduced over: the
    #: amax wait above applies only to "delayed" over "tp-dp-cp". Defaults: Megatron-Core's (TransformerConfig
    #: fp8_recipe="delayed", tp_only_amax_red=False, core_v0.16.1)
    fp8_recipe: Fp8Recipe = "delayed"
    fp8_amax_group: Fp8AmaxGroup = "tp-dp-cp"
    #: FSDP2's all-gather copy-out and reduce-scatter copy-in on the compute stream (perf/fsdp_overheads.py); for
    #: fully sharded layouts of stacks that run PyTorch's fully_shard; off: FSDP1, Megatron's buffers
    fsdp2_copies: bool = False
    #: compute that runs under a hidden collective runs this much slower; the default is the measured 18.9 %
    #: (perf/overlap_contention.py OVERLAP_COMPUTE_SLOWDOWN; on since it improved every out-of-sample score:
    #: docs/residuals.md); 0: hidden collectives are free
    overlap_slowdown: float = OVERLAP_COMPUTE_SLOWDOWN
    #: how a full activation recompute ends (catalog/stacks.py RecomputeEarlyStop): "off" (Megatron's reentrant
    #: checkpoint re-runs the whole layer, the default); "aten" / "aten-or-compiled": PyTorch's non-reentrant
    #: checkpoint stops before the layer's last GEMM (perf/compute.py recompute_stops_early)
    recompute_early_stop: RecomputeEarlyStop = "off"
    #: an interleaved pipeline's stage-boundary sends and receives run while the next chunk computes, and only what
    #: that chunk's forward cannot cover is exposed (perf/pipeline.py). Megatron-LM's default since 2023-10-12
    #: (`--no-overlap-p2p-communication` turns it off; validate_args turns it off without interleaving), and what
    #: NeMo 2's and Megatron-Bridge's comm-overlap configs set whenever vpp > 1. False: every send in line
    pp_p2p_overlap: bool = True

    def __post_init__(self) -> None:
        for name, least in _NUMBER_FLOORS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value) or value < least):
                raise InputError(f"options.{name} must be a finite number of at least {least:g}, got {value!r}")
        if self.judgements is not None and self.memory.judgements is not self.judgements:
            object.__setattr__(self, "memory", replace(self.memory, judgements=self.judgements))

    @property
    def judged(self) -> Judgements:
        """The judgements that price this step: `judgements`, else the shipped catalog's."""
        return self.judgements if self.judgements is not None else shipped_judgements()

    def with_judgements(self, judged: Judgements) -> StepOptions:
        """These options priced with `judged` (a catalog's) where they name none of their own."""
        return self if self.judgements is not None else replace(self, judgements=judged)

    def stated(self) -> StepOptions:
        """These options with every judged value written out and no judgements attached (what a plan file records:
        the numbers that priced it)."""
        return replace(self, judgements=None, memory=self.memory.stated(), ep_imbalance=self.resolved_ep_imbalance,
                       step_overhead_s=self.resolved_step_overhead_s,
                       fp8_amax_sync_sigma=self.resolved_fp8_amax_sync_sigma)

    @property
    def resolved_ep_imbalance(self) -> float:
        return self.ep_imbalance if self.ep_imbalance is not None else self.judged.ep_imbalance

    @property
    def resolved_step_overhead_s(self) -> float:
        return self.step_overhead_s if self.step_overhead_s is not None else self.judged.step_overhead_s

    @property
    def resolved_fp8_amax_sync_sigma(self) -> float:
        sigma = self.fp8_amax_sync_sigma
        return sigma if sigma is not None else self.judged.fp8_amax_sync_sigma


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
    #: the pipeline's critical path: m x the slowest stage + the bubble (what planner/floors.py bounds from below)
    pipeline_s: float

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
    in buckets of `options.memory.resolved_dp_bucket_elements` (the memory model's bucket), overlapping the last
    micro-batch's backward (the parameter
    all-gather overlaps the next step's first forward). Each collective pays its own latency.
    """
    if layout.dp * layout.cp <= 1:
        return _DataParallelComm(0.0, 0.0, "")
    sharded = layout.sharding in ("zero3", "fsdp", "hsdp")
    bucket = options.memory.resolved_dp_bucket_elements
    units = stage_layers if sharded else math.ceil(params.dense / bucket)
    reduce_op: Op = "all-reduce" if layout.sharding == "none" else "reduce-scatter"
    reduce_s, link = _chunked_s(reduce_op, params.dense * grad_wire_bytes, units, "dp_cp", layout, cluster, options)
    gather_s = 0.0
    if layout.sharding != "none":
        gather_s, _ = _chunked_s("all-gather", params.dense * ACTIVATION_BYTES, units, "dp_cp", layout, cluster,
                                 options)
    if params.expert and expert_parallel_degrees(layout)[1] > 1:
        expert_units = stage_layers if sharded else math.ceil(params.expert / bucket)
        more, _ = _chunked_s(reduce_op, params.expert * grad_wire_bytes, expert_units, "edp", layout, cluster,
                             options)
        reduce_s += more
        if layout.sharding != "none":
            more, _ = _chunked_s("all-gather", params.expert * ACTIVATION_BYTES, expert_units, "edp", layout,
                                 cluster, options)
            gather_s += more
    ratio = options.judged.backward_forward_ratio  # forward : backward compute = 1 : ratio
    forward_window = compute_per_micro_batch_s / (1 + ratio)
    backward_window = compute_per_micro_batch_s * ratio / (1 + ratio)
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
    # "chunks": under an interleaved pipeline every model chunk but the first hides behind the chunks after it
    # (perf/dp_scaling.py: interleaved_exposed_s; with vpp 1, or "micro-batch": one micro-batch's window, the last
    # granule exposed)
    vpp = layout.vpp if options.dp_overlap_window == "chunks" else 1
    group = min(layout.pp, micro_batches)
    reduce_exposed = interleaved_exposed_s(reduce_s, backward_window, granules, vpp, group)
    gather_exposed = interleaved_exposed_s(gather_s, forward_window, granules, vpp, group)
    return _DataParallelComm(reduce_exposed + gather_exposed, total, link)


DataParallelComm = _DataParallelComm


def _optimizer_s(layout: Layout, cluster: Cluster, calibration: CalibrationProfile, params: _StageParams,
                 cpu_adam_slowdown: float) -> float:
    """Adam over this GPU's shard of the parameters: HBM-bound (CPU-bound when offloaded)."""
    shard = layout.dp * layout.cp if layout.sharding != "none" else 1
    expert_shard = expert_parallel_degrees(layout)[1] if layout.sharding != "none" else 1
    local_params = params.dense / shard + params.expert / expert_shard
    seconds = local_params * calibration.optimizer_seconds_per_param(
        OPTIMIZER_BYTES_PER_PARAM / (cluster.gpu.hbm_bytes_per_s * calibration.hbm_fraction))
    if layout.offload_optimizer:
        seconds *= cpu_adam_slowdown  # CPU Adam over host memory (a catalog judgement)
    return seconds


def _stragglers_s(ctx: StepContext, pipeline_s: float) -> float:
    """Waiting for the slowest GPU (perf/dp_scaling.py; off unless StepOptions.straggler_sigma > 0)."""
    options, layout = ctx.options, ctx.layout
    return straggler_s(pipeline_s, layout.gpus, options.straggler_sigma,
                       layout.gpus // layout.dp if options.straggler_scope == "replicas" else 1)


def _amax_sync_s(ctx: StepContext, pipeline_s: float) -> float:
    """FP8 amax all-reduce meetings of the data-parallel replicas (perf/dp_scaling.py; off unless
    StepOptions.fp8_amax_sync_sigma > 0 and the job runs FP8 GEMMs under delayed scaling whose amax group spans the
    data-parallel replicas: current, MX and blockwise scaling reduce no amax history, `tp_only_amax_red` keeps it in
    the tensor-parallel group)."""
    if ctx.job.precision != "fp8" or not amax_over_replicas(ctx.options):
        return 0.0
    return amax_sync_s(pipeline_s, ctx.layout.dp, ctx.options.resolved_fp8_amax_sync_sigma)


def amax_over_replicas(options: StepOptions) -> bool:
    """Whether the FP8 recipe all-reduces an amax history across the data-parallel replicas: delayed scaling over
    Megatron-Core's default group tp x dp x cp (current, MX and blockwise scaling reduce none; `tp_only_amax_red`
    keeps it inside the tensor-parallel group)."""
    return options.fp8_recipe == "delayed" and options.fp8_amax_group == "tp-dp-cp"


def _fsdp2_copies_s(ctx: StepContext, params: _StageParams) -> float:
    """FSDP2's copies around its collectives on the compute stream (perf/fsdp_overheads.py), for fully sharded
    layouts of stacks that run PyTorch's fully_shard (StepOptions.fsdp2_copies)."""
    options, layout = ctx.options, ctx.layout
    if not options.fsdp2_copies or layout.sharding not in ("zero3", "fsdp", "hsdp"):
        return 0.0
    return fsdp2_copy_s(params.dense + params.expert, ctx.micro_batches, param_bytes=ACTIVATION_BYTES,
                        reduce_bytes=options.memory.reduced_grad_bytes(ctx.job.precision),
                        regathered_in_backward=layout.pp == 1, hbm_bytes_per_s=ctx.cluster.gpu.hbm_bytes_per_s,
                        hbm_fraction=ctx.calibration.hbm_fraction)


def _per_step_parts(ctx: StepContext, sync_s: float, fsdp_copy_s: float, amax_s: float = 0.0) -> dict[str, Part]:
    """The --explain parts of the per-step terms that are on (waiting for the slowest GPU, for the slowest replica
    at FP8 amax reductions, FSDP2's copies)."""
    parts: dict[str, Part] = {}
    if sync_s:
        parts["sync.stragglers"] = Part(sync_s, 0.0, f"slowest of {ctx.layout.gpus} GPUs")
    if amax_s:
        parts["sync.fp8-amax"] = Part(amax_s, 0.0, f"slowest of {ctx.layout.dp} replicas at each FP8 amax all-reduce")
    if fsdp_copy_s:
        parts["fsdp.copies"] = Part(fsdp_copy_s, 0.0, "FSDP2 copy-out / reduce-scatter copy-in over HBM")
    return parts


def _add_contention(ctx: StepContext, parts: dict[str, Part]) -> float:
    """Seconds compute loses running under the hidden collectives (perf/overlap_contention.py; on by default, off
    when StepOptions.overlap_slowdown is 0), added to `parts` as compute.overlap-contention when there are any."""
    contention = contention_s((parts[name].hidden_s for name in COLLECTIVE_PARTS if name in parts),
                              ctx.options.overlap_slowdown)
    if contention:
        parts["compute.overlap-contention"] = Part(contention, 0.0, "compute slowed under hidden collectives")
    return contention


@dataclass(frozen=True, slots=True)
class _Pipeline:
    """A step's layers, their per-layer communication, host launches and offload, and the pipeline they make."""

    layers: Layers
    tp: TensorParallelComm
    cp: LayerComm
    ep: ExpertParallelComm
    host: MoeHost
    offload: LayerComm
    logits_s: float
    logits_flops: float
    schedule: PipelineSchedule


def _pipeline(ctx: StepContext) -> _Pipeline:
    """Each layer's compute, its per-layer communication (TP, CP, EP), the MoE host launches and the activation
    offload per micro-batch; then the pipeline's stages, p2p sends and bubble."""
    job, layout, cluster = ctx.job, ctx.layout, ctx.cluster
    layers = layer_computes(ctx)
    tp = tensor_parallel_comm(ctx, layers)
    cp = context_parallel_comm(ctx, layers)
    ep = expert_parallel_comm(ctx, layers)
    device = device_layer_times(ctx, layers, tp, cp, ep)
    host = moe_host_launch(ctx, device.moe_s)
    offload = activation_offload(ctx, layers)
    logits_s, logits_flops = logits_compute_s(job.model, layout, cluster.gpu, ctx.calibration, seq_len=job.seq_len,
                                              precision=job.precision,
                                              loss_bytes_per_logit=ctx.options.loss_bytes_per_logit)
    schedule = pipeline_schedule(ctx, layers, device, host, offload, logits_s, nic_share(ctx, cp, ep))
    return _Pipeline(layers, tp, cp, ep, host, offload, logits_s, logits_flops, schedule)


def pipeline_seconds(job: Job, layout: Layout, cluster: Cluster, calibration: CalibrationProfile,
                     options: StepOptions) -> float:
    """`estimate_step(...).pipeline_s` (the same arithmetic) without the rest of the step: what planner/floors.py
    needs of a step, thousands of times per search."""
    return _pipeline(StepContext.of(job, layout, cluster, calibration, options)).schedule.pipeline_s


def estimate_step(job: Job, layout: Layout, cluster: Cluster, calibration: CalibrationProfile,
                  options: StepOptions | None = None) -> StepEstimate:
    """Estimate one optimizer step of `job` with `layout` on `cluster` (layout assumed valid).

    Read top to bottom: each layer's compute, its per-layer communication (TP, CP, EP) and the MoE host launches
    make a layer's time; the layers, the p2p sends and the bubble make the pipeline; the data-parallel
    synchronisation that backward cannot hide, the optimizer and a fixed overhead complete the step."""
    ctx = StepContext.of(job, layout, cluster, calibration, options or StepOptions())
    # --- per layer and micro-batch, then the pipeline: stages, p2p, bubble (_pipeline) ----------
    piped = _pipeline(ctx)
    layers, tp, cp, ep, host, offload = piped.layers, piped.tp, piped.cp, piped.ep, piped.host, piped.offload
    logits_flops, schedule = piped.logits_flops, piped.schedule
    logits_s = piped.logits_s

    # --- once per step: data-parallel synchronisation, optimizer, overhead ----------------------
    worst = schedule.worst_stage
    params = stage_parameters(job, layout, worst)
    dp = _data_parallel(layout, cluster, ctx.options, params, micro_batches=ctx.micro_batches,
                        stage_layers=ctx.stage_layers,
                        compute_per_micro_batch_s=schedule.slowest_s - schedule.p2p_per_mb_s
                        - schedule.stage_nic_s[worst],
                        grad_wire_bytes=ctx.options.memory.reduced_grad_bytes(job.precision))
    optimizer_s = _optimizer_s(layout, cluster, calibration, params, ctx.options.judged.cpu_adam_slowdown)
    sync_s, fsdp_copy_s = _stragglers_s(ctx, schedule.pipeline_s), _fsdp2_copies_s(ctx, params)
    amax_s = _amax_sync_s(ctx, schedule.pipeline_s)
    step_s = (schedule.pipeline_s + dp.exposed_s + optimizer_s + ctx.options.resolved_step_overhead_s + sync_s
              + fsdp_copy_s + amax_s)

    # --- the parts for --explain ----------------------------------------------------------------
    compute = compute_parts(ctx, layers, logits_flops)
    comm = comm_parts(ctx, tp, cp, ep, host, offload, schedule, dp) | _per_step_parts(ctx, sync_s, fsdp_copy_s, amax_s)
    parts = step_parts(ctx, compute, logits_s, comm, optimizer_s, schedule)
    step_s += _add_contention(ctx, parts)
    return StepEstimate(
        step_s=step_s,
        parts=parts,
        tokens_per_step=job.global_batch * job.seq_len,
        gpus=cluster.gpus,
        model_flops_per_token=flops_per_token(job.model, job.seq_len).training,
        hardware_flops_per_step_per_gpu=compute.hardware_flops,
        peak_flops=cluster.gpu.peak_flops(job.precision),
        bubble_fraction=schedule.bubble_s / step_s if step_s > 0 else 0.0,
        micro_batches=ctx.micro_batches,
        pipeline_s=schedule.pipeline_s,
    )


def run_time_s(job: Job, step: StepEstimate) -> float:
    """Seconds to train `job.tokens` at this step rate (no failures; see reliability for goodput)."""
    return math.ceil(job.steps) * step.step_s


def fp8_amax_words(options: StepOptions) -> str:
    """What the FP8 amax wait (`fp8_amax_sync_sigma`) does under the options' recipe, for a header line."""
    if not options.resolved_fp8_amax_sync_sigma:
        return "no FP8 amax wait (--fp8-amax-sync 0)"
    sigma = f"sigma {options.resolved_fp8_amax_sync_sigma:.2%}"
    if amax_over_replicas(options):
        return f"FP8 amax all-reduce over the replicas, {sigma}"
    reduces = ("amax over the tensor-parallel group only" if options.fp8_recipe == "delayed"
               else "no amax history across ranks")
    return f"FP8 amax wait ({sigma}) not applied: {options.fp8_recipe} scaling reduces {reduces}"
