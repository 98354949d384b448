"""The catalog's reliability defaults, with validated per-call overrides (catalog/overrides.py), and the one
definition of a checkpoint's size per parameter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.catalog.economics_records import DEFAULT_ID, ReliabilityDefaults
from gpufleet.catalog.overrides import with_overrides
from gpufleet.catalog.registry import Catalog


def reliability_defaults(catalog: Catalog, flags: Mapping[str, str] | None = None,
                         **overrides: Any) -> ReliabilityDefaults:
    return with_overrides(catalog.get("reliability_defaults", DEFAULT_ID, ReliabilityDefaults), flags, **overrides)


def checkpoint_bytes_per_param(catalog: Catalog) -> float:
    """Bytes a checkpoint holds per parameter: the catalog's one definition (reliability_defaults: the weights'
    bytes + the optimizer's), which `plan`, its figures and `reliability` all use."""
    defaults = reliability_defaults(catalog)
    return defaults.weight_bytes_per_param + defaults.optimizer_bytes_per_param
