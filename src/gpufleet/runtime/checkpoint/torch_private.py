"""Every private torch API gpufleet's checkpoint code uses, in one place (runtime/checkpoint/dcp_io.py imports them
from here), with `check()`: what each is used for, and a loud failure naming the one a torch release changed.

torch does not promise these across releases; they pin the checkpoint code to the torch versions it was tested on
(tests/runtime/test_torch_private.py runs `check()` against the installed torch).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from torch import _weights_only_unpickler as weights_only_unpickler
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

__all__ = ["PRIVATE_APIS", "_EmptyStateDictLoadPlanner", "_load_state_dict", "check", "narrow_tensor_by_index",
           "set_element", "weights_only_unpickler"]

#: (module, name, the parameters gpufleet passes (None: a class or a pickled name), what gpufleet uses it for)
PRIVATE_APIS: tuple[tuple[str, str, tuple[str, ...] | None, str], ...] = (
    ("torch.distributed._shard._utils", "narrow_tensor_by_index", ("tensor", "offsets", "sizes"),
     "dcp_io: the slice of a stored tensor a read item names"),
    ("torch.distributed.checkpoint._traverse", "set_element", ("root_dict", "path", "value"),
     "dcp_io: put a loaded value back at its nested path"),
    ("torch.distributed.checkpoint.default_planner", "_EmptyStateDictLoadPlanner", None,
     "dcp_io: the planner that loads a checkpoint without a template state dict"),
    ("torch.distributed.checkpoint.state_dict_loader", "_load_state_dict",
     ("state_dict", "storage_reader", "planner", "no_dist"), "dcp_io: load without a process group"),
    ("torch", "_weights_only_unpickler", None,
     "streamread: torch.load's weights-only rules, to read a tensor's record without its data"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo", None,
     "dcp_io's metadata unpickler admits it (DCP pickles it into .metadata)"),
    ("torch.distributed.checkpoint.filesystem", "_StoragePrefix", None,
     "dcp_io's metadata unpickler admits it (DCP pickles it into .metadata)"),
)


def _parameters(obj: Callable[..., Any]) -> set[str]:
    return set(inspect.signature(obj).parameters)


def check() -> None:
    """Raise ImportError naming each private torch API that is gone or no longer takes what gpufleet passes."""
    import torch

    broken: list[str] = []
    for module_name, name, parameters, use in PRIVATE_APIS:
        where = f"{module_name}.{name}"
        try:
            obj = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError):
            broken.append(f"{where} is gone ({use})")
            continue
        if parameters is not None:
            missing = sorted(set(parameters) - _parameters(obj))
            if missing:
                broken.append(f"{where} no longer takes {', '.join(missing)} ({use})")
    if broken:
        raise ImportError(f"torch {torch.__version__} changed private APIs gpufleet's checkpoint code uses: "
                          + "; ".join(broken))
