"""Options and helpers shared by command modules (one definition, reused)."""

from __future__ import annotations

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


def open_catalog(paths: list[Path] | None) -> Catalog:
    """The built-in catalog plus the user's files."""
    return load_catalog(list(paths or []))
