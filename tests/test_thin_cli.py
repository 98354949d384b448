"""The command modules stay thin: parse -> request object -> one call -> output. No function over 60 lines and no
`raise ...Error(` of their own (rules live with their owners in the package, where the Python API meets them too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gpufleet.cli

CLI = Path(gpufleet.cli.__file__).parent
THIN = ("memory", "reliability", "cost", "facility", "fabric", "ckpt", "doctor", "bench", "calibrate", "burnin",
        "catalog", "report", "exporter")
MAX_FUNCTION_LINES = 60


@pytest.mark.parametrize("module", THIN)
def test_a_command_module_is_thin(module: str) -> None:
    tree = ast.parse((CLI / f"{module}.py").read_text(encoding="utf-8"))
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    long = {f.name: f.end_lineno - f.lineno + 1 for f in functions
            if f.end_lineno is not None and f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES}
    assert not long, f"cli/{module}.py: functions over {MAX_FUNCTION_LINES} lines: {long}"
    raises = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
              and isinstance(node.exc.func, ast.Name) and node.exc.func.id.endswith("Error")]
    assert not raises, f"cli/{module}.py raises its own errors at lines {raises}: move the rule to its owner"
