"""Readers for existing launch files (`launch --check`): what a DeepSpeed JSON, a Megatron-LM argument list, a
torchtitan config module or an sbatch script says about degrees, batch and GPUs, and the problems the framework's
own parser finds in it (where that parser is installed: the `launch-check` extra)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpufleet import input_files
from gpufleet.errors import InputError

Kind = Literal["deepspeed", "megatron", "torchtitan", "sbatch"]


@dataclass
class ReadConfig:
    """What one file states (None: it does not say) and what is wrong with the file on its own."""

    path: Path
    kind: Kind
    degrees: dict[str, int] = field(default_factory=dict)  # tp, pp, dp, cp, ep, vpp as the file states them
    micro_batch: float | None = None
    global_batch: int | None = None
    gradient_accumulation: int | None = None
    seq_len: int | None = None
    gpus: int | None = None  # GPUs the file itself implies (sbatch: nodes x GPUs per node)
    sharding: str | None = None
    recompute: str | None = None
    precision: str | None = None
    model_shape: dict[str, int] = field(default_factory=dict)  # num_layers, hidden_size … (Megatron)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the framework's own parsed config object, where its parser ran (torchtitan's Trainer.Config)
    framework_config: Any = None


def read_text(path: Path) -> str:
    """A config file's text: a regular UTF-8 file of bounded size (gpufleet.input_files), else one line."""
    return input_files.read_text(path, "config file")


def kind_of(path: Path, text: str) -> Kind:
    """Which format `path` holds: by its content first (JSON object, #SBATCH lines, a torchtitan import, flags)."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return "deepspeed"
    if re.search(r"^#SBATCH\s", text, re.MULTILINE):
        return "sbatch"
    if "torchtitan" in text and re.search(r"^(from|import)\s", text, re.MULTILINE):
        return "torchtitan"
    if re.search(r"(^|\s)--[a-z][a-z0-9-]*", text):
        return "megatron"
    raise InputError(f"{path}: not a ds_config JSON, a Megatron argument list, a torchtitan config module or an "
                     "sbatch script")


def _silenced(call: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a framework's parser with its logging on stdout/stderr kept out of gpufleet's output."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return call(*args, **kwargs)


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:400]


# --- sbatch ---------------------------------------------------------------------------------------------------------

_SBATCH_FLAG = re.compile(r"^#SBATCH\s+(--?[A-Za-z-]+)(?:[=\s]+(\S+))?", re.MULTILINE)


def read_sbatch(path: Path, text: str) -> ReadConfig:
    """Nodes and GPUs per node from the #SBATCH lines (-N/--nodes, --gpus-per-node, --gres=gpu:[type:]N, --gpus)."""
    found = ReadConfig(path, "sbatch")
    values = {flag: value or "" for flag, value in _SBATCH_FLAG.findall(text)}
    nodes_text = values.get("--nodes") or values.get("-N")
    nodes = int(nodes_text.split("-")[0]) if nodes_text and nodes_text.split("-")[0].isdigit() else None
    per_node: int | None = None
    if values.get("--gpus-per-node", "").split(":")[-1].isdigit():
        per_node = int(values["--gpus-per-node"].split(":")[-1])
    elif (gres := re.search(r"gpu(?::[\w-]+)?:(\d+)", values.get("--gres", ""))) is not None:
        per_node = int(gres.group(1))
    if nodes is None:
        found.problems.append(f"{path.name}: no #SBATCH --nodes line")
    if per_node is not None and nodes is not None:
        found.gpus = nodes * per_node
    elif values.get("--gpus", "").split(":")[-1].isdigit():
        found.gpus = int(values["--gpus"].split(":")[-1])
    else:
        found.problems.append(f"{path.name}: no #SBATCH --gpus-per-node, --gres=gpu:N or --gpus line")
    tasks = values.get("--ntasks-per-node", "")
    if per_node and tasks.isdigit() and int(tasks) not in (1, per_node):
        found.problems.append(f"{path.name}: --ntasks-per-node={tasks} is neither 1 (torchrun per node) nor the "
                              f"{per_node} GPUs per node (one task per GPU)")
    return found


def read_file(path: Path) -> ReadConfig:
    """Read one file of any supported kind."""
    from gpufleet.emit import read_deepspeed, read_megatron, read_torchtitan

    text = read_text(path)
    kind = kind_of(path, text)
    if kind == "sbatch":
        return read_sbatch(path, text)
    if kind == "deepspeed":
        try:
            data = json.loads(text)
        except ValueError as error:
            raise InputError(f"{path} is not valid JSON: {error}") from error
        if not isinstance(data, dict):
            raise InputError(f"{path} is not a JSON object")
        return read_deepspeed.read(path, data)
    if kind == "torchtitan":
        return read_torchtitan.read(path)
    return read_megatron.read(path, shlex.split(text.replace("\\\n", " "), comments=True))
