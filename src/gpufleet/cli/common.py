"""Options and helpers shared by command modules (one definition, reused)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from gpufleet.catalog.registry import Catalog, load_catalog

CatalogOption = typer.Option(
    None,
    "--catalog",
    help="Extra catalog YAML file or folder (repeatable); also read from $GPUFLEET_CATALOG. "
    "Entries with an existing id override the built-in ones.",
)
JsonOption = typer.Option(False, "--json", help="Print machine-readable JSON instead of tables.")
#: The GPU a command assumes when neither --gpu nor --node names one.
DEFAULT_GPU = "h100-sxm"


def open_catalog(paths: list[Path] | None) -> Catalog:
    """The built-in catalog plus the user's files (--catalog, $GPUFLEET_CATALOG), all of it checked now: a
    broken override fails every command the same way, whichever kinds the command reads."""
    catalog = load_catalog(list(paths or []))
    if catalog.user_paths:
        for note in catalog.check():
            sys.stderr.write(f"warning: {note}\n")
    return catalog


def gpu_for(cat: Catalog, node: str | None, gpu: str | None) -> str:
    """--gpu if given, else the GPU that --node holds, else DEFAULT_GPU."""
    return gpu or (cat.node(node).gpu if node else DEFAULT_GPU)
