"""Launch targets by name: `--target` spellings mapped to the modules that define them, imported on demand.

A target module defines one module-level object with `name` (the target's name) and `render(spec)`. Targets whose
module is not installed (they land separately) are left out of `all` and refused by name with the list of those
that exist.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import cast

from gpufleet.emit.spec import Emitter
from gpufleet.errors import InputError

#: target name -> module that defines its emitter (in the order `all` writes them)
TARGET_MODULES: dict[str, str] = {
    "megatron": "gpufleet.emit.megatron",
    "torchtitan": "gpufleet.emit.torchtitan",
    "deepspeed": "gpufleet.emit.deepspeed",
    "slurm": "gpufleet.emit.slurm",
    "k8s": "gpufleet.emit.k8s",
    "nccl": "gpufleet.emit.nccl_env",
}
#: the training frameworks (alternative ways to run the same job; `all` writes each one's file)
FRAMEWORKS = ("megatron", "torchtitan", "deepspeed")


def available_targets() -> list[str]:
    """Every target whose module is present."""
    return [name for name, module in TARGET_MODULES.items() if importlib.util.find_spec(module) is not None]


def emitter(name: str) -> Emitter:
    """The emitter of target `name`; an unknown or absent target is one line naming those that exist."""
    known = available_targets()
    if name not in known:
        raise InputError(f"unknown --target {name!r}: one of {', '.join(known)} or all")
    module = importlib.import_module(TARGET_MODULES[name])
    found = [value for value in vars(module).values()
             if not isinstance(value, type) and callable(getattr(value, "render", None)) and hasattr(value, "name")]
    named = [value for value in found if value.name == name]
    if named or len(found) == 1:  # the one emitter of the module, whatever it calls itself
        return cast(Emitter, (named or found)[0])
    raise InputError(f"--target {name}: module {TARGET_MODULES[name]} defines no emitter named {name!r}")


def resolve_targets(names: list[str]) -> list[str]:
    """The targets `--target` names, in registry order without repeats; `all` is every present target."""
    if not names:
        raise InputError(f"give --target: one or more of {', '.join(available_targets())}, or all")
    wanted: list[str] = []
    for name in names:
        for one in (available_targets() if name == "all" else [name]):
            emitter(one)  # refuses an unknown name now, before anything is written
            if one not in wanted:
                wanted.append(one)
    return [name for name in TARGET_MODULES if name in wanted]
