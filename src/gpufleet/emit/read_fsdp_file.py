"""The text of a PyTorch FSDP keyword configuration (the `**kwargs` of `FullyShardedDataParallel(module, …)`): a JSON
object, or a Python file holding one dict literal (`NAME = {…}` or a bare `{…}`), read with `ast.literal_eval` of
that one node. The Python file is never imported or run: any other statement (an import, a call) is refused."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from gpufleet.errors import InputError

#: FSDP1 keyword names that no DeepSpeed, Megatron or torchtitan file uses at its top level, for telling an FSDP
#: dict from the others by content (source: torch 2.13 FullyShardedDataParallel.__init__; tests check each is
#: still a keyword of the installed PyTorch).
FSDP_MARKERS = frozenset({
    "sharding_strategy", "auto_wrap_policy", "mixed_precision", "cpu_offload", "backward_prefetch",
    "forward_prefetch", "limit_all_gathers", "use_orig_params", "sync_module_states", "param_init_fn",
    "ignored_modules", "ignored_states", "device_mesh",
})
#: Top-level keys of a DeepSpeed config (docs: deepspeed.ai/docs/config-json): a JSON object with one of them is
#: DeepSpeed's, whatever else it holds.
DEEPSPEED_MARKERS = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization",
    "optimizer", "scheduler", "fp16", "bf16", "amp",
})
#: What one FSDP config file may hold, for the one-line refusal.
ALLOWED = ("one dict literal, as NAME = {...} or a bare {...}: strings, numbers, True/False/None, lists and dicts, "
           "an enum as ShardingStrategy.FULL_SHARD; gpufleet reads it with ast and never runs it")


def json_object_is_fsdp(data: object) -> bool:
    return isinstance(data, dict) and bool(set(data) & FSDP_MARKERS) and not set(data) & DEEPSPEED_MARKERS


def python_is_fsdp(text: str) -> bool:
    """Python text with a dict literal keyed, or a call given keywords, by FSDP's own keyword names."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and any(isinstance(key, ast.Constant) and key.value in FSDP_MARKERS
                                              for key in node.keys):
            return True
        if isinstance(node, ast.Call) and any(word.arg in FSDP_MARKERS for word in node.keywords):
            return True
    return False


class _DottedNamesAsText(ast.NodeTransformer):
    """`ShardingStrategy.FULL_SHARD`, `torch.bfloat16`: a dotted name becomes its text (a string), not a lookup."""

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        parts: list[str] = []
        inner: ast.expr = node
        while isinstance(inner, ast.Attribute):
            parts.insert(0, inner.attr)
            inner = inner.value
        if not isinstance(inner, ast.Name):
            return node
        return ast.copy_location(ast.Constant(".".join([inner.id, *parts])), node)


def _dict_of(statement: ast.stmt) -> ast.Dict | None:
    """The dict literal of `NAME = {…}`, `NAME: T = {…}` or a bare `{…}`; None for any other statement."""
    value: ast.expr | None = None
    named = isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
        and isinstance(statement.targets[0], ast.Name)
    if named or isinstance(statement, ast.Expr) or (isinstance(statement, ast.AnnAssign)
                                                    and isinstance(statement.target, ast.Name)):
        value = getattr(statement, "value", None)
    return value if isinstance(value, ast.Dict) else None


def _the_dict(path: Path, tree: ast.Module) -> ast.Dict:
    body = list(tree.body)
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # a module docstring
    found = [_dict_of(statement) for statement in body]
    if len(body) == 1 and found[0] is not None:
        return found[0]
    if not body:
        raise InputError(f"{path}: not an FSDP config gpufleet reads (it is empty): expected {ALLOWED}")
    other = next((statement for statement, node in zip(body, found, strict=True) if node is None), body[-1])
    kind = type(other).__name__.lower().replace("importfrom", "import")
    raise InputError(f"{path}: not an FSDP config gpufleet reads (line {other.lineno}: {kind} "
                     f"`{' '.join(ast.unparse(other).split())[:60]}`): expected {ALLOWED}")


def python_dict(path: Path, text: str) -> dict[str, Any]:
    """The one dict literal of a Python file, its dotted enum names as strings; anything else is one line."""
    try:
        tree = ast.parse(text)
    except SyntaxError as error:
        raise InputError(f"{path} is not Python: {error.msg} (line {error.lineno})") from error
    node = _DottedNamesAsText().visit(_the_dict(path, tree))
    for key, value in zip(node.keys, node.values, strict=True):
        for part in (key, value):
            if part is None:
                raise InputError(f"{path}: line {value.lineno}: `**` unpacking: expected {ALLOWED}")
            try:
                ast.literal_eval(part)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as error:
                shown = " ".join(ast.unparse(part).split())[:60]
                raise InputError(f"{path}: line {part.lineno}: `{shown}` is not a literal: expected {ALLOWED}"
                                 ) from error
    data = ast.literal_eval(node)
    if not all(isinstance(key, str) for key in data):
        raise InputError(f"{path}: the dict's keys must be strings (FSDP keyword names)")
    return dict(data)


def load(path: Path, text: str) -> dict[str, Any]:
    """The keyword dict of an FSDP config file: its JSON object, else its Python dict literal."""
    try:
        data = json.loads(text)
    except ValueError:
        return python_dict(path, text)
    if not isinstance(data, dict):
        raise InputError(f"{path} is not a JSON object")
    return data
