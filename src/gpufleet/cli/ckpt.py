"""`gpufleet ckpt list|verify|prune|upload|download`: inspect and move checkpoints, local or in a store.

Exit codes: 0 done; 1 a check failed (a checkpoint does not verify, a step was not copied); 2 the input is wrong;
3 the store did not answer (connection refused or timed out, HTTP 5xx) within the deadline: nothing is wrong with
the checkpoints or the command, try again later. `upload` and `download` retry an unreachable store for
`--deadline` seconds (default DEFAULT_DEADLINE_S) before exiting 3.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.cli.common import JsonOption
from gpufleet.cli.output import EXIT_STORE_UNREACHABLE, Output, fail
from gpufleet.runtime.store_deadline import DEFAULT_DEADLINE_S
from gpufleet.units import format_bytes

if TYPE_CHECKING:
    from gpufleet.runtime.checkpoint.requests import Answer

WhereArgument = typer.Argument(..., help="A checkpoint root: a local folder or a URL (s3://bucket/prefix, file://…).")
Where = Annotated[str, typer.Argument(help="A checkpoint root: a local folder or a URL (s3://bucket/prefix, file://…).")]
StepOption = typer.Option(None, "--step", help="Only this step (default: every checkpoint).")
SET_ASIDE_NOTE = "set aside (not a checkpoint; delete when reviewed)"
LEFTOVER_NOTE = ("no manifest: an upload or a deletion cut off, not a checkpoint (`gpufleet ckpt prune --incomplete` "
                 "removes it)")
DeadlineOption = typer.Option(DEFAULT_DEADLINE_S, "--deadline", metavar="SECONDS",
                              help="Give up on a store that does not answer after this many seconds of retries "
                                   f"(exit {EXIT_STORE_UNREACHABLE}); a transfer that is making progress is never "
                                   "cut off.")
BandwidthOption = typer.Option(None, "--max-mib-per-s",
                               help="Cap the transfer rate (MiB/s, a positive number; omit for no cap).")
KeepLast = Annotated[int, typer.Option("--keep-last", help="Keep this many newest complete checkpoints (≥ 1).")]
KeepEvery = Annotated[int | None, typer.Option("--keep-every", help="Also keep steps that are multiples of this.")]
Incomplete = Annotated[bool, typer.Option("--incomplete", help="Also delete checkpoints without a manifest.")]
Checksums = Annotated[bool, typer.Option(
    "--checksums/--no-checksums", help="Read the newest checkpoints in full before counting them as kept "
    "(default); --no-checksums trusts the manifest and file sizes alone.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print what would be deleted, delete nothing.")]


@contextlib.contextmanager
def _unreachable_exits(deadline_s: float | None = None) -> Iterator[None]:
    """A store that did not answer ends the command with one line and exit EXIT_STORE_UNREACHABLE."""
    from gpufleet.runtime.checkpoint.errors import StoreUnreachableError

    try:
        yield
    except StoreUnreachableError as error:
        within = f" (gave up after --deadline {deadline_s:g} s)" if deadline_s is not None else ""
        fail(f"store unreachable{within}: {error}; nothing is wrong with the checkpoints: try again later",
             EXIT_STORE_UNREACHABLE)


def _size(size_bytes: int | None) -> str:
    """A checkpoint's size for the table, '-' when it is unknown."""
    return "-" if size_bytes is None else format_bytes(size_bytes)


def _finish(json: bool, answer: Answer, render: Callable[[Console], None]) -> None:
    """Print the answer; a failed check exits 1 (nothing drawn for people when there was nothing to check)."""
    out = Output(json)
    if answer.failure is not None:
        out.check_failed(answer.failure, answer.data, None if answer.extra.get("none") else render)
    out.emit(answer.data, render)


def list_(where: str = WhereArgument, json: bool = JsonOption) -> None:
    """List checkpoints: step, complete (manifest intact, every file it names present at its size), size, ranks.

    No checksums are read: `gpufleet ckpt verify` reads every byte. A file named like a checkpoint is listed as
    not complete, with a note that it is not a checkpoint folder. What a save or a restore moved out of a
    checkpoint's way (`step_….set-aside-…`) is listed after the table (JSON `set_aside`), for a person to review.

    Example: `gpufleet ckpt list /checkpoints/run7` (or `s3://bucket/run7`)
    """
    from gpufleet.runtime.checkpoint.requests import ListRequest, list_root

    with _unreachable_exits():
        answer = list_root(ListRequest(where=where))
    _finish(json, answer, lambda console: _render_list(console, answer))


def _render_list(console: Console, answer: Answer) -> None:
    from gpufleet.runtime.checkpoint.verify import NOT_A_FOLDER

    table = Table(title=f"checkpoints in {answer.data['root']}", title_justify="left")
    for column in ("step", "complete", "size", "ranks", "path"):
        table.add_column(column)
    for row in answer.data["checkpoints"]:
        table.add_row(str(row["step"]), "yes" if row["complete"] else "NO", _size(row["size_bytes"]),
                      str(row["world_size"] or "-"), row["path"])
    console.print(table)
    for info in answer.extra["not_folders"]:
        console.print(f"step {info.step}: {info.path} is {NOT_A_FOLDER} (left alone)", soft_wrap=True)
    for path in answer.data["set_aside"]:
        console.print(f"{path}: {SET_ASIDE_NOTE}", soft_wrap=True)


def verify(where: str = WhereArgument, step: int = StepOption, json: bool = JsonOption) -> None:
    """Check every file of every checkpoint against its manifest; exit 1 naming each bad file.

    In an object store, a step prefix without a manifest is a leftover (an upload cut off, or a deletion cut off):
    not a checkpoint, reported as a leftover and not as a failure (`ckpt prune --incomplete` removes it). On a
    local disk a save commits by a rename, so a step folder without a manifest there is damage. A folder with no
    complete checkpoint in it also exits 1, as does a file named like a checkpoint (it is not one); a path that
    does not exist or is a file exits 2.

    Example: `gpufleet ckpt verify /checkpoints/run7 --step 1200`
    """
    from gpufleet.runtime.checkpoint.requests import VerifyRequest, verify_root

    request = VerifyRequest(where=where, step=step)
    with _unreachable_exits():
        answer = verify_root(request)
    _finish(json, answer, lambda console: _render_verify(console, answer))


def _render_verify(console: Console, answer: Answer) -> None:
    results, leftovers = answer.data["checkpoints"], answer.data["leftovers"]
    for result in results:
        mark = "[green]ok[/green]" if result["ok"] else "[red]BAD[/red]"
        console.print(f"{mark}  step {result['step']}  {result['path']}")
        for problem in result["problems"]:
            console.print(f"      {problem}", soft_wrap=True)
    for item in leftovers:
        console.print(f"leftover  step {item['step']}  {item['path']}: {LEFTOVER_NOTE}", soft_wrap=True,
                      markup=False)
    bad = sum(1 for result in results if not result["ok"])
    console.print(f"{len(results) - bad} of {len(results)} checkpoints verify"
                  + (f"; {len(leftovers)} leftover(s), not checkpoints" if leftovers else ""))


def prune(
    where: Where, keep_last: KeepLast, keep_every: KeepEvery = None,
    incomplete: Incomplete = False, checksums: Checksums = True, dry_run: DryRun = False, json: bool = JsonOption,
) -> None:
    """Delete old complete checkpoints, keeping the newest --keep-last that are whole.

    Only complete checkpoints (as `list` shows them) count towards --keep-last, so a damaged newer one
    never costs an older good one. Damaged checkpoints (manifest present, but it or a file is bad) are
    never deleted: they are left in place and reported, for `gpufleet ckpt verify` and a person to judge.
    Checkpoints without a manifest are deleted only with --incomplete. A file named like a checkpoint is not
    one: it is reported and never deleted. A checkpoint that cannot be deleted (a permission refused) is
    reported, the others are still deleted, and the command exits 1.

    Example: `gpufleet ckpt prune /checkpoints/run7 --keep-last 3 --keep-every 1000 --dry-run`
    """
    from gpufleet.runtime.checkpoint.requests import PruneRequest, prune_root

    request = PruneRequest(where=where, keep_last=keep_last, keep_every=keep_every, incomplete=incomplete,
                           checksums=checksums, dry_run=dry_run)
    with _unreachable_exits():
        answer = prune_root(request)
    _finish(json, answer, lambda console: _render_prune(console, answer))


def _render_prune(console: Console, answer: Answer) -> None:
    from gpufleet.runtime.checkpoint.verify import NOT_A_FOLDER

    data, doomed = answer.data, answer.extra["doomed"]
    verb = "would delete" if data["dry_run"] else "deleted"
    for step, path in doomed.items():
        console.print(f"{verb} step {step}  {path}")
    for item in data["damaged"]:
        console.print(f"left damaged step {item['step']}  {item['path']}: {'; '.join(item['problems'])}",
                      soft_wrap=True)
    for item in data["not_folders"]:
        console.print(f"left step {item['step']}  {item['path']}: {NOT_A_FOLDER}, never deleted", soft_wrap=True)
    summary = f"{verb} {len(doomed)} checkpoint(s), kept {len(answer.extra['plan'].keep)} complete"
    if data["damaged"]:
        summary += (f"; left {len(data['damaged'])} damaged checkpoint(s) in place, not counted as kept "
                    f"(see `gpufleet ckpt verify {data['root']}`)")
    console.print(summary, soft_wrap=True)


def _copy(src: str, dst: str, step: int | None, max_mib_per_s: float | None, deadline_s: float, json: bool,
          verb: str) -> None:
    from gpufleet.runtime.checkpoint.requests import CopyRequest, copy_checkpoints

    request = CopyRequest(source=src, destination=dst, step=step, max_mib_per_s=max_mib_per_s, deadline_s=deadline_s)
    with _unreachable_exits(deadline_s):
        answer = copy_checkpoints(request, verb)
    _finish(json, answer, lambda console: _render_copied(console, answer, verb))


def _render_copied(console: Console, answer: Answer, verb: str) -> None:
    copied: list[dict[str, Any]] = answer.data["copied"]
    for item in copied:
        if item["copied"]:
            console.print(f"{verb} step {item['step']} -> {item['to']} ({_size(item['size_bytes'])})")
        else:
            console.print(f"step {item['step']} already at {item['to']} (identical), skipped")
    done = sum(1 for item in copied if item["copied"])
    console.print(f"{verb} {done} checkpoint(s), {len(copied) - done} already there")


def upload(
    root: str = typer.Argument(..., help="Local checkpoint root."),
    url: str = typer.Argument(..., help="Destination, e.g. s3://bucket/run-7."),
    step: int = StepOption,
    max_mib_per_s: float = BandwidthOption,
    deadline: float = DeadlineOption,
    json: bool = JsonOption,
) -> None:
    """Upload verified complete checkpoints; each manifest goes last.

    A step the destination already holds is skipped when identical (every byte checked), repaired when it is
    this checkpoint with files missing or damaged (or a copy of it cut off earlier), and otherwise refused and
    left untouched (a different checkpoint or an unreadable one, a folder holding anything this checkpoint does
    not, a file): nothing else is ever overwritten. A damaged or refused step does not stop the others; the
    command then exits 1 naming it. Source and destination must be separate places, neither inside the other.
    A store that does not answer is retried for --deadline seconds, then the command exits 3.

    Example: `gpufleet ckpt upload /checkpoints/run7 s3://bucket/run7 --max-mib-per-s 500`
    """
    _copy(root, url, step, max_mib_per_s, deadline, json, "uploaded")


def download(
    url: str = typer.Argument(..., help="Source, e.g. s3://bucket/run-7."),
    root: str = typer.Argument(..., help="Local checkpoint root."),
    step: int = StepOption,
    max_mib_per_s: float = BandwidthOption,
    deadline: float = DeadlineOption,
    json: bool = JsonOption,
) -> None:
    """Download complete checkpoints, verified first, into a hidden folder renamed into place when whole.

    A step the destination already holds is skipped when identical (every byte checked), repaired when it is
    this checkpoint with files missing or damaged (or a copy of it cut off earlier), and otherwise refused and
    left untouched (a different checkpoint or an unreadable one, a folder holding anything this checkpoint does
    not, a file); an interrupted download leaves the destination as it was. A damaged or refused step does not
    stop the others; the command then exits 1. Source and destination must be separate places, neither inside
    the other. A store that does not answer is retried for --deadline seconds, then the command exits 3.

    Example: `gpufleet ckpt download s3://bucket/run7 /checkpoints/run7 --step 1200`
    """
    _copy(url, root, step, max_mib_per_s, deadline, json, "downloaded")


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="List, verify, prune, upload and download crash-safe checkpoints.",
                        no_args_is_help=True)
    app.add_typer(group, name="ckpt")
    for name, command in (("list", list_), ("verify", verify), ("prune", prune), ("upload", upload),
                          ("download", download)):
        group.command(name)(command)
