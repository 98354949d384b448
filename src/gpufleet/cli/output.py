"""The one object that owns what the CLI prints: tables or JSON on stdout, one-line errors, exit codes.

Exit codes: 0 success; 1 a check the user asked for failed (verify found bad files, a job does not
fit); 2 the user's input is wrong (unknown name, bad flag value, malformed file); 3 a remote checkpoint store
did not answer within the deadline (`ckpt upload/download`: try again later). Either way the reason is
one line on stderr; a failed check in --json mode still prints a JSON document (with "error") on stdout.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.progress import Progress, ProgressColumn
from rich.text import Text

from gpufleet.errors import shorten

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
#: a remote store (ckpt upload/download, a restore) did not answer within the deadline: "try again later", apart
#: from 1 (a check failed) and 2 (bad input)
EXIT_STORE_UNREACHABLE = 3


def _json_default(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if hasattr(value, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(value)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def _finite(value: Any) -> Any:
    """JSON has no inf/nan: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


#: The styles gpufleet's own text writes as Rich markup ("[red]problem:[/red]"). Every other bracketed word is
#: printed as written: an install hint's `gpufleet[launch-check]`, a file named `run[1].log`, a log line.
OWN_STYLES = ("bold", "red", "green", "yellow", "cyan", "dim")
_FOREIGN_TAG = re.compile(r"(\\*)(\[(?!/?(?:" + "|".join(OWN_STYLES) + r")\])[a-z#/@][^[]*?])")


def literal_brackets(text: str) -> str:
    """`text` with every bracketed word that Rich would read as markup, except gpufleet's own OWN_STYLES tags,
    escaped so that it prints as written (rich.markup.escape's rule, applied to foreign tags only)."""
    return _FOREIGN_TAG.sub(lambda match: f"{match[1]}{match[1]}\\{match[2]}", text)


class OwnMarkupConsole(Console):
    """A Console that reads only gpufleet's own style tags as markup: user text, paths and package names that
    reach a table or a line print with their brackets."""

    def render_str(self, text: str, *, markup: bool | None = None, **kwargs: Any) -> Text:
        if markup if markup is not None else self._markup:
            text = literal_brackets(text)
        return super().render_str(text, markup=markup, **kwargs)


#: Width for tables written to a pipe or a log (rich would wrap them at 80 columns); a terminal or $COLUMNS wins.
PIPE_WIDTH_COLUMNS = 160


def _stdout_console() -> Console:
    """A console for stdout: the terminal's width, $COLUMNS, or PIPE_WIDTH_COLUMNS when piped."""
    piped = not sys.stdout.isatty() and not os.environ.get("COLUMNS", "").isdigit()
    return OwnMarkupConsole(highlight=False, soft_wrap=False, width=PIPE_WIDTH_COLUMNS if piped else None)


@dataclass
class Output:
    """Formatting, `--json` and exit codes for one command invocation."""

    json_mode: bool = False
    console: Console = field(default_factory=_stdout_console)
    err_console: Console = field(default_factory=lambda: OwnMarkupConsole(stderr=True, highlight=False))

    def emit(self, data: dict[str, Any], render: Callable[[Console], None]) -> None:
        """Print `data` as JSON in --json mode, else call `render` to draw it for people."""
        if self.json_mode:
            text = json.dumps(_finite(json.loads(json.dumps(data, default=_json_default))), indent=2)
            sys.stdout.write(text + "\n")
        else:
            render(self.console)

    def progress(self, *columns: str | ProgressColumn) -> Progress:
        """A transient progress display on stderr: never in stdout's tables or JSON, and off when stderr is not a
        terminal (a log file gets no spinner frames) or in --json mode."""
        return Progress(*columns, console=self.err_console, transient=True,
                        disable=self.json_mode or not self.err_console.is_terminal)

    def warn(self, message: str) -> None:
        """A warning on stderr (never mixed into JSON on stdout)."""
        self.err_console.print(f"[yellow]warning:[/yellow] {message}", soft_wrap=True)

    def fail(self, message: str, code: int = EXIT_USAGE) -> NoReturn:
        """One line on stderr, then exit with `code`."""
        fail(message, code)

    def check_failed(self, message: str, data: dict[str, Any] | None = None,
                     render: Callable[[Console], None] | None = None) -> NoReturn:
        """A check the user asked for failed (exit 1): `render` for people (nothing if None), or in --json mode
        `data` plus `error` on stdout, so a script can tell it from a crash; then the reason as one stderr line."""
        self.emit({**(data or {}), "error": one_line(message)}, render or (lambda console: None))
        fail(message, EXIT_CHECK_FAILED)

    def exit(self, code: int) -> NoReturn:
        raise typer.Exit(code)


#: The longest error line printed (judgement: a message naming 30 catalog ids fits; one quoting a huge input does
#: not, and is cut in the middle).
MAX_MESSAGE_CHARS = 2000


def one_line(message: str) -> str:
    """`message` on one line: whitespace collapsed, every word longer than errors.MAX_QUOTED_CHARS (a pasted
    100 KB value) shortened to its two ends and its length, and the whole at most MAX_MESSAGE_CHARS."""
    return shorten(" ".join(shorten(word) for word in str(message).split()), MAX_MESSAGE_CHARS)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print `error: message` as one line on stderr (`one_line`) and exit."""
    sys.stderr.write(f"error: {one_line(message)}\n")
    raise SystemExit(code)


JSON_OPTION_HELP = "Print machine-readable JSON on stdout instead of tables."
