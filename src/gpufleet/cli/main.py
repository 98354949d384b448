"""The `gpufleet` command: discovers one module per command group under `gpufleet.cli`.

Each module defines `register(app: typer.Typer) -> None`; heavy imports (torch, the planner) happen
inside the commands so that `gpufleet --help` stays fast. Every GpufleetError and every usage error
becomes one line on stderr with exit code 2.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

import gpufleet.cli as cli_package
from gpufleet import __version__
from gpufleet.cli.output import EXIT_CHECK_FAILED, EXIT_USAGE, fail
from gpufleet.errors import GpufleetError, InfeasibleError

_NOT_COMMANDS = {"main", "output", "common"}


def build_app() -> typer.Typer:
    """The Typer application with every command module registered."""
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

    for module_info in sorted(pkgutil.iter_modules(cli_package.__path__), key=lambda m: m.name):
        if module_info.name in _NOT_COMMANDS or module_info.name.startswith("_"):
            continue
        module = importlib.import_module(f"gpufleet.cli.{module_info.name}")
        module.register(app)
    return app


def run(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning user mistakes into one line and exit code 2."""
    app = build_app()
    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name="gpufleet", standalone_mode=False)
    except InfeasibleError as error:  # well-formed but impossible: a failed check, not a usage error
        fail(str(error), EXIT_CHECK_FAILED)
    except GpufleetError as error:
        fail(str(error), EXIT_USAGE)
    except typer.Exit as error:
        raise SystemExit(error.exit_code) from None
    except typer.Abort:
        fail("aborted", 130)
    except typer.TyperException as error:  # usage errors from the parser (typer's vendored click)
        ctx = getattr(error, "ctx", None)
        if type(error).__name__ == "NoArgsIsHelpError" and ctx is not None:
            sys.stdout.write(ctx.get_help() + "\n")
            raise SystemExit(EXIT_USAGE) from None
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        fail(error.format_message() + hint, EXIT_USAGE)
    raise SystemExit(result if isinstance(result, int) else 0)


if __name__ == "__main__":
    run()
