"""The plan file's `request` section: every field of a PlanRequest as JSON, and the request rebuilt from it (what
`gpufleet report PLAN.json` re-runs), with the header that makes a document a plan file (planfile.py)."""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from gpufleet import __version__
from gpufleet.errors import InputError, describe_validation_error
from gpufleet.planfile import header
from gpufleet.planner.pins import LayoutPins
from gpufleet.planner.plan import PlanRequest


def request_to_dict(request: PlanRequest) -> dict[str, Any]:
    """Every field of the request, nested dataclasses as objects, tuples as lists (JSON-ready); the options with
    the judged values that priced them written out (`StepOptions.stated`), not the catalog's judgements."""
    data = dataclasses.asdict(dataclasses.replace(request, options=request.options.stated()))
    data["options"].pop("judgements")
    data["options"]["memory"].pop("judgements")
    return data


def request_from_dict(data: Any, cls: type[Any] = PlanRequest, where: str = "request") -> Any:
    """The dataclass `cls` rebuilt from `request_to_dict`'s output; unknown or malformed fields: InputError."""
    if not isinstance(data, dict):
        raise InputError(f"{where} must be an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise InputError(f"{where} has unknown field(s) {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for name, value in data.items():
        hint = hints[name]
        if hint is LayoutPins:
            value = LayoutPins.from_saved(value, f"{where}.{name}")
        elif dataclasses.is_dataclass(hint) and isinstance(hint, type):
            value = request_from_dict(value, hint, f"{where}.{name}")
        else:
            value = _typed(tuple(value) if isinstance(value, list) else value, hint, f"{where}.{name}")
        values[name] = value
    try:
        return cls(**values)
    except (TypeError, ValueError) as error:
        raise InputError(f"{where} is malformed: {error}") from error


def saved_header(request: PlanRequest) -> dict[str, Any]:
    """The keys that make a `plan --json` file readable by `gpufleet report`."""
    return header(request_to_dict(request), __version__)


@functools.lru_cache(maxsize=256)
def _adapter(hint: Any) -> TypeAdapter[Any]:
    return TypeAdapter(hint, config=ConfigDict(strict=True, allow_inf_nan=False))


def _typed(value: Any, hint: Any, where: str) -> Any:
    """`value` as the field's type allows it (strict: a bool is not a number, a string not a bool; numbers finite;
    a literal one of its values), else one InputError naming the field."""
    try:
        return _adapter(hint).validate_python(value)
    except ValidationError as error:
        raise InputError(f"{where}: {describe_validation_error(error)}") from None
