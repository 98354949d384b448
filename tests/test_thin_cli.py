"""The command modules stay thin: parse -> request object -> one call -> output. No function in cli/ over 60 lines
(every module, helpers included) and no `raise ...Error(` in a command module of its own (rules live with their
owners in the package, where the Python API meets them too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gpufleet.cli

CLI = Path(gpufleet.cli.__file__).parent
THIN = ("memory", "reliability", "cost", "facility", "fabric", "ckpt", "doctor", "bench", "calibrate", "burnin",
        "catalog", "report", "exporter", "validate", "plan", "launch")
MAX_FUNCTION_LINES = 60


def _long_functions(path: Path) -> dict[str, int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    return {f.name: f.end_lineno - f.lineno + 1 for f in functions
            if f.end_lineno is not None and f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES}


@pytest.mark.parametrize("module", THIN)
def test_a_command_module_is_thin(module: str) -> None:
    path = CLI / f"{module}.py"
    long = _long_functions(path)
    assert not long, f"cli/{module}.py: functions over {MAX_FUNCTION_LINES} lines: {long}"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    raises = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
              and isinstance(node.exc.func, ast.Name) and node.exc.func.id.endswith("Error")]
    assert not raises, f"cli/{module}.py raises its own errors at lines {raises}: move the rule to its owner"


def test_no_function_anywhere_in_cli_is_over_the_limit() -> None:
    modules = sorted(CLI.glob("*.py"))
    assert len(modules) > len(THIN)  # the helpers (main, output, common, _*.py) are measured too
    long = {f"cli/{path.name}:{name}": lines for path in modules for name, lines in _long_functions(path).items()}
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_line_count_catches_a_long_function(tmp_path: Path) -> None:
    """The measure itself: a function of 61 lines is reported, one of 60 is not."""
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    (tmp_path / "m.py").write_text(f"def fine():\n{body}\n\ndef long():\n{body}    x = 0\n", encoding="utf-8")
    assert _long_functions(tmp_path / "m.py") == {"long": 61}
