"""Every structured error survives pickling (a process pool's worker raises it, the parent shows the same line):
the same type, message and attributes come back."""

from __future__ import annotations

import importlib
import pickle
from typing import Any

import pytest

from gpufleet.errors import GpufleetError

#: the modules that define GpufleetError subclasses (imported so that __subclasses__ sees them)
MODULES = ("gpufleet.errors", "gpufleet.extras", "gpufleet.emit.spec", "gpufleet.runtime.checkpoint.errors",
           "gpufleet.runtime.monitor.plan_target", "gpufleet.runtime.monitor.exporter")

#: constructor arguments of the errors whose __init__ takes more than a message
CUSTOM_ARGUMENTS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "UnknownNameError": (("model", "lama3-8b", ["llama3-8b", "llama3-70b"]), {}),
    "LayoutError": (("tp divides heads", "tp 3 does not divide 32 heads"), {}),
    "MissingExtraError": (("runtime", "torch"), {"purpose": "the burn-in", "alternative": "or plan without it"}),
    "TargetCannotExpress": (("deepspeed", "context parallelism", ["megatron", "torchtitan"]), {}),
    "CorruptCheckpointError": (("/ckpt/step-10", ["model.pt: checksum differs"]), {}),
    "UnloadableValueError": (("optimizer.state.0", "a lambda cannot be loaded weights-only"), {}),
}


def _subclasses(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    return found.union(*(_subclasses(sub) for sub in found)) if found else found


def _all_errors() -> list[type[GpufleetError]]:
    for module in MODULES:
        try:
            importlib.import_module(module)
        except ImportError:  # a runtime module without the runtime extra: its errors are not reachable here
            continue
    return sorted({GpufleetError, *_subclasses(GpufleetError)}, key=lambda cls: cls.__qualname__)


def _made(cls: type[GpufleetError]) -> GpufleetError:
    args, kwargs = CUSTOM_ARGUMENTS.get(cls.__name__, (("a message saying what is wrong",), {}))
    return cls(*args, **kwargs)


def test_every_error_with_its_own_constructor_is_in_the_table() -> None:
    custom = {cls.__name__ for cls in _all_errors() if "__init__" in vars(cls)}
    assert custom <= set(CUSTOM_ARGUMENTS), custom - set(CUSTOM_ARGUMENTS)


@pytest.mark.parametrize("cls", _all_errors(), ids=lambda cls: cls.__name__)
def test_an_error_comes_back_from_pickle_as_it_was(cls: type[GpufleetError]) -> None:
    error = _made(cls)
    error.noted_later = "set after it was raised"  # type: ignore[attr-defined]
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls
    assert str(back) == str(error)
    assert vars(back) == vars(error)
