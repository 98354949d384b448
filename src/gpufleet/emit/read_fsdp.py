"""A PyTorch FSDP1 keyword configuration checked against the installed PyTorch itself: the keywords of its
`FullyShardedDataParallel.__init__` (inspect.signature) and their defaults, the members of `ShardingStrategy` and
`BackwardPrefetch`, the fields of `MixedPrecision` and `CPUOffload`, and the dtypes torch has. torch is imported
here only (the runtime extra)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import typing
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from gpufleet.emit.read import ReadConfig
from gpufleet.extras import require_extra

#: ShardingStrategy member -> gpufleet's sharding name (parallel/layout.py SHARDINGS): FULL_SHARD shards weights,
#: gradients and optimizer state (fsdp); SHARD_GRAD_OP keeps weights whole between forward and backward (ZeRO-2's
#: memory); HYBRID_SHARD shards within a group and replicates across (hsdp); NO_SHARD is DDP. _HYBRID_SHARD_ZERO2
#: has no gpufleet equivalent (None).
SHARDING_NAMES = {"FULL_SHARD": "fsdp", "SHARD_GRAD_OP": "zero2", "HYBRID_SHARD": "hsdp", "NO_SHARD": "none"}
#: MixedPrecision.param_dtype -> gpufleet's training precision.
PRECISION_NAMES = {"bfloat16": "bf16", "float16": "fp16"}
#: Keywords whose value is an object built in code (a process group, a policy, modules, a callable, a mesh): a
#: file cannot hold one, so a value other than null is noted, not checked.
CODE_OBJECTS = frozenset({"process_group", "auto_wrap_policy", "ignored_modules", "param_init_fn", "ignored_states",
                          "device_mesh"})


@dataclass(frozen=True)
class FsdpApi:
    """What the installed PyTorch's FSDP takes: keyword -> default (enum defaults by member name)."""

    version: str
    keywords: dict[str, Any]
    sharding_strategies: tuple[str, ...]
    backward_prefetches: tuple[str, ...]
    mixed_precision_fields: dict[str, str]  # field -> "dtype" | "bool"
    cpu_offload_fields: dict[str, str]
    dtypes: frozenset[str]


def _field_kinds(cls: type) -> dict[str, str]:
    import torch

    hints = typing.get_type_hints(cls)
    kinds: dict[str, str] = {}
    for item in dataclasses.fields(cls):
        hint = hints[item.name]
        if item.name.startswith("_"):
            continue
        kinds[item.name] = "dtype" if torch.dtype in (hint, *typing.get_args(hint)) else "bool" if hint is bool \
            else "other"
    return kinds


@functools.lru_cache(maxsize=1)
def fsdp_api() -> FsdpApi:
    """Read from torch; MissingExtraError (the runtime extra) when torch is not installed."""
    torch = require_extra("torch", "checking an FSDP config")
    fsdp = require_extra("torch.distributed.fsdp", "checking an FSDP config")
    parameters = list(inspect.signature(fsdp.FullyShardedDataParallel.__init__).parameters.values())[1:]  # not self
    keywords = {p.name: (p.default.name if isinstance(p.default, Enum) else p.default) for p in parameters}
    dtypes = frozenset(name for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype))
    return FsdpApi(str(torch.__version__).split("+")[0], keywords, tuple(fsdp.ShardingStrategy.__members__),
                   tuple(fsdp.BackwardPrefetch.__members__), _field_kinds(fsdp.MixedPrecision),
                   _field_kinds(fsdp.CPUOffload),
                   dtypes)


def _nearest(name: str, known: list[str]) -> str:
    near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"did you mean {near[0]}?" if near else f"it has {', '.join(known)}"


def _member(value: object, enum: str, members: tuple[str, ...]) -> str | None:
    """The member name `value` spells ("FULL_SHARD", "ShardingStrategy.FULL_SHARD"), None if it names none."""
    if not isinstance(value, str):
        return None
    name = value.removeprefix("torch.distributed.fsdp.").removeprefix(f"{enum}.")
    return name if name in members else None


def _mapping(found: ReadConfig, api: FsdpApi, key: str, value: dict[str, Any], fields: dict[str, str]) -> None:
    """A MixedPrecision / CPUOffload written as a mapping of its fields."""
    for name, item in value.items():
        kind = fields.get(name)
        where = f"{found.path.name}: {key}.{name}"
        if kind is None:
            found.problems.append(f"{where}: not a field of PyTorch {api.version}'s {_class_of(key)} "
                                  f"({_nearest(name, sorted(fields))})")
        elif kind == "dtype" and item is not None and (not isinstance(item, str)
                                                       or item.removeprefix("torch.") not in api.dtypes):
            found.problems.append(f"{where}={item!r}: not a torch dtype (e.g. \"bfloat16\", \"float16\", "
                                  "\"float32\", or null)")
        elif kind == "bool" and not isinstance(item, bool):
            found.problems.append(f"{where}={item!r}: must be true or false")


def _class_of(key: str) -> str:
    return {"mixed_precision": "MixedPrecision", "cpu_offload": "CPUOffload"}[key]


def _object_or_none(found: ReadConfig, api: FsdpApi, key: str, value: object) -> None:
    """mixed_precision / cpu_offload: FSDP keeps `value or MixedPrecision()` (`or CPUOffload()`), so False is the
    default by accident and True survives to fail at its first attribute."""
    cls = _class_of(key)
    fields = api.mixed_precision_fields if key == "mixed_precision" else api.cpu_offload_fields
    first = next(iter(fields))
    name = found.path.name
    if value is False:
        found.notes.append(f"{key}=False works by accident: FSDP keeps `{key} or {cls}()`, and {cls}() is "
                           "the default; write null")
    elif value is True:
        found.problems.append(f"{name}: {key}=True: FullyShardedDataParallel takes a {cls}({first}=…) or None; it "
                              f"keeps `{key} or {cls}()`, so True stays True and fails at the first "
                              f"state.{key}.{first}; write {{\"{first}\": …}} or null")
    elif isinstance(value, dict):
        _mapping(found, api, key, value, fields)
    elif value is not None:
        found.problems.append(f"{name}: {key}={value!r}: must be a mapping of {cls}'s fields "
                              f"({', '.join(fields)}) or null")


#: The keywords that take an enum member, and the enum.
ENUMS = {"sharding_strategy": "ShardingStrategy", "backward_prefetch": "BackwardPrefetch"}


def _members(api: FsdpApi, key: str) -> tuple[str, ...]:
    return api.sharding_strategies if key == "sharding_strategy" else api.backward_prefetches


def _is_default(api: FsdpApi, key: str, value: object) -> bool:
    default = api.keywords[key]
    if value is None:
        return default is None
    if key in ENUMS:
        value = _member(value, ENUMS[key], _members(api, key))
        if value is None:
            return False  # names no member: a problem, not the default
    return type(value) is type(default) and value == default


def _check_value(found: ReadConfig, api: FsdpApi, key: str, value: object) -> None:
    name = found.path.name
    default = api.keywords[key]
    if key in ("mixed_precision", "cpu_offload"):
        _object_or_none(found, api, key, value)
    elif key in ENUMS:
        if value is not None and _member(value, ENUMS[key], _members(api, key)) is None:
            found.problems.append(f"{name}: {key}={value!r}: not a {ENUMS[key]} member of PyTorch {api.version} "
                                  f"({', '.join(_members(api, key))}) or null")
    elif key == "module":
        found.problems.append(f"{name}: module is the model FSDP wraps, given in code, not a configuration key")
        return
    elif isinstance(default, bool) and not isinstance(value, bool):
        found.problems.append(f"{name}: {key}={value!r}: must be true or false (PyTorch's default: {default})")
    elif key in CODE_OBJECTS and value is not None:
        found.notes.append(f"{key}={value!r} not checked: FSDP takes an object built in code there")
    if _is_default(api, key, value):
        found.notes.append(f"{key}={value!r} is already PyTorch's default")


def read(path: Path, data: dict[str, Any]) -> ReadConfig:
    """Each key against FSDP's own keywords and types; sharding and precision as gpufleet names them."""
    found = ReadConfig(path, "fsdp")
    api = fsdp_api()
    known = list(api.keywords)
    for key, value in data.items():
        if key not in api.keywords:
            found.problems.append(f"{path.name}: {key}: not a keyword of PyTorch {api.version}'s "
                                  f"FullyShardedDataParallel ({_nearest(key, known)})")
        else:
            _check_value(found, api, key, value)
    strategy = _member(data.get("sharding_strategy") or "FULL_SHARD", "ShardingStrategy", api.sharding_strategies)
    found.sharding = SHARDING_NAMES.get(strategy or "")
    if strategy is not None and found.sharding is None:
        found.notes.append(f"sharding_strategy {strategy} has no gpufleet equivalent: --model estimates it as "
                           "unsharded")
    precision = data.get("mixed_precision")
    if isinstance(precision, dict) and isinstance(precision.get("param_dtype"), str):
        found.precision = PRECISION_NAMES.get(precision["param_dtype"].removeprefix("torch."))
    return found
