"""Published, measured training runs in gpufleet's run schema (docs/runs.md).

`load_runs(path)` validates a YAML list of runs; `run_model`, `run_cluster` and `run_job` turn one
run into the planner's own records. The shipped copies live in `gpufleet/catalog/runs/`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gpufleet.catalog.calibration import AttentionKernel, CalibrationProfile
from gpufleet.catalog.records import ModelSpec, MoESpec, NodeSpec
from gpufleet.catalog.registry import Catalog, describe_validation_error, read_yaml
from gpufleet.catalog.stacks import (
    DEFAULT_STACK,
    MEMORY_SETTINGS,
    STEP_SETTINGS,
    CudaGraphModule,
    EpRouting,
    Fp8AmaxGroup,
    Fp8Recipe,
    StackChoice,
    StackRecord,
)
from gpufleet.errors import CatalogError, UnknownNameError
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.parallel.layout import Recompute, Sharding
from gpufleet.perf.step import StepOptions
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
    #: gpufleet extensions (docs/runs.md): block recompute of this many layers per pipeline chunk (Megatron-Core's
    #: --recompute-method block --recompute-num-layers; implies recompute "full"), and the layers whose activations
    #: are kept in CPU memory (--cpu-offloading-num-layers); null: what the search fills
    recompute_layers: int | None = Field(default=None, ge=1)
    offload_activation_layers: int | None = Field(default=None, ge=1)

    def layer_counts(self) -> dict[str, int]:
        """The layer counts the run states (recompute_layers, offload_activation_layers), for Layout."""
        counts = {"recompute_layers": self.recompute_layers,
                  "offload_activation_layers": self.offload_activation_layers}
        return {name: count for name, count in counts.items() if count is not None}

    @model_validator(mode="after")
    def _block_recompute_is_full(self) -> RunLayout:
        if self.recompute_layers is not None and self.recompute not in (None, "full"):
            raise ValueError(f"recompute_layers counts block-recomputed layers, so recompute must be full "
                             f"(or null), not {self.recompute}")
        return self


class RunMoESettings(BaseModel):
    """How the run's framework moved its MoE tokens, where the run's own configuration says (docs/runs.md); each
    null field keeps its stack's setting. `source` names the configuration these come from."""

    model_config = _Strict
    #: the expert all-to-all runs while another micro-batch computes (Megatron-Core's
    #: overlap_moe_expert_parallel_comm, DualPipe): StepOptions.ep_comm_overlap
    ep_overlap: bool | None = None
    #: "dedup": a token sent once per destination (Megatron-Core's flex dispatcher with DeepEP or HybridEP);
    #: "all-to-all": once per routed expert (the alltoall dispatcher): StepOptions.ep_dispatch
    ep_dispatch: Literal["all-to-all", "dedup"] | None = None
    #: the gate the run's tokens routed through: "round-robin" for a benchmark gate that gives each token k
    #: consecutive experts (NeMo AutoModel's FakeBalancedGate); "learned" the router (perf/moe_routing.py):
    #: StepOptions.ep_routing
    ep_routing: EpRouting | None = None
    #: slowest expert rank / mean: 1.0 for a benchmark that balances the routing by force (Megatron-Core's
    #: moe_router_force_load_balancing, AutoModel's FakeBalancedGate); null: the judgement for learned routing:
    #: StepOptions.ep_imbalance
    ep_imbalance: float | None = Field(default=None, ge=1)
    #: the layer parts the run captured in CUDA graphs (Megatron-Core's cuda_graph_modules with
    #: cuda_graph_impl transformer_engine): StepOptions.moe_cuda_graph_modules
    cuda_graph_modules: list[CudaGraphModule] | None = None
    source: str = Field(min_length=1)

    @field_validator("cuda_graph_modules")
    @classmethod
    def _preprocess_needs_router(cls, modules: list[CudaGraphModule] | None) -> list[CudaGraphModule] | None:
        if modules and "moe_preprocess" in modules and "moe_router" not in modules:
            raise ValueError("moe_preprocess is captured with moe_router (Megatron-Core requires both); "
                             "list moe_router too")
        return modules


class RunFp8Settings(BaseModel):
    """The FP8 recipe the run's own configuration names (docs/runs.md), over its stack's; `source` names it."""

    model_config = _Strict
    recipe: Fp8Recipe | None = None  # StepOptions.fp8_recipe
    amax_group: Fp8AmaxGroup | None = None  # StepOptions.fp8_amax_group
    source: str = Field(min_length=1)


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
    #: the catalog stack (`stacks:`) whose documented settings the run used; null: the default, megatron-lm
    stack: str | None = None
    #: fused: element-wise ops as fused kernels (Transformer Engine, Apex, torch.compile); eager: eager PyTorch,
    #: one kernel per op (torchtitan without torch.compile); null: fused
    elementwise: Literal["fused", "eager"] | None = None
    #: the run's own MoE dispatch settings, with their source (null: its stack's)
    moe_settings: RunMoESettings | None = None
    #: the run's own FP8 recipe, with its source (null: its stack's)
    fp8_settings: RunFp8Settings | None = None
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


#: The shipped run files the recorded calibration fits (catalog/data/fits.yaml) are fitted on: published_runs.yaml
#: and every `*_fitted.yaml`; `validate` with no `--runs` scores them all. vtrain_runs.yaml is in no fit and needs its
#: own cluster file (docs/validation.md), so it is validated apart.
FITTED_SUFFIX = "_fitted.yaml"


#: Shipped run files held out of every recorded fit: `validate` with no `--runs` scores them on a line of their own.
HOLDOUT_SUFFIX = "_holdout.yaml"


def held_out_run_paths() -> list[Path]:
    """The shipped run files in no fit (`*_holdout.yaml`), which `validate` scores apart as its out-of-sample check."""
    return sorted(shipped_runs_path().parent.glob(f"*{HOLDOUT_SUFFIX}"))


def fitted_run_paths() -> list[Path]:
    """The shipped run files the recorded fits are fitted on: published_runs.yaml, then every `*_fitted.yaml`."""
    folder = shipped_runs_path().parent
    return [shipped_runs_path(), *sorted(folder.glob(f"*{FITTED_SUFFIX}"))]


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
    profile = catalog.records("calibrations").get(gpu.id)  # its measured collectives price the run, as in `plan`
    measured = profile.collectives if isinstance(profile, CalibrationProfile) else ()
    return Cluster(gpu=gpu, node=node, gpus=hardware.num_gpus, fabric=Fabric(network=network),
                   collective_calibration=measured,
                   scale_up_step_latency_s=catalog.judgements().scale_up_step_latency_s)


def check_unique_ids(runs: list[PublishedRun]) -> None:
    """CatalogError when two runs (of several run files) share an id: results are keyed by id."""
    seen: set[str] = set()
    for run in runs:
        if run.id in seen:
            raise CatalogError(f"run id {run.id!r} appears in two run files; ids must be unique")
        seen.add(run.id)


def check_run_stacks(runs: list[PublishedRun], catalog: Catalog, path: Path | None = None) -> None:
    """CatalogError naming the first run whose `stack:` is not a catalog stack, and the known ones."""
    for run in runs:
        if run.stack is None:
            continue
        try:
            catalog.stack_choice(run.stack)
        except UnknownNameError as error:
            where = f"run file {path}: " if path is not None else ""
            raise CatalogError(f"{where}run {run.id}: stack {run.stack!r} is not a catalog stack; "
                               f"known: {', '.join(error.known)}") from None


def run_stack(run: PublishedRun, catalog: Catalog) -> tuple[StackRecord, bool]:
    """The catalog stack the run names, or the documented default (`DEFAULT_STACK`) and True when it names none."""
    if run.stack is None:
        return catalog.stack(DEFAULT_STACK), True
    return catalog.stack(run.stack), False


def run_stack_choice(run: PublishedRun, catalog: Catalog) -> StackChoice | None:
    """How the run's `stack:` resolved (catalog.stacks.resolve_stack); None when it names none."""
    return None if run.stack is None else catalog.stack_choice(run.stack)


def framework_options(stack: StackRecord | None, *, overlap_tp: bool | None = None, dtensor_tp: bool | None = None,
                      overlap_ep: bool | None = None, ep_dispatch: str | None = None,
                      selective_policy: str | None = None, eager: bool = False,
                      overlap_dp: bool | None = None) -> StepOptions:
    """The step and memory settings of `plan`/`memory --stack` (Megatron-LM's defaults without one), then the
    explicit flags given (None: not given) on top; `eager` prices eager PyTorch's element-wise kernels (no stack
    sets it)."""
    options = StepOptions() if stack is None else stack_step_options(stack, StepOptions())
    step: dict[str, Any] = {}
    memory: dict[str, Any] = {}
    if overlap_tp is not None:
        step["tp_comm_overlap"] = overlap_tp
    if dtensor_tp is not None:
        step["tp_async_backward"] = not dtensor_tp
        memory["tp_gathered_inputs"] = dtensor_tp
    if overlap_ep is not None:
        step["ep_comm_overlap"] = overlap_ep
    if overlap_dp is not None:
        step["dp_overlap"] = overlap_dp
    if ep_dispatch is not None:
        step["ep_dispatch"] = ep_dispatch
    if eager:
        step["fused_elementwise"] = False
    if selective_policy is not None:
        memory["selective_policy"] = selective_policy
    return replace(options, **step, memory=replace(options.memory, **memory))


def run_step_options(run: PublishedRun, catalog: Catalog, options: StepOptions | None = None) -> StepOptions:
    """`options` with the settings of the run's stack (`run_stack`), eager element-wise kernels where the run
    file says `elementwise: eager`, and the run's own MoE dispatch settings (`moe_settings`) and FP8 recipe
    (`fp8_settings`) over its stack's."""
    options = stack_step_options(run_stack(run, catalog)[0], options or StepOptions())
    moe, fp8 = run.moe_settings, run.fp8_settings
    own: dict[str, Any] = {
        "fused_elementwise": False if run.elementwise == "eager" else None,
        "ep_comm_overlap": moe.ep_overlap if moe else None, "ep_dispatch": moe.ep_dispatch if moe else None,
        "ep_routing": moe.ep_routing if moe else None,
        "ep_imbalance": moe.ep_imbalance if moe else None,
        "moe_cuda_graph_modules": tuple(moe.cuda_graph_modules) if moe and moe.cuda_graph_modules else None,
        "fp8_recipe": fp8.recipe if fp8 else None, "fp8_amax_group": fp8.amax_group if fp8 else None}
    given = replace(options, **{name: value for name, value in own.items() if value is not None})
    return given.with_judgements(catalog.judgements())


def stack_step_options(stack: StackRecord, options: StepOptions) -> StepOptions:
    """`options` with the step and memory settings `stack` states (the rest kept)."""
    changes: dict[str, Any] = {name: stack.value(name) for name in STEP_SETTINGS if stack.value(name) is not None}
    memory = {name: stack.value(name) for name in MEMORY_SETTINGS if stack.value(name) is not None}
    if memory:
        changes["memory"] = replace(options.memory, **memory)
    return replace(options, **changes)


def run_calibration(run: PublishedRun, catalog: Catalog, gpu_id: str,
                    fitted: Mapping[str, float] | None = None) -> CalibrationProfile:
    """The GPU's calibration (with the recorded fits, or `fitted` values by fit id), with the attention kernel the
    run's stack used (`stack_calibration`)."""
    return stack_calibration(catalog.calibration(gpu_id, fitted),
                             run_stack(run, catalog)[0].value("attention_kernel"))


def stack_calibration(calibration: CalibrationProfile, kernel: AttentionKernel | None) -> CalibrationProfile:
    """`calibration` with a stack's attention kernel; a profile that already names a kernel other than the
    default FA2-class one (materialized, flash-v1, cudnn) is kept."""
    if kernel is not None and calibration.attention_kernel == "flash":
        return calibration.model_copy(update={"attention_kernel": kernel})
    return calibration
