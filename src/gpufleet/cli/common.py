"""Options and helpers shared by command modules (one definition, reused)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from gpufleet.catalog.registry import DEFAULT_GPU, Catalog, load_catalog
from gpufleet.request import MAX_GPUS as MAX_GPUS
from gpufleet.request import MAX_SWEEP_COUNTS as MAX_SWEEP_COUNTS
from gpufleet.request import check_gpu_count as check_gpu_count

CatalogOption = typer.Option(
    None,
    "--catalog",
    help="Extra catalog YAML file or folder (repeatable); also read from $GPUFLEET_CATALOG. "
    "Entries with an existing id override the built-in ones.",
)
JsonOption = typer.Option(False, "--json", help="Print machine-readable JSON instead of tables.")
CalibrationOption = typer.Option(
    None, "--calibration",
    help="A calibration profile (`gpufleet calibrate` writes one): its GPU entries override the built-in ones.",
)
def open_catalog(paths: list[Path] | None) -> Catalog:
    """The built-in catalog plus the user's files (--catalog, $GPUFLEET_CATALOG), all of it checked now: a
    broken override fails every command the same way, whichever kinds the command reads."""
    catalog = load_catalog(list(paths or []))
    if catalog.user_paths:
        for note in catalog.check():
            sys.stderr.write(f"warning: {note}\n")
    return catalog


def with_calibration(paths: list[Path] | None, calibration: Path | None) -> list[Path]:
    """The --catalog files plus a --calibration profile, checked to be one (only `calibrations:` entries)."""
    if calibration is None:
        return list(paths or [])
    from gpufleet.catalog.calibration_file import read_calibration_file

    read_calibration_file(calibration)
    return [*(paths or []), calibration]


def gpu_for(cat: Catalog, node: str | None, gpu: str | None) -> str:
    """--gpu if given, else the GPU that --node holds, else DEFAULT_GPU."""
    return gpu or (cat.node(node).gpu if node else DEFAULT_GPU)
