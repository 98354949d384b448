"""Readers for existing launch files (`launch --check`): what a DeepSpeed JSON, a Megatron-LM argument list, a
torchtitan config module, a PyTorch FSDP keyword dict or an sbatch script says about degrees, batch and GPUs, and the
problems the framework's own parser (or, for FSDP, PyTorch's own signature) finds in it. Where a framework is not
installed (the `deepspeed`, `megatron` and `torchtitan` extras), its reader still reads what the file states and
records the framework's checks it skipped (`Skipped`), naming the extra that runs them."""

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
from gpufleet.extras import MissingExtraError, extra_of, install_command

Kind = Literal["deepspeed", "megatron", "torchtitan", "fsdp", "sbatch"]


#: A framework's top-level module -> its name in messages.
FRAMEWORK_NAMES = {"deepspeed": "DeepSpeed", "megatron": "megatron-core", "torchtitan": "torchtitan"}


@dataclass(frozen=True)
class Skipped:
    """A framework's own checks that did not run on a file, because the framework (or a module it imports) is not
    installed, and the extra that runs them."""

    framework: str  # the framework's top-level module: deepspeed, megatron, torchtitan
    checks: tuple[str, ...]
    missing: str  # the distribution that is not installed
    extra: str

    @property
    def install(self) -> str:
        return install_command(self.extra)

    def line(self, files: list[str]) -> str:
        """The one line a person reads: what did not run, on which files, why, and what runs it."""
        return (f"{FRAMEWORK_NAMES[self.framework]}'s own checks not run on {', '.join(files)} "
                f"({'; '.join(self.checks)}): {self.missing} is not installed; to run them: {self.install}")

    def as_dict(self, files: list[str]) -> dict[str, Any]:
        return {"framework": self.framework, "files": files, "checks": list(self.checks), "missing": self.missing,
                "extra": self.extra, "install": self.install, "line": self.line(files)}


def skipped(framework: str, checks: tuple[str, ...], error: MissingExtraError) -> Skipped:
    """The framework's `checks`, skipped for `error`'s missing module (the one the failed import names: a package the
    framework imports, where the framework itself is there); the extra named is the framework's own (which installs
    what it imports), not the missing module's (torch: the runtime extra)."""
    cause = error.__cause__
    name = getattr(cause, "name", None) if isinstance(cause, ModuleNotFoundError) else None
    top = name.split(".", 1)[0] if isinstance(name, str) else ""
    missing = top if top and top != framework else error.distribution  # megatron: megatron-core
    return Skipped(framework, checks, missing, extra_of(framework))


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
    #: Slurm: how many consecutive ranks share a node under its --distribution (block: the tasks per node; cyclic:
    #: 1; plane=N: N), None when not known; and the --distribution text as written
    ranks_per_node_block: int | None = None
    distribution: str | None = None
    tasks_per_node: int | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: rules the framework enforces at start-up that the file breaks (the layout it states can still be priced)
    startup_problems: list[str] = field(default_factory=list)
    #: the framework's own parsed config object, where its parser ran (torchtitan's Trainer.Config)
    framework_config: Any = None
    #: the framework's own checks that did not run on the file (it is not installed)
    skipped: list[Skipped] = field(default_factory=list)


def read_text(path: Path) -> str:
    """A config file's text: a regular UTF-8 file of bounded size (gpufleet.input_files), else one line."""
    return input_files.read_text(path, "config file")


#: What `launch --check` reads, for the one line that refuses anything else.
EXPECTED = ("a ds_config JSON object, a Megatron-LM argument list (--tensor-model-parallel-size …), a torchtitan "
            "config module, a PyTorch FSDP keyword dict (JSON, or a Python file of one dict literal) or a Slurm script "
            "(#SBATCH lines or an srun/sbatch command)")
#: Megatron-LM flags (argparse dests) one of which any Megatron argument list has: the parallel degrees, the model
#: shape and batch (megatron/training/arguments.py); read_megatron.TRAINING_FLAGS adds the rest it knows.
MEGATRON_SIGNATURE = frozenset({
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
    "expert_model_parallel_size", "num_layers", "hidden_size", "num_attention_heads", "sequence_parallel",
    "recompute_granularity", "recompute_method", "recompute_num_layers", "ffn_hidden_size", "num_query_groups",
})
_SLURM_COMMAND = re.compile(r"^\s*(?:exec\s+)?(srun|sbatch|salloc)\s", re.MULTILINE)


def _megatron_like(tokens: list[str]) -> bool:
    from gpufleet.emit.read_megatron import TRAINING_FLAGS, parse_flags

    return bool(set(parse_flags(tokens)) & (MEGATRON_SIGNATURE | TRAINING_FLAGS))


def _tokens(text: str) -> list[str]:
    try:
        return shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError:  # an unbalanced quote: not an argument list
        return []


def kind_of(path: Path, text: str) -> Kind:
    """Which format `path` holds, by its content: a JSON object (FSDP's when it has FSDP keywords and no DeepSpeed
    key, else DeepSpeed's), #SBATCH lines, a torchtitan import, a Megatron argument list (flags Megatron has), an
    srun/sbatch command line, Python with a dict of FSDP keywords; anything else is one line naming these."""
    from gpufleet.emit.read_fsdp_file import json_object_is_fsdp, python_is_fsdp

    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            return "fsdp" if json_object_is_fsdp(json.loads(text)) else "deepspeed"
        except ValueError:  # not JSON: a bare Python dict of FSDP keywords, else DeepSpeed's "not valid JSON"
            return "fsdp" if path.suffix != ".json" and python_is_fsdp(text) else "deepspeed"
    if re.search(r"^#SBATCH\s", text, re.MULTILINE):
        return "sbatch"
    if "torchtitan" in text and re.search(r"^(from|import)\s", text, re.MULTILINE):
        return "torchtitan"
    tokens = _tokens(text)
    if re.search(r"(^|\s)--[a-z][a-z0-9-]*", text) and _megatron_like(tokens):
        return "megatron"  # also `srun … pretrain_gpt.py --tensor-model-parallel-size …`: its Megatron flags
    if _SLURM_COMMAND.search(text):
        return "sbatch"
    if python_is_fsdp(text):
        return "fsdp"  # a dict literal (or a call) keyed by FSDP's own keyword names
    raise InputError(f"{path}: not a launch file gpufleet reads: expected {EXPECTED}")


def _silenced(call: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a framework's parser with its logging on stdout/stderr kept out of gpufleet's output."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return call(*args, **kwargs)


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:400]


# --- sbatch ---------------------------------------------------------------------------------------------------------

_SBATCH_FLAG = re.compile(r"^#SBATCH\s+(--?[A-Za-z-]+)(?:[=\s]+(\S+))?", re.MULTILINE)
#: srun/sbatch options that take a value (`--opt V` as well as `--opt=V`; sbatch(1), srun(1) of Slurm 22.05); any
#: other option is read as a switch.
_VALUED = frozenset({
    "--nodes", "-N", "--ntasks", "-n", "--ntasks-per-node", "--gres", "--gpus", "-G", "--gpus-per-node",
    "--gpus-per-task", "--distribution", "-m", "--network", "--partition", "-p", "--time", "-t", "--account", "-A",
    "--job-name", "-J", "--cpus-per-task", "-c", "--mem", "--switches", "--nodelist", "-w", "--exclude", "-x",
    "--output", "-o", "--error", "-e", "--constraint", "-C", "--qos", "-q", "--reservation", "--mpi", "--export",
    "--container-image", "--container-mounts", "--cpu-bind", "--mem-per-gpu", "--chdir", "-D",
})


def _command_options(tokens: list[str]) -> dict[str, str]:
    """The options of one srun/sbatch/salloc command, up to the program it runs."""
    values: dict[str, str] = {}
    index = 1
    while index < len(tokens) and tokens[index].startswith("-"):
        token = tokens[index]
        index += 1
        name, sep, value = token.partition("=")
        if not sep and len(name) > 2 and not name.startswith("--") and name[:2] in _VALUED:  # -N128
            name, value, sep = name[:2], name[2:], "="
        if not sep and name in _VALUED and index < len(tokens):
            value = tokens[index]
            index += 1
        values[name] = value
    return values


def slurm_options(text: str) -> dict[str, str]:
    """Options from the #SBATCH lines, then from each srun/sbatch/salloc command line (a later one wins)."""
    values = {flag: value or "" for flag, value in _SBATCH_FLAG.findall(text)}
    for line in text.replace("\\\n", " ").splitlines():
        if _SLURM_COMMAND.match(line + " "):
            tokens = _tokens(line)
            tokens = tokens[1:] if tokens[:1] == ["exec"] else tokens
            values.update(_command_options(tokens))
    return values


def read_sbatch(path: Path, text: str) -> ReadConfig:
    """Nodes and GPUs per node (-N/--nodes, --gpus-per-node, --gres=gpu:[type:]N, --gpus), tasks per node and the
    task distribution, from #SBATCH lines and srun command lines."""
    found = ReadConfig(path, "sbatch")
    values = slurm_options(text)
    nodes_text = values.get("--nodes") or values.get("-N")
    nodes = int(nodes_text.split("-")[0]) if nodes_text and nodes_text.split("-")[0].isdigit() else None
    per_node: int | None = None
    if values.get("--gpus-per-node", "").split(":")[-1].isdigit():
        per_node = int(values["--gpus-per-node"].split(":")[-1])
    elif (gres := re.search(r"gpu(?::[\w-]+)?:(\d+)", values.get("--gres", ""))) is not None:
        per_node = int(gres.group(1))
    if nodes is None:
        found.problems.append(f"{path.name}: no --nodes (-N) option")
    if per_node is not None and nodes is not None:
        found.gpus = nodes * per_node
    elif (values.get("--gpus") or values.get("-G") or "").split(":")[-1].isdigit():
        found.gpus = int((values.get("--gpus") or values.get("-G") or "").split(":")[-1])
    else:
        found.problems.append(f"{path.name}: no --gpus-per-node, --gres=gpu:N or --gpus option")
    tasks = values.get("--ntasks-per-node", "")
    if per_node and tasks.isdigit() and int(tasks) not in (1, per_node):
        found.problems.append(f"{path.name}: --ntasks-per-node={tasks} is neither 1 (torchrun per node) nor the "
                              f"{per_node} GPUs per node (one task per GPU)")
    found.tasks_per_node = int(tasks) if tasks.isdigit() else None
    _read_distribution(found, values.get("--distribution") or values.get("-m"), found.tasks_per_node)
    if (network := values.get("--network")) is not None:
        found.notes.append(f"--network={network} does nothing here: sbatch(1)/srun(1) support it only when running "
                           "Slurm on a Cray natively (network performance counters); NCCL picks the fabric itself "
                           "(NCCL_IB_HCA, NCCL_SOCKET_IFNAME)")
    return found


def _read_distribution(found: ReadConfig, distribution: str | None, tasks_per_node: int | None) -> None:
    """--distribution's first method (tasks to nodes; sbatch(1)): block keeps consecutive ranks on one node,
    cyclic deals them round-robin over the nodes, plane=N in blocks of N. The default with more tasks than nodes
    is block."""
    found.distribution = distribution
    method = (distribution or "block").split(":")[0].split(",")[0]
    if method in ("block", "*", ""):
        found.ranks_per_node_block = tasks_per_node
        if distribution:
            found.notes.append(f"--distribution={distribution}: tasks in block order over the nodes Slurm allocated "
                               "(what gpufleet's plans assume); it does not choose contiguous nodes — that is "
                               "TopologyPlugin=topology/tree with --switches")
    elif method == "cyclic":
        found.ranks_per_node_block = 1
    elif method.startswith("plane="):
        size = method.removeprefix("plane=")
        found.ranks_per_node_block = int(size) if size.isdigit() else None
    else:
        found.notes.append(f"--distribution={distribution}: task placement not checked (arbitrary: SLURM_HOSTFILE)")


def read_file(path: Path) -> ReadConfig:
    """Read one file of any supported kind."""
    from gpufleet.emit import read_deepspeed, read_fsdp, read_fsdp_file, read_megatron, read_torchtitan

    text = read_text(path)
    kind = kind_of(path, text)
    if kind == "sbatch":
        return read_sbatch(path, text)
    if kind == "fsdp":
        return read_fsdp.read(path, read_fsdp_file.load(path, text))
    if kind == "deepspeed":
        try:
            json.loads(text)
        except ValueError as error:
            raise InputError(f"{path} is not valid JSON: {error}") from error
        data = input_files.parse_json(text, path, "DeepSpeed config")  # its bounds: no key twice, no huge integer
        if not isinstance(data, dict):
            raise InputError(f"{path} is not a JSON object")
        return read_deepspeed.read(path, data)
    if kind == "torchtitan":
        return read_torchtitan.read(path)
    return read_megatron.read(path, _tokens(text))
