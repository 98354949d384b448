"""Output files a command will write, checked before any work is done (a low module: the planner's requests and
the report's writers both check their paths with it)."""

from __future__ import annotations

from pathlib import Path

from gpufleet.errors import InputError

#: File types --plot writes: matplotlib's common formats, or a dependency-free HTML table.
PLOT_SUFFIXES = (".png", ".svg", ".pdf", ".html")


def check_output_path(path: Path, flag: str, suffixes: tuple[str, ...] = PLOT_SUFFIXES) -> None:
    """Refuse an output file before any work is done: an unsupported type or a folder that does not exist."""
    if path.suffix.lower() not in suffixes:
        allowed = ", ".join(suffixes[:-1]) + f" or {suffixes[-1]}" if len(suffixes) > 1 else suffixes[0]
        raise InputError(f"{flag} {path}: the file must end in {allowed}")
    if not path.parent.is_dir():
        raise InputError(f"{flag} {path}: folder {path.parent} does not exist")
