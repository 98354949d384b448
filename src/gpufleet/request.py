"""The base of every request object: the typed record a CLI command builds from its flags and the Python API takes.

A request owns its validation and its defaults, so the API refuses exactly what the CLI refuses, with the same
one-line message: a rule broken inside a validator raises the package's own error (`InputError`, ...), and the
request raises that error itself rather than pydantic's wrapper around it. A value of the wrong type or out of a
declared range is pydantic's ValidationError, which the CLI prints as one line too.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from gpufleet.errors import GpufleetError


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
