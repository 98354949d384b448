"""Validated per-call overrides of a catalog record: a copy with some fields replaced, checked like a catalog entry,
and a field's bounds in words for the one-line error (economics and reliability defaults both use it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import ValidationError

from gpufleet.catalog.records import Record
from gpufleet.errors import InputError, describe_validation_error

R = TypeVar("R", bound=Record)


def with_overrides(record: R, flags: Mapping[str, str] | None = None, **overrides: Any) -> R:
    """A copy of `record` with some fields replaced, validated like a catalog entry (None = keep).

    `flags` names the command-line flag each field came from: a bad value is then reported as
    `--years must be greater than 0, got 0` rather than by the field's name.
    """
    updates = {key: value for key, value in overrides.items() if value is not None}
    if not updates:
        return record
    try:
        return type(record).model_validate({**record.model_dump(), **updates})
    except ValidationError as error:
        field = str(error.errors()[0]["loc"][0]) if error.errors()[0]["loc"] else ""
        if flags and field in flags and field in updates:
            value = updates[field]
            shown = f"{value:g}" if isinstance(value, float) else repr(value)
            raise InputError(f"{flags[field]} must be {allowed_range(type(record), field)}, got {shown}") from error
        raise InputError(f"bad value for {describe_validation_error(error)}") from error


def allowed_range(record_type: type[Record], field: str) -> str:
    """A field's bounds in words: 'in [1, 3]', 'greater than 0', 'at least 0', 'in (0, 1]'."""
    low = high = None
    low_open = high_open = False
    for bound in record_type.model_fields[field].metadata:  # pydantic's Gt/Ge/Lt/Le constraints
        if getattr(bound, "gt", None) is not None:
            low, low_open = bound.gt, True
        elif getattr(bound, "ge", None) is not None:
            low = bound.ge
        if getattr(bound, "lt", None) is not None:
            high, high_open = bound.lt, True
        elif getattr(bound, "le", None) is not None:
            high = bound.le
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{'greater than' if low_open else 'at least'} {low:g}"
    if high is not None:
        return f"{'less than' if high_open else 'at most'} {high:g}"
    return "a valid value"
