"""The base of every request object: the typed record a CLI command builds from its flags and the Python API takes.

A request owns its validation and its defaults, so the API refuses exactly what the CLI refuses, with the same
one-line message: a rule broken inside a validator raises the package's own error (`InputError`, ...), and the
request raises that error itself rather than pydantic's wrapper around it. A value of the wrong type or out of a
declared range is pydantic's ValidationError, which the CLI prints as one line too.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from gpufleet.errors import GpufleetError, InputError

#: The largest GPU count `plan` and `fabric build` accept (judgement: 16x the largest clusters announced by 2026,
#: so that no real plan is refused, while a typo of three extra zeros gets one line instead of a search or a graph
#: of millions of nodes).
MAX_GPUS = 2**20
#: The most GPU counts one sweep (`plan`, `fabric simulate`) takes: each is a full layout search or simulation.
MAX_SWEEP_COUNTS = 64


def check_gpu_count(count: int, flag: str = "--gpus") -> None:
    """Refuse a GPU count above MAX_GPUS with one line."""
    if count > MAX_GPUS:
        raise InputError(f"{flag} {count:,} is more than {MAX_GPUS:,}, the most gpufleet plans for (the largest "
                         "clusters built hold ~10^5 GPUs)")


def own_error(error: ValidationError) -> GpufleetError | None:
    """The GpufleetError a validator raised, if the first problem pydantic collected is one."""
    details = error.errors()
    cause = details[0].get("ctx", {}).get("error") if details else None
    return cause if isinstance(cause, GpufleetError) else None


class Request(BaseModel):
    """Frozen, unknown keys refused; a validator's GpufleetError is raised as itself."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as error:
            cause = own_error(error)
            if cause is None:
                raise
            raise cause from None
