"""What a checkpoint may hold: exactly what loading accepts, checked when it is saved.

Loading never runs pickled code: every non-tensor value is read back with `torch.load(weights_only=True)`.
That loader refuses anything it does not know, so a value it refuses would make a checkpoint that saves,
verifies, and can never be loaded. `check_loadable` therefore runs at `save()` time, in the caller's thread, and
names the first such value's key and what to store instead.

NumPy arrays and scalars (numeric, string, structured, datetime dtypes; RNG states such as
`np.random.get_state()`) are admitted by `numpy_allowed`, which lets the weights-only loader rebuild exactly
these: `ndarray`, `dtype` (and its per-type classes) and NumPy's own array and scalar reconstructors. None of
them calls anything else, an object array's items go through the same restricted loader, so a hostile file
still runs no code. They round-trip exactly: same type, dtype, shape and bytes. Python's `random.getstate()`
is plain tuples and integers and needs nothing.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpufleet.runtime.checkpoint.errors import UnloadableValueError

PLAIN = (type(None), bool, int, float, complex, str, bytes)
_NUMERIC_KINDS = "biufc"  # bool, signed, unsigned, float, complex: never need the trial load
_lock = threading.Lock()
_users = 0
_saved: list[Any] = []


def numpy_globals() -> list[Any]:
    """What the weights-only loader needs to rebuild NumPy arrays and scalars (see the module docstring).

    Each reconstructor is also admitted under its NumPy 1.x name (`numpy.core…`), so a checkpoint written with
    either NumPy loads with the other.
    """
    import numpy as np
    import numpy.dtypes

    multiarray = np._core.multiarray  # type: ignore[attr-defined]
    dtype_classes = [getattr(numpy.dtypes, name) for name in dir(numpy.dtypes) if name.endswith("DType")]
    return [np.ndarray, np.dtype, *dtype_classes,
            multiarray._reconstruct, (multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),
            multiarray.scalar, (multiarray.scalar, "numpy.core.multiarray.scalar")]


@contextmanager
def numpy_allowed() -> Iterator[None]:
    """While inside, the weights-only loader also rebuilds NumPy arrays and scalars.

    torch keeps its admitted globals process-wide, so the first thread in adds NumPy's and the last one out puts
    back exactly what was there before (the caller's own `add_safe_globals` survive); loads running in several
    threads at once share one admission.
    """
    import torch.serialization

    global _users, _saved
    with _lock:
        if _users == 0:
            _saved = list(torch.serialization.get_safe_globals())
            torch.serialization.add_safe_globals(numpy_globals())
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                torch.serialization.clear_safe_globals()
                torch.serialization.add_safe_globals(_saved)


def check_loadable(state_dict: dict[str, Any]) -> None:
    """Raise UnloadableValueError naming the first value of `state_dict` that loading would refuse.

    Tensors, plain Python values and containers of them, and numeric NumPy arrays pass without any work; any other
    value is saved into memory and loaded back with the very loader a checkpoint load uses (NumPy admitted), so
    the check agrees with loading by construction, the caller's own `torch.serialization.add_safe_globals`
    included. Keys are spelled as DCP spells them (`optim.state.lr`), list items as `[i]`.
    """
    for key, value in _leaves(state_dict, ""):
        problem = _refusal(value)
        if problem is not None:
            raise UnloadableValueError(key, f"checkpoint value {key!r} is {_kind(value)}, which loading would refuse "
                                            f"({problem}); {_instead(value)}")


def _leaves(value: Any, key: str) -> Iterator[tuple[str, Any]]:
    """Every value that is not a dict, list or tuple, with its key; tensors are skipped (always loadable)."""
    import torch

    if isinstance(value, (torch.Tensor, *PLAIN)):
        return
    if isinstance(value, dict):
        for name, item in value.items():
            yield from _leaves(item, f"{key}.{name}" if key else str(name))
    elif type(value) in (list, tuple):
        for index, item in enumerate(value):
            yield from _leaves(item, f"{key}[{index}]")
    else:
        yield key, value


def _refusal(value: Any) -> str | None:
    """Why the weights-only loader refuses `value` (one phrase), or None when it loads it back."""
    import numpy as np
    import torch

    if isinstance(value, np.ndarray | np.generic) and value.dtype.kind in _NUMERIC_KINDS:
        return None
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
    except Exception as error:  # a lock, a lambda, an open file: cannot even be saved
        return f"it cannot be pickled: {type(error).__name__}: {str(error)[:120]}"
    buffer.seek(0)
    try:
        with numpy_allowed():
            torch.load(buffer, weights_only=True, map_location="cpu")
    except Exception as error:
        return _first_line_of(error)
    return None


def _first_line_of(error: BaseException) -> str:
    """The weights-only loader's reason, without its advice to turn weights-only off (never the right fix here)."""
    text = str(error)
    for line in text.splitlines():
        if "Unsupported global" in line or "Unsupported operand" in line:
            return line.strip().removeprefix("WeightsUnpickler error: ")[:200]
    return f"{type(error).__name__}"


def _kind(value: Any) -> str:
    kind = type(value)
    article = "an" if kind.__name__[:1].lower() in "aeiou" else "a"
    return f"{article} {kind.__module__}.{kind.__qualname__}"


def _instead(value: Any) -> str:
    """What to store instead, for the common cases."""
    import argparse
    import datetime
    import os

    if isinstance(value, argparse.Namespace):
        return "store vars(args) (a dict) instead"
    if isinstance(value, datetime.date | datetime.time | datetime.timedelta):
        return "store value.isoformat() (or a timestamp in seconds) instead"
    if isinstance(value, os.PathLike):
        return "store str(path) instead"
    return ("store it as tensors, numbers, strings, or dicts/lists/tuples of them (or NumPy arrays), "
            "or admit its class with torch.serialization.add_safe_globals if you trust it")
