"""Catalog defaults for this package, and validated per-call overrides of them."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import ValidationError

from gpufleet.catalog.economics_records import FacilityDefaults, ReliabilityDefaults
from gpufleet.catalog.records import Record
from gpufleet.catalog.registry import Catalog, describe_validation_error
from gpufleet.errors import InputError

DEFAULT_ID = "default"
R = TypeVar("R", bound=Record)


def facility_defaults(catalog: Catalog, **overrides: Any) -> FacilityDefaults:
    return with_overrides(catalog.get("facility_defaults", DEFAULT_ID, FacilityDefaults), **overrides)


def reliability_defaults(catalog: Catalog, **overrides: Any) -> ReliabilityDefaults:
    return with_overrides(catalog.get("reliability_defaults", DEFAULT_ID, ReliabilityDefaults), **overrides)


def with_overrides(record: R, **overrides: Any) -> R:
    """A copy of `record` with some fields replaced, validated like a catalog entry (None = keep)."""
    updates = {key: value for key, value in overrides.items() if value is not None}
    if not updates:
        return record
    try:
        return type(record).model_validate({**record.model_dump(), **updates})
    except ValidationError as error:
        raise InputError(f"bad value for {describe_validation_error(error)}") from error
