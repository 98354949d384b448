"""The `gpufleet` command: discovers one module per command group under `gpufleet.cli`.

Each module defines `register(app: typer.Typer) -> None`; heavy imports (torch, the planner) happen
inside the commands so that `gpufleet --help` stays fast. Every GpufleetError and every usage error
becomes one line on stderr with exit code 2.
"""

from __future__ import annotations

import errno
import functools
import importlib
import math
import pkgutil
import sys
from collections.abc import Callable
from typing import Any

import typer
from pydantic import ValidationError

import gpufleet.cli as cli_package
from gpufleet import __version__
from gpufleet.cli import _help_index as help_index
from gpufleet.cli.output import EXIT_USAGE, Output, fail
from gpufleet.errors import (
    MAX_QUOTED_CHARS,
    GpufleetError,
    InfeasibleError,
    InputError,
    describe_validation_error,
    shorten,
)
from gpufleet.extras import missing_extra

_NOT_COMMANDS = {"main", "output", "common"}


def _command_modules() -> list[str]:
    """The command modules' names, in order (one module per command group)."""
    return sorted(m.name for m in pkgutil.iter_modules(cli_package.__path__)
                  if m.name not in _NOT_COMMANDS and not m.name.startswith("_"))


def _invoked_module(args: list[str]) -> str | None:
    """The command module a command line needs, when it can be told without importing any: every module registers
    the command it is named after, and the root takes only flags (--help, --version), so the first word that is not
    a flag names it. None (register every module) for the root's help, a misspelt command, or a command that a
    module of another name registers."""
    first = next((arg for arg in args if not arg.startswith("-")), None)
    return first if first in _command_modules() else None


def build_app(only: str | None = None, summaries: list[help_index.CommandSummary] | None = None) -> typer.Typer:
    """The Typer application with every command module registered, or only the module `only` (a command line
    imports just the module it runs, so that `gpufleet catalog show` does not pay for the planner's imports), or,
    for the root help, stand-ins from the saved help index (cli/_help_index.py)."""
    app = typer.Typer(
        name="gpufleet",
        help=(
            "Plan, build and run GPU clusters for large-model training.\n\n"
            "Start with `gpufleet plan --model llama3-8b --tokens 1T --gpu h100-sxm --gpus 64`, "
            "see what the catalog knows with `gpufleet catalog list`, and check the model against "
            "published runs with `gpufleet validate`."
        ),
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode="markdown",
    )

    @app.callback(invoke_without_command=True)
    def _root(
        version: bool = typer.Option(False, "--version", help="Print the version and exit."),
    ) -> None:
        if version:
            typer.echo(f"gpufleet {__version__}")
            raise typer.Exit(0)

    if summaries is not None:
        help_index.register(app, summaries)
        return app
    for name in [only] if only is not None else _command_modules():
        importlib.import_module(f"gpufleet.cli.{name}").register(app)
    return app


def _flag_name(command: Any, name: str) -> str:
    """The long flag a parameter is spelled with on the command line (`--rack-kw` for `rack_kw`)."""
    for param in getattr(command, "params", []):
        if param.name == name and param.param_type_name == "argument":
            return str(param.name).upper()  # as --help shows it: WHERE, ROOT
        if param.name == name:
            longs = [opt for opt in param.opts if opt.startswith("--")]
            return longs[0] if longs else param.opts[0]
    return name


def _reject_meaningless_values(command: Any, path: str = "gpufleet") -> None:
    """Every number option of every command must be finite (`nan` and `inf` parse as floats but mean nothing as a
    budget, a size or a rate), and no text option or argument may be empty (`--gpu ""` would otherwise quietly
    mean the default): both are refused before any command body runs."""
    for name, sub in getattr(command, "commands", {}).items():
        _reject_meaningless_values(sub, f"{path} {name}")
    callback: Callable[..., Any] | None = getattr(command, "callback", None)
    if callback is None:
        return

    @functools.wraps(callback)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for name, value in kwargs.items():
            values = value if isinstance(value, list | tuple) else [value]
            for item in values:
                if isinstance(item, float) and not math.isfinite(item):
                    raise InputError(f"{_flag_name(command, name)} must be a finite number, got {item}")
                if isinstance(item, str) and not item.strip():
                    raise InputError(f"{_flag_name(command, name)} must not be empty (see `{path} --help` "
                                     "for what it takes)")
        return callback(*args, **kwargs)

    command.callback = checked


#: What --help shows after an option that takes a value, by the type typer would print ('' for plain flags).
_METAVARS = {"<bool>": "", "<int>": "N", "<int range>": "N", "<float>": "NUMBER", "<str>": "TEXT", "<path>": "FILE",
             "<list[Path]>": "FILE|DIR", "<list[str]>": "TEXT"}


def _plain_metavars(command: Any) -> None:
    """Help that names values the way people write them (N, FILE, nothing after a flag) instead of Python types
    (<bool>, <list[Path]>); a repeatable option says so in its help text."""
    for sub in getattr(command, "commands", {}).values():
        _plain_metavars(sub)
    context = typer._click.Context(command)
    help_option = command.get_help_option(context)
    for param in [*command.params, *([help_option] if help_option is not None else [])]:
        if param.param_type_name == "option" and param.metavar is None:
            shown = param.display_type_rich(context)
            param.metavar = _METAVARS.get(shown, shown)


#: The parser's (pydantic's) wording for a value of the wrong type, and what a user reads instead.
_PLAIN_PARSE_ERRORS = {
    "Input should be a valid integer, unable to parse string as an integer": "not a whole number",
    "Input should be a valid number, unable to parse string as a number": "not a number",
}


def _reject_empty_option_values(args: list[str]) -> None:
    """`--catalog ""` or `--runs=` would reach the command as Path('.') (the current folder), which cannot be told
    from a real '.' afterwards: an empty value after an option is refused on the command line itself."""
    for previous, token in zip(["", *args], args, strict=False):
        if token.startswith("--") and token.endswith("=") and len(token) > 3:
            fail(f"{token[:-1]} must not be empty", EXIT_USAGE)
        if not token.strip() and previous.startswith("-") and "=" not in previous:
            fail(f"{previous} must not be empty", EXIT_USAGE)


def _quoting_shortened(message: str, args: list[str]) -> str:
    """`message` with every long command-line argument it quotes (as typed or as Python quotes it, spaces and all)
    shortened to its two ends and its length: a pasted 100 KB value is not echoed back whole."""
    values = [arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg for arg in args]
    for value in sorted((value for value in values if len(value) > MAX_QUOTED_CHARS), key=len, reverse=True):
        for quoted in (repr(value)[1:-1], value, value.strip()):
            message = message.replace(quoted, shorten(value))
    return message


def _command_path(command: Any, args: list[str]) -> str:
    """'gpufleet bench gemm': the command the arguments name, subcommand by subcommand."""
    path = ["gpufleet"]
    for arg in args:
        sub = getattr(command, "commands", {}).get(arg)
        if arg.startswith("-") or sub is None:
            continue
        path.append(arg)
        command = sub
    return " ".join(path)


#: The file-system errors that say a name the user gave is unusable (too long, a link loop): input, not a crash.
_NAME_ERRORS = (errno.ENAMETOOLONG, errno.ELOOP)
#: Python's words when it refuses to read an integer of more than sys.get_int_max_str_digits() digits.
_INT_DIGITS_LIMIT = "for integer string conversion"


def _bad_name_message(error: OSError) -> str:
    """One line for a name the file system refuses, the name shortened to its two ends and its length."""
    name = shorten(str(error.filename)) if error.filename is not None else "a path given"
    if error.errno == errno.ELOOP:
        return f"the path {name} is a symbolic link loop (a link that leads back to itself): point it elsewhere"
    longest = max((len(part.encode(errors="surrogateescape")) for part in str(error.filename or "").split("/")),
                  default=0)
    return (f"the path {name} is too long for the file system: a name has at most 255 bytes (this one has "
            f"{longest:,}) and a path at most 4,096")


def run(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning user mistakes into one line and exit code 2."""
    args = sys.argv[1:] if argv is None else argv
    _reject_empty_option_values(args)
    root_help = args in ([], ["--help"])
    summaries = help_index.load() if root_help else None
    only = _invoked_module(args)
    app = build_app(only, summaries) if only is not None or summaries is not None else build_app()
    command = typer.main.get_command(app)
    if root_help and summaries is None:
        help_index.store(command)
    _reject_meaningless_values(command)
    _plain_metavars(command)
    try:
        result = command.main(args=argv, prog_name="gpufleet", standalone_mode=False)
    except InfeasibleError as error:  # well-formed but impossible: a failed check, not a usage error
        Output(json_mode="--json" in args).check_failed(_quoting_shortened(str(error), args))
    except GpufleetError as error:
        fail(_quoting_shortened(str(error), args), EXIT_USAGE)
    except ValidationError as error:  # a record built from the user's values broke its own rules: the same one line
        fail(_quoting_shortened(f"invalid {error.title}: {describe_validation_error(error)}", args), EXIT_USAGE)
    except ImportError as error:  # a lazily imported module of an optional extra: name the extra, one line
        missing = missing_extra(error, f"`{_command_path(command, args)}`")
        if missing is None:
            raise
        fail(str(missing), EXIT_USAGE)
    except RecursionError:  # the input readers bound nesting; anything that still recurses this deep is input
        fail("the input is nested too deeply to read", EXIT_USAGE)
    except typer.Exit as error:
        raise SystemExit(error.exit_code) from None
    except typer.Abort:
        fail("aborted", 130)
    except OSError as error:
        if error.errno not in _NAME_ERRORS:
            raise
        fail(_quoting_shortened(_bad_name_message(error), args), EXIT_USAGE)
    except ValueError as error:
        if _INT_DIGITS_LIMIT not in str(error):
            raise
        fail(f"a number given has more than {sys.get_int_max_str_digits():,} digits; no count or size needs that "
             "many", EXIT_USAGE)
    except MemoryError:  # the up-front size checks should make this rare: still one line, never a traceback
        fail("ran out of memory: the request is too large for this machine; ask for fewer GPUs or a smaller size",
             EXIT_USAGE)
    except typer.TyperException as error:  # usage errors from the parser (typer's vendored click)
        ctx = getattr(error, "ctx", None)
        if type(error).__name__ == "NoArgsIsHelpError" and ctx is not None:
            sys.stdout.write(ctx.get_help() + "\n")
            commands = sorted(getattr(ctx.command, "commands", {}))
            fail(f"missing command: `{ctx.command_path} COMMAND`, one of {', '.join(commands)}", EXIT_USAGE)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        message = error.format_message()
        for library_words, plain in _PLAIN_PARSE_ERRORS.items():
            message = message.replace(library_words, plain)
        fail(_quoting_shortened(message, args) + hint, EXIT_USAGE)
    raise SystemExit(result if isinstance(result, int) else 0)


if __name__ == "__main__":
    run()
