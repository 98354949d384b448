"""A Megatron-LM argument list: the flags parsed the way Megatron's argparse would (`--a-b V` -> args.a_b = V), and
the model-parallel part built into megatron-core's own TransformerConfig, whose checks then run.

Megatron-LM's own parser (megatron/training/arguments.py) is not on PyPI: the megatron-core wheel and sdist ship
only megatron/core. Flags are therefore checked against megatron-core's config dataclasses (the fields Megatron-LM
copies from its args) plus the training flags gpufleet's writer uses; others are reported as notes, not problems.
Degrees, batch and Megatron-LM's start-up rules (megatron_rules) need no megatron-core; its own checks (the megatron
extra) are recorded as skipped where it is not installed.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from pathlib import Path
from typing import Any

from gpufleet.emit.megatron_rules import NOT_FLAGS, file_rules, layout_chunks
from gpufleet.emit.read import ReadConfig, _silenced, one_line, skipped
from gpufleet.extras import MissingExtraError, require_extra

#: Megatron-LM training-loop flags that are no megatron-core config field (source: megatron/training/arguments.py
#: of Megatron-LM core_r0.16.0; the ones gpufleet writes and the data/logging flags every recipe has).
TRAINING_FLAGS = frozenset({
    "micro_batch_size", "global_batch_size", "train_iters", "train_samples", "lr", "min_lr", "lr_decay_style",
    "lr_warmup_iters", "lr_decay_iters", "save", "load", "save_interval", "seq_length", "max_position_embeddings",
    "position_embedding_type", "swiglu", "untie_embeddings_and_output_weights", "disable_bias_linear",
    "group_query_attention", "num_experts", "use_distributed_optimizer", "use_megatron_fsdp",
    "data_parallel_sharding_strategy", "use_torch_fsdp2", "fp8_format", "mock_data", "tokenizer_type",
    "tokenizer_model", "vocab_size", "data_path", "split", "log_interval", "eval_interval", "eval_iters",
    "num_virtual_stages_per_pipeline_rank", "num_layers_per_virtual_pipeline_stage", "cpu_offloading",
    "moe_layer_freq", "seed", "distributed_backend", "distributed_timeout_minutes", "exit_duration_in_mins",
    "use_mcore_models", "transformer_impl", "attention_backend", "use_flash_attn", "weight_decay", "clip_grad",
    "adam_beta1", "adam_beta2", "init_method_std", "attention_dropout", "hidden_dropout", "tensorboard_dir",
    "wandb_project", "ckpt_format", "async_save", "no_save_optim", "no_save_rng", "bf16", "fp16",
    # model flags gpufleet writes that reach the model under another name: --norm-epsilon becomes
    # TransformerConfig.layernorm_epsilon, --rotary-base / --rope-type / --no-rope-fusion go to GPTModel's rotary
    # embedding (core_transformer_config_from_args and model_provider of core_v0.16.1)
    "norm_epsilon", "rotary_base", "rope_type", "no_rope_fusion",
})
#: args name -> TransformerConfig field where Megatron-LM renames (source: core_transformer_config_from_args)
RENAMED = {"swiglu": "gated_linear_unit", "num_experts": "num_moe_experts", "fp8_format": "fp8",
           "num_virtual_stages_per_pipeline_rank": "virtual_pipeline_model_parallel_size"}
#: What megatron-core itself checks here, for the line that says they were skipped.
OWN_CHECKS = ("flag names against its config dataclasses", "its TransformerConfig on the model shape and degrees")


def parse_flags(tokens: list[str]) -> dict[str, Any]:
    """`--a-b=V`, `--a-b V` and bare `--flag` as argparse dests; values stay text. A token that is no flag and
    follows no flag (the program name, `torchrun` options before it) is skipped."""
    args: dict[str, Any] = {}
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if not token.startswith("--"):
            continue
        name, sep, value = token[2:].partition("=")
        dest = name.replace("-", "_")
        if sep:
            args[dest] = value
        elif index < len(tokens) and not tokens[index].startswith("--"):
            args[dest] = tokens[index]
            index += 1
        else:
            args[dest] = True
    return args


def _value(text: Any) -> Any:
    """argparse's type conversion for the ints, floats and booleans the config fields take."""
    if text is True or not isinstance(text, str):
        return text
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


@functools.lru_cache(maxsize=1)
def megatron_core_fields() -> frozenset[str]:
    """Field names of megatron-core's TransformerConfig, OptimizerConfig and DistributedDataParallelConfig;
    MissingExtraError (the megatron extra) when megatron-core is not installed."""
    _silenced(require_extra, "megatron.core", "checking Megatron-LM arguments")
    classes = _silenced(_config_classes)
    return frozenset(f.name for cls in classes for f in dataclasses.fields(cls))


def _config_classes() -> tuple[type, ...]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig
        from megatron.core.transformer.transformer_config import TransformerConfig
    return TransformerConfig, OptimizerConfig, DistributedDataParallelConfig


def transformer_config(args: dict[str, Any]) -> Any:
    """megatron-core's TransformerConfig from the args, as Megatron-LM's core_transformer_config_from_args builds
    it (fields copied by name, its few renames applied); its __post_init__ checks run."""
    transformer_class = _silenced(_config_classes)[0]
    names = {f.name for f in dataclasses.fields(transformer_class)}
    values = {RENAMED.get(key, key): _value(value) for key, value in args.items()}
    kwargs = {key: value for key, value in values.items() if key in names}
    kwargs["add_bias_linear"] = not args.get("disable_bias_linear", False)
    if not args.get("group_query_attention"):
        kwargs.pop("num_query_groups", None)
    import torch  # megatron-core needs it anyway; Megatron-LM passes its params dtype as the pipeline dtype

    dtype = torch.bfloat16 if args.get("bf16") else torch.float16 if args.get("fp16") else torch.float32
    kwargs.update(params_dtype=dtype, pipeline_dtype=dtype)
    return _silenced(transformer_class, **kwargs)


def _stated(found: ReadConfig, args: dict[str, Any]) -> None:
    flags = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size", "cp": "context_parallel_size",
             "ep": "expert_model_parallel_size", "vpp": "num_virtual_stages_per_pipeline_rank"}
    for degree, dest in flags.items():
        if isinstance(_value(args.get(dest)), int):
            found.degrees[degree] = _value(args[dest])
    layout, pp = args.get("pipeline_model_parallel_layout"), found.degrees.get("pp", 1)
    chunks = layout_chunks(layout) if isinstance(layout, str) else None
    if chunks is not None and pp >= 1 and chunks % pp == 0:
        found.degrees["vpp"] = chunks // pp  # the layout sets the virtual stages
    for attr, dest in (("micro_batch", "micro_batch_size"), ("global_batch", "global_batch_size"),
                       ("seq_len", "seq_length")):
        if isinstance(_value(args.get(dest)), int):
            setattr(found, attr, _value(args[dest]))
    found.model_shape = {key: _value(args[key]) for key in ("num_layers", "hidden_size", "num_attention_heads",
                                                           "ffn_hidden_size", "num_query_groups", "num_experts")
                         if isinstance(_value(args.get(key)), int)}
    found.recompute = args.get("recompute_granularity") if isinstance(args.get("recompute_granularity"), str) else None
    found.precision = "fp8" if args.get("fp8_format") else "bf16" if args.get("bf16") else (
        "fp16" if args.get("fp16") else None)
    strategy = {"optim": "zero1", "optim_grads": "zero2", "optim_grads_params": "zero3"}
    if args.get("use_megatron_fsdp") and args.get("data_parallel_sharding_strategy") in strategy:
        found.sharding = strategy[args["data_parallel_sharding_strategy"]]
    elif args.get("use_distributed_optimizer"):
        found.sharding = "zero1"


def read(path: Path, tokens: list[str]) -> ReadConfig:
    found = ReadConfig(path, "megatron")
    args = parse_flags(tokens)
    if not args:
        found.problems.append(f"{path.name}: no --flags found")
        return found
    _stated(found, args)
    found.framework_config = args
    found.startup_problems += file_rules(path.name, args)
    try:
        fields = megatron_core_fields()
    except MissingExtraError as missing:
        found.skipped.append(skipped("megatron", OWN_CHECKS, missing))
        return found
    _own_checks(found, args, fields)
    return found


def _own_checks(found: ReadConfig, args: dict[str, Any], fields: frozenset[str]) -> None:
    """megatron-core's own: flag names against its config fields, and its TransformerConfig's checks."""
    path = found.path
    known = fields | TRAINING_FLAGS | set(NOT_FLAGS)  # the non-flags are problems already (file_rules)
    unknown = sorted(f"--{key.replace('_', '-')}" for key in args if key not in known)
    if unknown:
        found.notes.append(f"flags neither megatron-core config fields nor known training flags (Megatron-LM's own "
                           f"parser is not on PyPI to ask): {', '.join(unknown)}")
    if not {"num_layers", "hidden_size", "num_attention_heads"} <= set(args):
        found.notes.append("no model shape (--num-layers, --hidden-size, --num-attention-heads): megatron-core's "
                           "TransformerConfig checks not run")
        return
    if args.get("fp8_format") and importlib.util.find_spec("transformer_engine") is None:
        found.notes.append("FP8 flags not checked by megatron-core: its FP8 checks need Transformer Engine")
        args = {key: value for key, value in args.items() if not key.startswith("fp8")}
    try:
        transformer_config(args)
    except Exception as error:
        found.problems.append(f"{path.name}: megatron-core's TransformerConfig refuses it: {one_line(error)}")
