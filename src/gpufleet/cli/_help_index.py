"""The root help's list of commands, kept on disk (gpufleet.disk_cache) so that `gpufleet --help` imports no
command module.

The root help shows each command's name and the first paragraph of its help. Building that list means importing
every command module, and with them the planner, the fabric model and numpy: most of the CPU `gpufleet --help`
would cost. The list is saved the first time the root help is shown and reused while every Python file of the
installed gpufleet package (and typer's version) is unchanged; the help printed from it is the same text
(tests/test_cli_speed.py compares the two).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

import gpufleet
from gpufleet import disk_cache

ENTRY_NAME = "help-index"


@dataclass(frozen=True)
class CommandSummary:
    """What the root help shows of one command or command group."""

    name: str
    help: str | None
    short_help: str | None
    hidden: bool
    deprecated: bool
    rich_help_panel: str | None


def _key() -> str:
    files = sorted(Path(gpufleet.__file__).parent.rglob("*.py"))
    return disk_cache.content_key(files, typer.__version__, ENTRY_NAME)


def _entry() -> Path:
    return disk_cache.entry_path(ENTRY_NAME, str(Path(gpufleet.__file__).parent))


def load() -> list[CommandSummary] | None:
    """The saved list, when it was saved for the package as it is now."""
    try:
        key = _key()
    except OSError:
        return None
    found = disk_cache.load(_entry(), key)
    if isinstance(found, list) and all(isinstance(item, CommandSummary) for item in found):
        return found
    return None


def store(root: Any) -> None:
    """Save the commands of the fully registered root command (a click group)."""
    summaries = [CommandSummary(name, sub.help, sub.short_help, sub.hidden, bool(sub.deprecated),
                                getattr(sub, "rich_help_panel", None))
                 for name, sub in root.commands.items()]
    try:
        key = _key()
    except OSError:
        return
    disk_cache.store(_entry(), key, summaries)


def register(app: typer.Typer, summaries: list[CommandSummary]) -> None:
    """Stand-in commands that the root help lists as it lists the real ones (they are never run: any command
    line that names a command registers the real module)."""
    for summary in summaries:
        app.command(summary.name, help=summary.help, short_help=summary.short_help, hidden=summary.hidden,
                    deprecated=summary.deprecated, rich_help_panel=summary.rich_help_panel)(_never_run)


def _never_run() -> None:  # pragma: no cover — only the root help is shown from stand-ins
    raise RuntimeError("a stand-in command from the help index was run")
