"""What each framework stack can express, as the Markdown table docs/launch.md quotes (a test keeps them equal)."""

from __future__ import annotations

from gpufleet.catalog.registry import Catalog
from gpufleet.catalog.stacks import StackRecord

#: Column -> the StackSettings field it shows.
COLUMNS = {"target": "launch_target", "SP": "sequence_parallel", "CP": "context_parallel", "EP": "expert_parallel",
           "vpp": "vpps", "shardings": "shardings", "with pp": "pp_shardings", "act. offload": "activation_offload",
           "block recompute": "partial_recompute", "precisions": "precisions"}


def _cell(stack: StackRecord, name: str) -> str:
    value = stack.value(name)
    if value is None:
        return "·"  # not stated: the search's default (every kind it tries)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, tuple | list):
        return ", ".join(str(item) for item in value)
    return str(value)


def capability_table(catalog: Catalog) -> str:
    """One row per stack that `gpufleet launch` can write files for, one column per capability."""
    rows = [stack for stack in catalog.records("stacks").values()
            if isinstance(stack, StackRecord) and stack.value("launch_target") is not None]
    header = "| stack | " + " | ".join(COLUMNS) + " |"
    rule = "|---" * (len(COLUMNS) + 1) + "|"
    lines = [f"| {stack.id} | " + " | ".join(_cell(stack, field) for field in COLUMNS.values()) + " |"
             for stack in rows]
    return "\n".join([header, rule, *lines])
