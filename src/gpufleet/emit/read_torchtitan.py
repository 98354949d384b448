"""A torchtitan 0.3 config module loaded by torchtitan's own ConfigManager (`--module M --config F`), and its
degrees checked by torchtitan's own ParallelDims. Where torchtitan (the torchtitan extra) is not installed, the module
is read, never run: the literal values its config function assigns (`p.tensor_parallel_degree = 8`, with `p =
config.parallelism`) give what it states, and torchtitan's own checks are recorded as skipped."""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpufleet.emit.read import ReadConfig, _silenced, one_line, read_text, skipped
from gpufleet.extras import MissingExtraError, require_extra

#: What torchtitan itself checks here, for the line that says they were skipped.
OWN_CHECKS = ("loading the module with its ConfigManager", "its ParallelDims on the degrees and the GPU count")


def _module(path: Path) -> ast.Module:
    try:
        return ast.parse(read_text(path))
    except SyntaxError as error:
        from gpufleet.errors import InputError

        raise InputError(f"{path} is not a Python module: {error.msg} (line {error.lineno})") from error


def _functions(tree: ast.Module) -> list[ast.FunctionDef]:
    """The module's public top-level functions (the candidates for `--config`), `gpufleet_job` first."""
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")]
    return sorted(found, key=lambda node: node.name != "gpufleet_job")


def config_functions(path: Path) -> list[str]:
    """Names of the module's top-level functions (the candidates for `--config`), `gpufleet_job` first."""
    return [node.name for node in _functions(_module(path))]


@contextlib.contextmanager
def _importable(path: Path) -> Iterator[None]:
    """The file's folder first on sys.path, and the module imported afresh from it."""
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        sys.modules.pop(path.stem, None)
        importlib.invalidate_caches()
        yield
    finally:
        sys.path.remove(folder)


def load_config(path: Path, function: str) -> Any:
    """`ConfigManager().parse_args(["--module", stem, "--config", function])` with the file's folder importable."""
    from torchtitan.config import ConfigManager

    with _importable(path):
        return _silenced(ConfigManager().parse_args, ["--module", path.stem, "--config", function])


def import_error(path: Path) -> Exception | None:
    """Why the module itself does not import (ConfigManager's own ImportError says only that it cannot import the
    module), or None when it imports."""
    with _importable(path):
        try:
            _silenced(importlib.import_module, path.stem)
        except Exception as error:
            return error
        finally:
            sys.modules.pop(path.stem, None)
    return None


def not_installed(error: Exception | None) -> str | None:
    """The package a ModuleNotFoundError names when no such package is installed at all (torchtitan's own imports
    incomplete: triton, datasets …), else None (a module the file names wrongly is a problem in the file)."""
    name = getattr(error, "name", None) if isinstance(error, ModuleNotFoundError) else None
    if not isinstance(name, str) or not name:
        return None
    top = name.split(".", 1)[0]
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):  # a finder that refuses the name outright
        found = None
    return top if found is None else None


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


def _dotted(node: ast.expr, aliases: dict[str, tuple[str, ...]]) -> tuple[str, ...] | None:
    """`p.tensor_parallel_degree` as its path from the config variable ("config", "parallelism",
    "tensor_parallel_degree"), through the names bound to the config or a section of it; None for anything else."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return None if base is None else (*base, node.attr)
    return None


#: A value the reader cannot know without running the module.
_UNKNOWN = object()


def _literal(node: ast.expr) -> Any:
    """A literal value; for a call of a class's attribute (`FullAC.Config()`) the class's name; else _UNKNOWN."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
        return node.func.value.id
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return _UNKNOWN


def _targets(node: ast.AST) -> list[ast.expr]:
    """Everything any assignment within `node` assigns to."""
    found: list[ast.expr] = []
    for inner in ast.walk(node):
        if isinstance(inner, ast.Assign):
            found += inner.targets
        elif isinstance(inner, ast.AugAssign | ast.AnnAssign):
            found.append(inner.target)
    return found


def assigned_values(function: ast.FunctionDef) -> dict[tuple[str, ...], Any]:
    """Config path (("parallelism", "tensor_parallel_degree")) -> the literal the function's top-level statements
    last assign it, on the config it returns (`config = llama3_8b()` … `return config`; `p = config.parallelism`
    names a section). A path also assigned in a branch, a loop or an augmented assignment, or from an expression,
    is not known (left out)."""
    aliases: dict[str, tuple[str, ...]] = {}
    values: dict[tuple[str, ...], Any] = {}
    unsure: set[tuple[str, ...]] = set()
    returned = next((node.value.id for node in reversed(function.body)
                     if isinstance(node, ast.Return) and isinstance(node.value, ast.Name)), None)
    for statement in function.body:
        if not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
            unsure |= {where for target in _targets(statement) if (where := _dotted(target, aliases))}
            continue
        target, value = statement.targets[0], statement.value
        if isinstance(target, ast.Name):
            bound = (target.id,) if isinstance(value, ast.Call) else _dotted(value, aliases)
            if bound is None:
                aliases.pop(target.id, None)
            else:
                aliases[target.id] = bound
        elif (where := _dotted(target, aliases)) is not None:
            values[where] = _literal(value)
    return {where[1:]: value for where, value in values.items()
            if where[0] == returned and value is not _UNKNOWN and where not in unsure}


def _ints(values: dict[tuple[str, ...], Any], section: str) -> dict[str, int]:
    return {where[1]: value for where, value in values.items()
            if len(where) == 2 and where[0] == section and type(value) is int}


def read_statically(found: ReadConfig, function: ast.FunctionDef) -> None:
    """What the config function states in literals, as `read` takes it from the loaded config; what its base
    config (`llama3_8b()` …) sets and it does not assign is not known here."""
    values = assigned_values(function)
    p, t = _ints(values, "parallelism"), _ints(values, "training")
    found.degrees = {degree: p[name] for degree, name in (
        ("tp", "tensor_parallel_degree"), ("pp", "pipeline_parallel_degree"), ("cp", "context_parallel_degree"),
        ("ep", "expert_parallel_degree")) if name in p}
    shard, replicate = p.get("data_parallel_shard_degree"), p.get("data_parallel_replicate_degree")
    if shard is not None and shard > 0 and replicate is not None:
        found.degrees["dp"] = replicate * shard
    found.seq_len = t.get("seq_len")
    found.global_batch = t["global_batch_size"] if t.get("global_batch_size", 0) > 0 else None
    found.micro_batch = (p.get("pipeline_parallel_microbatch_size") if found.degrees.get("pp", 1) > 1
                         else t.get("local_batch_size"))
    found.sharding = None if shard is None else "fsdp" if shard != 1 else "none"
    checkpointing = str(values.get(("activation_checkpoint",)))
    found.recompute = {"FullAC": "full", "SelectiveAC": "selective"}.get(checkpointing)  # as `read` maps the class
    found.precision = "bf16"
    found.notes.append(f"read, not run, as --config {function.name}: the values it assigns as literals; what its "
                       "base config sets and it does not assign is not known until torchtitan runs it")


def read(path: Path) -> ReadConfig:
    found = ReadConfig(path, "torchtitan")
    functions = _functions(_module(path))
    if not functions:
        found.problems.append(f"{path.name}: defines no config function for --config")
        return found
    try:
        require_extra("torchtitan", "checking a torchtitan config")
        require_extra("datasets", "checking a torchtitan config")  # its config registries import it
    except MissingExtraError as missing:
        return _unloaded(found, functions[0], missing)
    return _loaded(found, path, functions[0])


def _unloaded(found: ReadConfig, function: ast.FunctionDef, missing: MissingExtraError) -> ReadConfig:
    """torchtitan cannot run here: the module read statically, torchtitan's own checks skipped."""
    read_statically(found, function)
    found.skipped.append(skipped("torchtitan", OWN_CHECKS, missing))
    return found


def _loaded(found: ReadConfig, path: Path, function_node: ast.FunctionDef) -> ReadConfig:
    """The module loaded by torchtitan's ConfigManager, and what the config states."""
    function = function_node.name
    try:
        config = load_config(path, function)
    except BaseException as error:
        if isinstance(error, KeyboardInterrupt):
            raise
        cause = import_error(path) if isinstance(error, ImportError) else None
        if (package := not_installed(cause)) is not None:
            return _unloaded(found, function_node, MissingExtraError("torchtitan", package))
        found.problems.append(f"{path.name}: torchtitan's ConfigManager cannot import it: {one_line(cause)}" if cause
                              else f"{path.name}: torchtitan's ConfigManager refuses it: "
                              f"{one_line(error) or type(error)}")
        return found
    found.notes.append(f"loaded by torchtitan's ConfigManager as --module {path.stem} --config {function}")
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
