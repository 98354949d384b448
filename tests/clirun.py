"""Run `gpufleet` for a test: in this process by default (hatch's CliRunner habit), or as a real subprocess.

In process, `run_gpufleet` calls the same entry point a user's shell reaches (`gpufleet.cli.main.run`) with stdout
and stderr captured, the environment it was given set for the call, and the exit code taken from the SystemExit
the entry point always ends with: a test sees the same three things a subprocess would give, at a small fraction of
the cost (no interpreter start, no re-import of the planner). `run_gpufleet_process` starts the installed console
script; the smoke tests in tests/test_cli_entry.py use it, and so does anything that needs its own process (a
server that runs until killed, signal handling, import-time measurements).
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import os
import shutil
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

ENV_VAR = "GPUFLEET_CATALOG"
#: The terminal width both runners give a command (tables are not wrapped at 80 columns).
COLUMNS = "160"


def entry_point() -> list[str]:
    """The installed console script next to this interpreter, else `python -m gpufleet.cli.main`."""
    script = Path(sys.executable).parent / "gpufleet"
    if script.exists():
        return [str(script)]
    found = shutil.which("gpufleet")
    return [found] if found else [sys.executable, "-m", "gpufleet.cli.main"]


def _environment(env: dict[str, str] | None) -> dict[str, str]:
    """The user's environment without the catalog variable (unless `env` sets it), a wide terminal, and `env`."""
    environment = {key: value for key, value in os.environ.items() if key != ENV_VAR}
    environment["COLUMNS"] = COLUMNS
    environment.update(env or {})
    return environment


def run_gpufleet_process(*args: str, env: dict[str, str] | None = None, timeout: float = 300
                         ) -> subprocess.CompletedProcess[str]:
    """`gpufleet ARGS` as a real subprocess of the installed entry point."""
    return subprocess.run([*entry_point(), *args], capture_output=True, text=True, env=_environment(env),
                          timeout=timeout, check=False)


@contextlib.contextmanager
def _patched_environment(environment: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(environment)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class _Captured(io.TextIOWrapper):
    """A text stream over bytes, as a pipe's stdout is: not a terminal, `buffer` writable, UTF-8."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)

    def isatty(self) -> bool:
        return False

    def text(self) -> str:
        self.flush()
        raw = self.buffer.getvalue()  # type: ignore[attr-defined]
        return raw.decode("utf-8", errors="replace")


def run_gpufleet(*args: str, env: dict[str, str] | None = None, timeout: float = 300
                 ) -> subprocess.CompletedProcess[str]:
    """`gpufleet ARGS` in this process: stdout, stderr and the exit code as a subprocess would give them.

    `timeout` is accepted for the subprocess runner's signature; the test's own timeout bounds an in-process call."""
    del timeout
    from gpufleet.cli.main import run

    # Its own copy of the context variables, as a process would start with: what the command puts in force (its
    # catalog's judgements, gpufleet.catalog.judgements) ends with it.
    return contextvars.copy_context().run(_run_in_process, run, args, env)


def _run_in_process(run: Callable[[list[str]], None], args: tuple[str, ...], env: dict[str, str] | None
                    ) -> subprocess.CompletedProcess[str]:
    out, err = _Captured(), _Captured()
    code: int = 0
    with _patched_environment(_environment(env)), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            run(list(args))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            if isinstance(exit_.code, str):
                sys.stderr.write(exit_.code + "\n")
        except Exception:  # what the interpreter does with an uncaught error: the traceback on stderr, exit 1
            traceback.print_exc(file=sys.stderr)
            code = 1
    return subprocess.CompletedProcess(["gpufleet", *args], code, out.text(), err.text())


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one stderr line of a refused command: exit code 2, exactly one line, no traceback."""
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {result.stderr!r}"
    assert "Traceback" not in result.stderr
    return lines[0]


#: Run gpufleet's entry point with the modules named in argv[1] (comma-separated top-level names) not importable.
BLOCKED_RUN = """
import importlib.abc, sys
blocked = set(sys.argv[1].split(","))

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
sys.argv = ["gpufleet", *sys.argv[2:]]
from gpufleet.cli.main import run
run()
"""


def run_gpufleet_without(blocked: list[str] | tuple[str, ...], *args: str, cwd: Path,
                         env: dict[str, str] | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """`gpufleet ARGS` in a new process where the top-level modules `blocked` cannot be imported (as in an install
    without the extra that brings them), with the user's catalog and torchrun variables unset."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in {ENV_VAR, "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}}
    environment.update({"COLUMNS": "160", **(env or {})})
    return subprocess.run([sys.executable, "-c", BLOCKED_RUN, ",".join(blocked), *args], capture_output=True,
                          text=True, env=environment, cwd=cwd, timeout=timeout_s, check=False)
