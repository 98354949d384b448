"""Published, measured training runs in gpufleet's run schema (docs/runs.md).

`load_runs(path)` validates a YAML list of runs; `run_model`, `run_cluster` and `run_job` turn one
run into the planner's own records. The shipped copies live in `gpufleet/catalog/runs/`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpufleet.catalog.calibration import AttentionKernel, CalibrationProfile
from gpufleet.catalog.records import ModelSpec, MoESpec, NodeSpec
from gpufleet.catalog.registry import Catalog, describe_validation_error, read_yaml
from gpufleet.errors import CatalogError, InputError
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.parallel.layout import Recompute, SelectivePolicy, Sharding
from gpufleet.parallel.memory import GradDtype
from gpufleet.perf.step import StepOptions
from gpufleet.planner.search import SearchSpace
from gpufleet.workload.job import Job

_Strict = ConfigDict(extra="forbid", frozen=True)


class RunMoE(BaseModel):
    model_config = _Strict
    experts: int
    top_k: int
    shared_experts: int = 0
    expert_ffn_hidden: int
    dense_layers: int = 0


class RunModel(BaseModel):
    model_config = _Strict
    name: str
    layers: int = Field(ge=1)
    hidden: int = Field(ge=1)
    heads: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    ffn_hidden: int | None = None
    gated_mlp: bool
    vocab: int = Field(ge=1)
    tied_embeddings: bool | None = None
    moe: RunMoE | None = None


class RunHardware(BaseModel):
    model_config = _Strict
    gpu: str
    num_gpus: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    scale_out_gbps_per_gpu: float | None = Field(default=None, gt=0)


class RunLayout(BaseModel):
    model_config = _Strict
    tp: int | None = Field(default=None, ge=1)
    pp: int | None = Field(default=None, ge=1)
    dp: int | None = Field(default=None, ge=1)
    cp: int | None = Field(default=None, ge=1)
    ep: int | None = Field(default=None, ge=1)
    vpp: int | None = Field(default=None, ge=1)
    sequence_parallel: bool | None = None
    sharding: Sharding | None = None
    micro_batch: int | None = Field(default=None, ge=1)
    recompute: Recompute | None = None
    #: gpufleet extension of the run schema (docs/runs.md): Megatron-Core's --expert-tensor-parallel-size (null: the
    #: stack recipe's, else the convention of `expert_parallel_degrees`)
    expert_tp: int | None = Field(default=None, ge=1)


class RunMeasured(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    tokens_per_s_per_gpu: float | None = None
    step_time_s: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    hfu: float | None = None


class RunTarget(BaseModel):
    model_config = _Strict
    tokens_per_s_per_gpu: float = Field(gt=0)
    how: str = ""


class PublishedRun(BaseModel):
    """One measured run, exactly as docs/runs.md describes it."""

    model_config = _Strict
    id: str
    source: str
    model: RunModel
    seq_len: int = Field(ge=1)
    global_batch: int | None = Field(default=None, ge=1)
    precision: Literal["bf16", "fp16", "fp8"] | None = None
    hardware: RunHardware
    layout: RunLayout
    measured: RunMeasured
    target: RunTarget
    flop_basis: str = ""
    quality: Literal["high", "medium", "low"]
    notes: str = ""


def shipped_runs_path(name: str = "published_runs.yaml") -> Path:
    """Path of a run file shipped inside the package."""
    return Path(str(resources.files("gpufleet.catalog") / "runs" / name))


def load_runs(path: Path | None = None) -> list[PublishedRun]:
    """Validate a run file (default: the shipped published runs); one-line CatalogError on bad input."""
    path = path or shipped_runs_path()
    document = read_yaml(path, "run file")
    if not isinstance(document, list):
        raise CatalogError(f"run file {path} must be a YAML list of runs (schema: docs/runs.md)")
    if not document:
        raise CatalogError(f"run file {path} holds no runs (schema: docs/runs.md)")
    runs: list[PublishedRun] = []
    seen: set[str] = set()
    for index, entry in enumerate(document):
        try:
            run = PublishedRun.model_validate(entry)
            run_model(run)  # the architecture itself must hold together (heads divide hidden, kv_heads divide heads)
        except ValidationError as error:
            label = entry.get("id", f"#{index}") if isinstance(entry, dict) else f"#{index}"
            problem = describe_validation_error(error)
            if error.title == ModelSpec.__name__:  # the run schema has no head_dim to give: the typo is elsewhere
                problem = "model: " + problem.replace("; give head_dim", "; check hidden and heads")
            raise CatalogError(f"run file {path}: run {label}: {problem}") from None
        if run.id in seen:  # results, rankings and plots are keyed by id
            raise CatalogError(f"run file {path}: run id {run.id!r} appears twice; ids must be unique")
        seen.add(run.id)
        runs.append(run)
    return runs


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-") or "model"


def run_model(run: PublishedRun) -> ModelSpec:
    """The run's architecture as a ModelSpec (GPT-style plain MLPs get LayerNorm and biases)."""
    spec = run.model
    moe = None
    if spec.moe is not None:
        moe = MoESpec(**spec.moe.model_dump())
    plain = not spec.gated_mlp
    return ModelSpec(
        id=_slug(spec.name),
        name=spec.name,
        source=run.source,
        layers=spec.layers,
        hidden=spec.hidden,
        heads=spec.heads,
        kv_heads=spec.kv_heads,
        ffn_hidden=spec.ffn_hidden,
        gated_mlp=spec.gated_mlp,
        vocab=spec.vocab,
        tied_embeddings=bool(spec.tied_embeddings),
        norm="layernorm" if plain else "rmsnorm",
        linear_bias=plain,
        moe=moe,
    )


def pinned_layout_problem(run: PublishedRun) -> str:
    """Why no layout keeps the run's given degrees on its GPUs (for a search that found nothing to try): the first
    rule the given tp, pp, cp and dp break, else which free fields found no legal value."""
    layout, model, gpus = run.layout, run.model, run.hardware.num_gpus
    given = {name: getattr(layout, name) for name in ("tp", "pp", "cp", "dp") if getattr(layout, name) is not None}
    product = math.prod(given.values())
    named = " × ".join(f"{name}={value}" for name, value in given.items())
    if gpus % product or ("cp" in given and product != gpus):
        return f"{named} = {product} does not split the run's {gpus} GPUs (tp × pp × cp × dp must equal them)"
    if layout.tp is not None and model.heads % layout.tp:
        return f"tp={layout.tp} does not divide the model's {model.heads} heads"
    if layout.pp is not None and layout.pp > model.layers:
        return f"pp={layout.pp} is more pipeline stages than the model's {model.layers} layers"
    if layout.dp is not None and run.global_batch is not None and run.global_batch % layout.dp:
        return f"dp={layout.dp} does not divide the global batch of {run.global_batch} sequences"
    free = [name for name in ("cp", "ep", "vpp", "micro_batch") if getattr(layout, name) is None]
    return (f"no value of the free fields ({', '.join(free) or 'none'}) gives a legal layout with {named} on "
            f"{gpus} GPUs")


def _same_shape(spec: ModelSpec, run: RunModel) -> bool:
    moe = spec.moe
    run_moe = run.moe
    if (moe is None) != (run_moe is None):
        return False
    if moe is not None and run_moe is not None and (moe.experts, moe.top_k, moe.expert_ffn_hidden) != (
            run_moe.experts, run_moe.top_k, run_moe.expert_ffn_hidden):
        return False
    return (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.vocab, spec.gated_mlp) == (
        run.layers, run.hidden, run.heads, run.kv_heads, run.vocab, run.gated_mlp) and (
        spec.ffn_hidden == run.ffn_hidden or run.ffn_hidden is None)


def resolve_run_model(run: PublishedRun, catalog: Catalog | None) -> ModelSpec:
    """The catalog's model of the same shape when there is one (it knows what the run schema cannot say:
    head_dim, qk-norm, biases, MLA), else the run's own description."""
    if catalog is not None:
        for record in catalog.records("models").values():
            if isinstance(record, ModelSpec) and _same_shape(record, run.model):
                return record
    return run_model(run)


def run_job(run: PublishedRun, global_batch: int, catalog: Catalog | None = None) -> Job:
    precision = run.precision or "bf16"
    return Job(model=resolve_run_model(run, catalog), tokens=1e12, seq_len=run.seq_len, global_batch=global_batch,
               precision=precision)


def run_cluster(run: PublishedRun, catalog: Catalog, node_id: str | None = None) -> Cluster:
    """The run's cluster: the catalog GPU and its node (or `node_id` when it holds that GPU), with the
    run's GPUs per node and per-GPU scale-out bandwidth."""
    hardware = run.hardware
    gpu = catalog.gpu(hardware.gpu)
    node: NodeSpec = catalog.node_for_gpu(hardware.gpu)
    if node_id is not None and catalog.node(node_id).gpu == gpu.id:
        node = catalog.node(node_id)
    changes: dict[str, object] = {"gpus": hardware.gpus_per_node}
    if hardware.scale_out_gbps_per_gpu is not None:
        changes.update(nics=hardware.gpus_per_node, nic_gbps=hardware.scale_out_gbps_per_gpu)
    node = node.model_copy(update=changes)
    network = catalog.network(node.default_network)
    return Cluster(gpu=gpu, node=node, gpus=hardware.num_gpus, fabric=Fabric(network=network))


@dataclass(frozen=True)
class StackRecipe:
    """What a published stack is known to have run with, where it differs from gpufleet's defaults (FA2-class
    attention, Megatron-LM's fp32 `main_grad` buffer, no TP comm overlap, 1.2 expert imbalance, dropless
    routing); None keeps the default. `reason` says where it is written."""

    reason: str
    attention_kernel: AttentionKernel | None = None
    grad_dtype: GradDtype | None = None
    tp_comm_overlap: bool | None = None
    ep_imbalance: float | None = None
    moe_dropless: bool | None = None
    expert_tp: int | None = None
    sharding: Sharding | None = None  # fills a run's null sharding
    ep_comm_overlap: bool | None = None
    ep_dispatch: Literal["all-to-all", "dedup"] | None = None
    fp32_params: bool | None = None  # PyTorch FSDP2: the sharded fp32 parameter is the optimizer's master
    selective_policy: SelectivePolicy | None = None
    #: a null micro-batch size is the local batch split into `pp` micro-batches (torchtitan's default)
    micro_batches_per_pp_stage: bool = False
    #: values a null vpp may take (None: the fill's usual range)
    vpps: tuple[int, ...] | None = None
    tp_async_backward: bool | None = None
    tp_gathered_inputs: bool | None = None
    sequence_parallel: bool | None = None  # fills a run's null sequence_parallel
    logits_bytes_per_element: float | None = None  # unfused fp32 cross-entropy keeps ~12 (docs/memory.md)
    activation_offload: bool | None = None  # False: the stack cannot keep activations in CPU memory
    context_parallel: bool | None = None  # False: the stack has no context parallelism
    loss_bytes_per_logit: float | None = None  # the cross-entropy's HBM bytes per logit (fused / PyTorch: 40)


_TE_ATTENTION = "Transformer Engine gives cuDNN FusedAttention preference on Hopper and newer"
#: NeMo 2's performance scripts (the tables before Megatron-Bridge took them over) set the same gradient and TP
#: overlap settings; their MoE routing is not stated, so the default imbalance stays.
_NEMO2_RECIPE = StackRecipe(
    attention_kernel="cudnn", grad_dtype="bf16", tp_comm_overlap=True, sharding="zero1", loss_bytes_per_logit=40.0,
    reason=f"{_TE_ATTENTION}; NeMo 2 performance scripts (scripts/performance/llm/*): "
           "plugins.grad_reduce_in_fp32 = False, userbuffers TP-overlap configs, and the recipes' "
           "distributed_fused_adam_with_cosine_annealing optimizer (use_distributed_optimizer=True: ZeRO-1); "
           "GPTConfig's cross_entropy_loss_fusion=True")
_MEGATRON_BRIDGE_RECIPE = StackRecipe(
    attention_kernel="cudnn", grad_dtype="bf16", tp_comm_overlap=True, ep_imbalance=1.0, expert_tp=1,
    sharding="zero1", loss_bytes_per_logit=40.0,
    reason=f"{_TE_ATTENTION}; the performance recipes set ddp.grad_reduce_in_fp32=False, a userbuffers "
           "TP-overlap config and the distributed optimizer (ZeRO-1; FSDP only where a row says so: "
           "perf_matrix 'fsdp: false') (scripts/performance/configs/*/*_llm_pretrain.*), their MoE base configs set "
           "expert_tensor_parallel_size=1 (configs/deepseek, configs/qwen *_workload_base_configs.py), and they "
           "benchmark MoE models with dropless, force-balanced routing (Megatron-Bridge 0.1.0rc3 changelog); its "
           "model providers fuse the cross-entropy (cross_entropy_loss_fusion=True)")

#: Megatron-LM and its Megatron-DeepSpeed forks as of 2021: unfused attention, the column-parallel backward
#: all-reduce in line, no sequence or context parallelism, no CPU activation offload (each entry says where from).
_MEGATRON_2021_RECIPE = StackRecipe(
    attention_kernel="materialized", tp_async_backward=False, sequence_parallel=False, activation_offload=False,
    context_parallel=False, reason="")

#: Stack recipes keyed by words of the run's `source`; the first match wins.
STACK_RECIPES: tuple[tuple[str, StackRecipe], ...] = (
    ("2412.19437", StackRecipe(ep_comm_overlap=True, ep_dispatch="dedup", reason=(
        "DeepSeek-V3 Technical Report, Sec. 3.2: DualPipe overlaps the expert all-to-all of one micro-batch with "
        "another's computation, and each token crosses InfiniBand once per destination node, then NVLink"))),
    ("nemo automodel", StackRecipe(ep_dispatch="dedup", fp32_params=True, activation_offload=False, reason=(
        "NeMo AutoModel's performance tables name DeepEP among each MoE row's kernel optimizations (a token sent "
        "once per destination node, and once per destination GPU inside a node); it trains with PyTorch FSDP2, "
        "whose sharded fp32 parameters are the optimizer's master copy, and has no CPU offloading of activations "
        "(Megatron-Core's)"))),
    ("torchtitan", StackRecipe(
        fp32_params=True, selective_policy="op", micro_batches_per_pp_stage=True, vpps=(1, 2),
        tp_async_backward=False, tp_gathered_inputs=True, logits_bytes_per_element=12.0, activation_offload=False,
        loss_bytes_per_logit=40.0,
        reason=(
            "torchtitan trains with PyTorch FSDP2 (fully_shard with a bf16 MixedPrecisionPolicy): the sharded fp32 "
            "parameters are the optimizer's master copy, bf16 weights exist only while a layer is gathered; its "
            "selective checkpointing is op-level in the Llama presets (train_configs/llama3_8b.toml: "
            "selective_ac_option = 'op'), saving every matmul output except every second one (parallelize_llama.py, "
            "Dec 2024); with pipeline parallelism it splits the local batch into as many micro-batches as there "
            "are pipeline ranks unless told otherwise ('pipeline_parallel_microbatches or parallel_dims.pp') and "
            "gives looped (interleaved) schedules 2 stages per rank by default (generate_split_points); its "
            "DTensor tensor parallelism runs the backward's collectives in line (only AsyncTP overlaps them) and "
            "autograd keeps each column GEMM's all-gathered input for its backward; its loss upcasts the logits "
            "(cross_entropy(pred.flatten(0, 1).float(), ...): ~12 bytes per logit, docs/memory.md); its CPU "
            "offload (enable_cpu_offload) moves FSDP2's parameters and optimizer, not activations"))),
    ("2407.21783", StackRecipe(sharding="zero2", reason=(
        "Meta's Llama 3 training (The Llama 3 Herd of Models, Sec. 3.3.2): FSDP sharding the optimizer states and "
        "gradients, model weights not resharded after the forward pass (ZeRO-2-like)"))),
    ("llm-foundry", StackRecipe(attention_kernel="flash-v1", reason=(
        "the MPT benchmark sweep ran attn_impl=triton, FlashAttention-1 in Triton "
        "(scripts/train/benchmarking/submit_benchmarks.py)"))),
    ("ptd-p", replace(_MEGATRON_2021_RECIPE, reason=(
        "Megatron-LM 2021 (SC21): fused scale-mask-softmax over the full s×s scores; its column-parallel layers "
        "all-reduced the input gradient in line (copy_to_tensor_model_parallel_region), before Megatron-LM's "
        "asynchronous TP all-reduce (ColumnParallelLinearWithAsyncAllreduce, early 2022) and sequence "
        "parallelism (Korthikanti et al., 2022); no CPU activation offloading (a later Megatron-Core feature)"))),
    ("bigscience", replace(_MEGATRON_2021_RECIPE, reason=(
        "BLOOM on Megatron-DeepSpeed (2022): fused scale-mask-softmax; its fork's ColumnParallelLinear all-reduces "
        "the input gradient in line and has no sequence parallelism (bigscience-workshop/Megatron-DeepSpeed "
        "megatron/mpu/layers.py)"))),
    ("2201.11990", replace(_MEGATRON_2021_RECIPE, reason=(
        "MT-NLG 530B trained in 2021 on Megatron-DeepSpeed of the same lineage as BLOOM's fork: fused "
        "scale-mask-softmax, in-line TP all-reduce in the column-parallel backward, no sequence parallelism"))),
    # the 25.09 container's MoE rows are labelled "(tokendrop)" in the archive
    ("25.09 nemo container", replace(_MEGATRON_BRIDGE_RECIPE, moe_dropless=False)),
    ("megatron-bridge", _MEGATRON_BRIDGE_RECIPE),
    ("megatron-core", StackRecipe(attention_kernel="cudnn", reason=_TE_ATTENTION)),
    ("nvidia/nemo", _NEMO2_RECIPE),
    ("nemo framework", _NEMO2_RECIPE),
)
#: Runs whose source cites no year after this one predate fused flash attention in the stacks that
#: trained them: FlashAttention appeared in May 2022; Megatron-LM and PyTorch adopted it in 2023.
LAST_PRE_FLASH_YEAR = 2022
_YEAR = re.compile(r"(?<!\d)(?:19|20)\d{2}(?!\d)")
_ARXIV_ID = re.compile(r"\b(\d{2})(?:0[1-9]|1[0-2])\.\d{4,5}\b")


def cited_years(source: str) -> list[int]:
    """Years a citation names: four-digit years and the year of arXiv identifiers (YYMM.NNNNN)."""
    years = [int(match) for match in _YEAR.findall(source)]
    years += [2000 + int(match) for match in _ARXIV_ID.findall(source)]
    return years


def matched_stack(run: PublishedRun) -> tuple[str, StackRecipe] | None:
    """The first STACK_RECIPES entry (key, recipe) whose key the run's source names as a whole word
    ("nvidia/nemo" is not "nvidia/nemotron-4")."""
    source = run.source.lower()
    return next(((key, recipe) for key, recipe in STACK_RECIPES
                 if re.search(rf"(?<![a-z0-9]){re.escape(key)}(?![a-z0-9])", source)), None)


def stack_recipe(run: PublishedRun) -> StackRecipe | None:
    """The recipe of the run's stack (`matched_stack`), if any."""
    matched = matched_stack(run)
    return matched[1] if matched else None


def stack_attention_kernel(run: PublishedRun) -> AttentionKernel | None:
    """The attention kernel the run's stack is known to have used, when that is not FA2 class."""
    recipe = stack_recipe(run)
    if recipe is not None and recipe.attention_kernel is not None:
        return recipe.attention_kernel
    years = cited_years(run.source.lower())
    if years and max(years) <= LAST_PRE_FLASH_YEAR:
        return "materialized"
    return None


#: Stacks `plan --stack` offers, by the name a user knows them by, and the STACK_RECIPES key of each.
PLAN_STACKS: dict[str, str] = {
    "megatron-core": "megatron-core",
    "megatron-bridge": "megatron-bridge",
    "nemo": "nemo framework",
    "nemo-automodel": "nemo automodel",
    "torchtitan": "torchtitan",
    "llm-foundry": "llm-foundry",
    "deepseek-v3": "2412.19437",
    "bloom-megatron-deepspeed": "bigscience",
}


def plan_stack_recipe(name: str) -> StackRecipe:
    """The recipe of a `plan --stack` name; InputError naming the choices for any other."""
    key = PLAN_STACKS.get(name)
    if key is None:
        raise InputError(f"--stack {name!r} is not one of {', '.join(PLAN_STACKS)}")
    return dict(STACK_RECIPES)[key]


def framework_options(stack: str | None, *, overlap_tp: bool | None = None, dtensor_tp: bool | None = None,
                      overlap_ep: bool | None = None, ep_dispatch: str | None = None,
                      selective_policy: str | None = None, eager: bool = False) -> StepOptions:
    """The step and memory settings of `plan`/`memory --stack` (Megatron-LM's defaults without one), then the
    explicit flags given (None: not given) on top; `eager` prices eager PyTorch's element-wise kernels (no stack
    sets it)."""
    options = StepOptions() if stack is None else recipe_step_options(plan_stack_recipe(stack), StepOptions())
    step: dict[str, Any] = {}
    memory: dict[str, Any] = {}
    if overlap_tp is not None:
        step["tp_comm_overlap"] = overlap_tp
    if dtensor_tp is not None:
        step["tp_async_backward"] = not dtensor_tp
        memory["tp_gathered_inputs"] = dtensor_tp
    if overlap_ep is not None:
        step["ep_comm_overlap"] = overlap_ep
    if ep_dispatch is not None:
        step["ep_dispatch"] = ep_dispatch
    if eager:
        step["fused_elementwise"] = False
    if selective_policy is not None:
        memory["selective_policy"] = selective_policy
    return replace(options, **step, memory=replace(options.memory, **memory))


def run_step_options(run: PublishedRun, options: StepOptions | None = None) -> StepOptions:
    """`options` with the settings the run's stack is known to have used (STACK_RECIPES), and eager element-wise
    kernels for a run that says it ran eager (`ran_eager`)."""
    options = options or StepOptions()
    recipe = stack_recipe(run)
    options = options if recipe is None else recipe_step_options(recipe, options)
    return replace(options, fused_elementwise=False) if ran_eager(run) else options


def ran_eager(run: PublishedRun) -> bool:
    """Whether the run's id or notes name it eager PyTorch (no torch.compile: torchtitan's "FSDP" rows beside
    "FSDP + torch.compile"): the word "eager" standing alone and not negated ("not eager", "non-eager")."""
    return _EAGER.search(f"{run.id} {run.notes}".lower()) is not None


_EAGER = re.compile(r"(?<![a-z0-9])(?<!not )(?<!non-)(?<!no )eager(?![a-z0-9])")


def recipe_step_options(recipe: StackRecipe, options: StepOptions) -> StepOptions:
    """`options` with the step and memory settings `recipe` states (the rest kept)."""
    step_fields = ("tp_comm_overlap", "ep_imbalance", "moe_dropless", "ep_comm_overlap", "ep_dispatch",
                   "tp_async_backward", "loss_bytes_per_logit")
    changes: dict[str, Any] = {name: getattr(recipe, name) for name in step_fields if getattr(recipe, name) is not None}
    memory: dict[str, Any] = {name: getattr(recipe, name) for name in ("grad_dtype", "fp32_params", "selective_policy",
                                                                         "tp_gathered_inputs",
                                                                         "logits_bytes_per_element")
                              if getattr(recipe, name) is not None}
    if memory:
        changes["memory"] = replace(options.memory, **memory)
    return replace(options, **changes)


def run_calibration(run: PublishedRun, catalog: Catalog, gpu_id: str) -> CalibrationProfile:
    """The GPU's calibration, with the attention kernel the run's stack used (`stack_calibration`)."""
    return stack_calibration(catalog.calibration(gpu_id), stack_attention_kernel(run))


def stack_calibration(calibration: CalibrationProfile, kernel: AttentionKernel | None) -> CalibrationProfile:
    """`calibration` with a stack's attention kernel; a profile that already names a kernel other than the
    default FA2-class one (materialized, flash-v1, cudnn) is kept."""
    if kernel is not None and calibration.attention_kernel == "flash":
        return calibration.model_copy(update={"attention_kernel": kernel})
    return calibration


def recipe_search_space(recipe: StackRecipe, space: SearchSpace) -> SearchSpace:
    """`space` without the features the stack lacks: sequence or context parallelism, CPU activation offload."""
    if recipe.sequence_parallel is False:
        space = replace(space, sequence_parallel=False)
    if recipe.context_parallel is False:
        space = replace(space, cps=(1,))
    if recipe.activation_offload is False:
        space = replace(space, activation_offload=False)
    return space
