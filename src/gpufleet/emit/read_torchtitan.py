"""A torchtitan 0.3 config module loaded by torchtitan's own ConfigManager (`--module M --config F`), and its
degrees checked by torchtitan's own ParallelDims."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path
from typing import Any

from gpufleet.emit.read import ReadConfig, _silenced, one_line, read_text
from gpufleet.extras import require_extra


def config_functions(path: Path) -> list[str]:
    """Names of the module's top-level functions (the candidates for `--config`), `gpufleet_job` first."""
    try:
        tree = ast.parse(read_text(path))
    except SyntaxError as error:
        from gpufleet.errors import InputError

        raise InputError(f"{path} is not a Python module: {error.msg} (line {error.lineno})") from error
    names = [node.name for node in tree.body if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")]
    return sorted(names, key=lambda name: name != "gpufleet_job")


def load_config(path: Path, function: str) -> Any:
    """`ConfigManager().parse_args(["--module", stem, "--config", function])` with the file's folder importable."""
    from torchtitan.config import ConfigManager

    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        sys.modules.pop(path.stem, None)
        importlib.invalidate_caches()
        return _silenced(ConfigManager().parse_args, ["--module", path.stem, "--config", function])
    finally:
        sys.path.remove(folder)


def parallel_dims(config: Any, world_size: int) -> Any:
    """torchtitan's own ParallelDims for the config on `world_size` GPUs (its _validate runs)."""
    from torchtitan.distributed import ParallelDims

    return ParallelDims.from_config(config.parallelism, world_size)


def meta_model(config: Any) -> Any:
    """The model torchtitan's Trainer builds from the config, built as it builds it (torchtitan 0.3.0 trainer.py,
    "build model (using meta init)"): the model spec's config updated from the job config, then built on the meta
    device under the job's dtype, so no weight is allocated."""
    import torch
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.tools import utils

    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype]):
        return model_config.build()


def read(path: Path) -> ReadConfig:
    found = ReadConfig(path, "torchtitan")
    functions = config_functions(path)
    if not functions:
        found.problems.append(f"{path.name}: defines no config function for --config")
        return found
    require_extra("torchtitan", "checking a torchtitan config")
    try:
        config = load_config(path, functions[0])
    except BaseException as error:
        if isinstance(error, KeyboardInterrupt):
            raise
        found.problems.append(f"{path.name}: torchtitan's ConfigManager refuses it: {one_line(error) or type(error)}")
        return found
    found.notes.append(f"loaded by torchtitan's ConfigManager as --module {path.stem} --config {functions[0]}")
    p, t = config.parallelism, config.training
    found.degrees = {"tp": p.tensor_parallel_degree, "pp": p.pipeline_parallel_degree,
                     "cp": p.context_parallel_degree, "ep": p.expert_parallel_degree}
    if p.data_parallel_shard_degree > 0:
        found.degrees["dp"] = p.data_parallel_replicate_degree * p.data_parallel_shard_degree
    found.seq_len, found.global_batch = t.seq_len, (t.global_batch_size if t.global_batch_size > 0 else None)
    found.micro_batch = p.pipeline_parallel_microbatch_size if p.pipeline_parallel_degree > 1 else t.local_batch_size
    found.sharding = "fsdp" if p.data_parallel_shard_degree != 1 else "none"
    checkpointing = type(config.activation_checkpoint).__qualname__
    found.recompute = "full" if "FullAC" in checkpointing else "selective" if "SelectiveAC" in checkpointing else None
    found.precision = "bf16"
    found.framework_config = config
    return found
