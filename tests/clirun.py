"""Run the real `gpufleet` entry point in a subprocess, as a user would (shared by the CLI tests)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ENV_VAR = "GPUFLEET_CATALOG"


def entry_point() -> list[str]:
    """The installed console script next to this interpreter, else `python -m gpufleet.cli.main`."""
    script = Path(sys.executable).parent / "gpufleet"
    if script.exists():
        return [str(script)]
    found = shutil.which("gpufleet")
    return [found] if found else [sys.executable, "-m", "gpufleet.cli.main"]


def run_gpufleet(*args: str, env: dict[str, str] | None = None, timeout: float = 300
                 ) -> subprocess.CompletedProcess[str]:
    """`gpufleet ARGS` with the user's catalog variable cleared (unless `env` sets it) and a wide terminal."""
    environment = {key: value for key, value in os.environ.items() if key != ENV_VAR}
    environment["COLUMNS"] = "160"
    environment.update(env or {})
    return subprocess.run([*entry_point(), *args], capture_output=True, text=True, env=environment,
                          timeout=timeout, check=False)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one stderr line of a refused command: exit code 2, exactly one line, no traceback."""
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {result.stderr!r}"
    assert "Traceback" not in result.stderr
    return lines[0]
