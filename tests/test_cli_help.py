"""Every command teaches by example, as the README promises."""

from __future__ import annotations

from typing import Any

import typer

from gpufleet.cli.main import build_app


def _leaves(command: Any, path: str = "gpufleet") -> list[tuple[str, Any]]:
    children = getattr(command, "commands", None)
    if not children:
        return [(path, command)]
    return [leaf for name, child in children.items() for leaf in _leaves(child, f"{path} {name}")]


def test_every_command_help_has_an_example() -> None:
    leaves = _leaves(typer.main.get_command(build_app()))
    assert len(leaves) >= 14  # plan, validate, memory, cost, facility, reliability, fabric x2, ckpt x5, catalog x2
    missing = [path for path, command in leaves if "Example" not in (command.help or "")]
    assert not missing, f"no example in --help: {missing}"
    for path, command in leaves:  # and the example runs the command it documents
        assert path.split(" ", 1)[1] in command.help.replace("`gpufleet ", "`"), path
