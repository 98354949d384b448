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


def test_help_names_values_as_people_write_them_and_flags_take_none() -> None:
    from clirun import run_gpufleet

    shown = run_gpufleet("plan", "--help").stdout
    rows = {line.split()[1]: line for line in shown.splitlines() if line.startswith("│ --")}
    assert "<" not in shown  # no Python type names (<bool>, <list[Path]>, <int range>)
    assert rows["--json"].split()[2] == "Print"  # a flag: nothing between the name and its help
    assert rows["--seq"].split()[2] == "N" and rows["--html"].split()[2] == "FILE"
    assert rows["--catalog"].split()[2] == "FILE|DIR"


def test_a_group_without_its_command_prints_help_and_names_the_commands() -> None:
    from clirun import one_error_line, run_gpufleet

    done = run_gpufleet("ckpt")
    assert "Usage: gpufleet ckpt" in done.stdout
    line = one_error_line(done)
    assert "missing command: `gpufleet ckpt COMMAND`, one of download, list, prune, upload, verify" in line
