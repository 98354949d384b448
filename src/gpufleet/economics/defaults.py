"""The catalog's facility defaults for this package, with validated per-call overrides (catalog/overrides.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.catalog.economics_records import DEFAULT_ID, FacilityDefaults
from gpufleet.catalog.overrides import with_overrides
from gpufleet.catalog.registry import Catalog


def facility_defaults(catalog: Catalog, flags: Mapping[str, str] | None = None, **overrides: Any) -> FacilityDefaults:
    return with_overrides(catalog.get("facility_defaults", DEFAULT_ID, FacilityDefaults), flags, **overrides)
