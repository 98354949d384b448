"""torchtitan 0.3: the job config of a plan, as a config-registry module that torchtitan's own ConfigManager loads.

torchtitan 0.3 has no TOML job files: a job is a function returning its `Trainer.Config` (the built-in ones live
in `torchtitan/models/*/config_registry.py`), chosen with `--module M --config F`, where M may be any importable
module. gpufleet writes such a module: it starts from torchtitan's own config for the model and sets the plan's
degrees, batch, activation checkpointing, compile and float8 on it. Every name it sets is a field of torchtitan's
config dataclasses (slots: a misspelt one fails at load).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.emit.spec import EmittedFile, LaunchSpec, TargetCannotExpress
from gpufleet.emit.torchtitan_split import TitanSplit, titan_split

MODULE = "gpufleet_torchtitan"
CONFIG_FUNCTION = "gpufleet_job"
FOLDER = "torchtitan"


@dataclass(frozen=True)
class TitanModel:
    """Where torchtitan 0.3.0 defines a model: its package, the config-registry function, the model flavour."""

    package: str
    config: str
    flavor: str
    #: set when `config` itself quantizes the model to float8 (torchtitan 0.3.0's llama3_405b builds a
    #: Float8LinearConverter, which needs torchao, as soon as it is called): a bf16 plan starts from this sibling
    #: function instead and sets `bf16_lines` (what `config` sets that the writer does not) and the model spec
    bf16_config: str | None = None
    bf16_lines: tuple[str, ...] = ()


#: gpufleet model id -> torchtitan 0.3.0's definition (source: torchtitan 0.3.0 torchtitan/models/*/config_registry.py)
TITAN_MODELS: dict[str, TitanModel] = {
    "llama3-8b": TitanModel("llama3", "llama3_8b", "8B"),
    "llama3-70b": TitanModel("llama3", "llama3_70b", "70B"),
    "llama3-405b": TitanModel(
        "llama3", "llama3_405b", "405B", bf16_config="llama3_70b",
        bf16_lines=("config.hf_assets_path = './assets/hf/Llama-3.1-405B'", "config.optimizer = default_adamw(lr=8e-5)",
                    "config.lr_scheduler = LRSchedulersContainer.Config(warmup_steps=600)")),
    "qwen3-30b-a3b": TitanModel("qwen3", "qwen3_30b_a3b", "30B-A3B"),
    "deepseek-v3": TitanModel("deepseek_v3", "deepseek_v3_671b", "671B"),
}


def _refuse_what_it_lacks(spec: LaunchSpec) -> TitanModel:
    layout, model = spec.layout, spec.job.model
    titan = TITAN_MODELS.get(model.id)
    if titan is None:
        raise TargetCannotExpress("torchtitan", f"definition of {model.id} in torchtitan 0.3.0 (it defines "
                                  f"{', '.join(TITAN_MODELS)})", ["megatron"])
    if spec.job.precision == "fp16":
        raise TargetCannotExpress("torchtitan", "fp16 mixed precision (bfloat16 or float32 only)",
                                  ["megatron", "deepspeed"])
    if spec.job.precision == "fp8" and model.moe is not None:
        raise TargetCannotExpress("torchtitan", "float8 routed experts in gpufleet's torchtitan writer", ["megatron"])
    if layout.recompute == "full" and layout.recompute_layers is not None:
        raise TargetCannotExpress("torchtitan", "full recompute of only some layers (its FullAC wraps every block)",
                                  ["megatron"])
    if layout.offload_optimizer:
        raise TargetCannotExpress("torchtitan", "optimizer-only CPU offload (enable_cpu_offload moves parameters "
                                  "and gradients too)", ["megatron", "deepspeed"])
    if layout.offload_activation_layers:
        raise TargetCannotExpress("torchtitan", "activation offload to CPU memory", ["megatron"])
    return titan


def _data_parallel(spec: LaunchSpec) -> tuple[int, int, str]:
    """(replicate, shard, reshard_after_forward) for the plan's sharding; ZeRO-1/2 keep parameters gathered."""
    layout = spec.layout
    if layout.sharding == "none":
        return layout.dp, 1, "default"
    if layout.sharding == "hsdp" and layout.dp % layout.hsdp_group == 0:
        return layout.dp // layout.hsdp_group, layout.hsdp_group, "default"
    return 1, layout.dp, "never" if layout.sharding in ("zero1", "zero2") else "default"


def _parallelism_lines(spec: LaunchSpec) -> list[str]:
    layout = spec.layout
    replicate, shard, reshard = _data_parallel(spec)
    dense_ranks = shard * layout.cp * layout.tp
    if layout.ep > 1 and dense_ranks % layout.ep:
        raise TargetCannotExpress("torchtitan", f"expert parallelism of {layout.ep} over {dense_ranks} sharded ranks "
                                  "(torchtitan takes EP ranks from FSDP x CP x TP)", ["megatron"])
    lines = [f"p.data_parallel_replicate_degree = {replicate}", f"p.data_parallel_shard_degree = {shard}",
             f"p.fsdp_reshard_after_forward = {reshard!r}", f"p.tensor_parallel_degree = {layout.tp}",
             f"p.enable_sequence_parallel = {layout.sequence_parallel and layout.tp > 1}",
             f"p.pipeline_parallel_degree = {layout.pp}", f"p.context_parallel_degree = {layout.cp}",
             f"p.expert_parallel_degree = {layout.ep}"]
    if layout.pp > 1:
        lines += [f"p.pipeline_parallel_schedule = {'Interleaved1F1B' if layout.vpp > 1 else '1F1B'!r}",
                  f"p.pipeline_parallel_microbatch_size = {layout.micro_batch}"]
        lines += _pipeline_split_lines(titan_split(spec.job.model.layers, layout.pp, layout.vpp))
    return lines


def _pipeline_split_lines(split: TitanSplit) -> list[str]:
    """The settings under which torchtitan's own split builds the planned chunks (emit/torchtitan_split.py)."""
    if split.module_fqns is not None:
        chunks = "".join(f"\n    {list(chunk)!r}," for chunk in split.module_fqns)
        return ["# no layers-per-stage setting makes torchtitan split the layers as planned: each chunk by name",
                f"p.module_fqns_per_model_part = [{chunks}\n]"]
    lines = [f"p.pipeline_parallel_first_stage_less_layers = {split.first_stage_less_layers}",
             f"p.pipeline_parallel_last_stage_less_layers = {split.last_stage_less_layers}"]
    if split.layers_per_stage is not None:
        lines.append(f"p.pipeline_parallel_layers_per_stage = {split.layers_per_stage}")
    return lines


def _training_lines(spec: LaunchSpec) -> list[str]:
    layout = spec.layout
    # under pipeline parallelism torchtitan splits the local batch into micro-batches itself (no accumulation)
    local = layout.micro_batch * (spec.gradient_accumulation if layout.pp > 1 else 1)
    compile_model = spec.options.fused_elementwise
    lines = [f"t.local_batch_size = {local}", f"t.global_batch_size = {spec.job.global_batch}",
             f"t.seq_len = {spec.job.seq_len}", f"t.steps = {spec.train_iters}",
             "t.mixed_precision_param = 'bfloat16'",
             f"config.compile.enable = {compile_model}",
             f"config.compile.enable_async_tensor_parallel = {compile_model and spec.options.tp_comm_overlap}",
             "config.activation_checkpoint = " + {"none": "None", "selective": "SelectiveAC.Config()",
                                                  "full": "FullAC.Config()"}[layout.recompute],
             "config.checkpoint.enable = True", f"config.checkpoint.folder = {spec.checkpoint_dir!r}",
             f"config.checkpoint.interval = {spec.checkpoint_interval_steps}"]
    if layout.pp > 1 or layout.ep > 1:
        # torchtitan 0.3.0 Trainer.Config._validate_cuda_graphs refuses CUDA graphs with pipeline parallelism and
        # with an expert-parallel dispatcher that syncs with the host (the default AllToAll one)
        lines.append("t.disable_cuda_graphs = True")
    titan = TITAN_MODELS[spec.job.model.id]
    if spec.job.precision == "fp8":
        lines.append(f"config.model_spec = model_registry({titan.flavor!r}, converters=[Float8LinearConverter.Config("
                     f"model_compile_enabled={compile_model})])")
    elif titan.bf16_config is not None:
        lines += [f"# torchtitan's {titan.config}() without its float8 converter: the plan is bf16",
                  f"config.model_spec = model_registry({titan.flavor!r})", *titan.bf16_lines]
    return lines


def torchtitan_module(spec: LaunchSpec) -> str:
    """The text of the config-registry module."""
    titan = _refuse_what_it_lacks(spec)
    body = [*_parallelism_lines(spec), *_training_lines(spec)]
    base = titan.config if spec.job.precision == "fp8" or titan.bf16_config is None else titan.bf16_config
    imports = [f"from torchtitan.models.{titan.package}.config_registry import {base}",
               "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: F401"]
    if spec.job.precision == "fp8" or base != titan.config:
        imports.append(f"from torchtitan.models.{titan.package} import model_registry")
    if spec.job.precision == "fp8":
        imports.append("from torchtitan.components.quantization import Float8LinearConverter")
    if base != titan.config:
        imports += ["from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw"]
    header = (f'"""torchtitan 0.3 job: {spec.job.model.id} on {spec.cluster.gpus} GPUs, gpufleet plan #{spec.rank} '
              f"({spec.layout.short()}).\n\nLoad: torchrun ... -m torchtitan.train --module {MODULE} --config "
              f'{CONFIG_FUNCTION} (this folder on PYTHONPATH)."""\n')
    lines = [header, *imports, "", "", f"def {CONFIG_FUNCTION}():", f"    config = {base}()",
             "    p = config.parallelism", "    t = config.training", *(f"    {line}" for line in body),
             "    return config", ""]
    return "\n".join(lines)


class TorchtitanEmitter:
    name = "torchtitan"

    def render(self, spec: LaunchSpec) -> list[EmittedFile]:
        return [EmittedFile(f"{FOLDER}/{MODULE}.py", torchtitan_module(spec))]

    def entrypoint(self, spec: LaunchSpec, out_dir: str) -> tuple[str, ...]:
        """torchtitan's trainer as a module; the written config module must be importable (PYTHONPATH holds
        OUT/torchtitan: docs/launch.md)."""
        return ("-m", "torchtitan.train", "--module", MODULE, "--config", CONFIG_FUNCTION)


TORCHTITAN = TorchtitanEmitter()
