"""`gpufleet ckpt list|verify|prune|upload|download`: inspect and move checkpoints, local or in a store.

Exit codes: 0 done; 1 a check failed (a checkpoint does not verify, a step was not copied); 2 the input is wrong;
3 the store did not answer (connection refused or timed out, HTTP 5xx) within the deadline: nothing is wrong with
the checkpoints or the command, try again later. `upload` and `download` retry an unreachable store for
`--deadline` seconds (default DEFAULT_DEADLINE_S) before exiting 3.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.cli.common import JsonOption
from gpufleet.cli.output import EXIT_STORE_UNREACHABLE, Output, fail
from gpufleet.errors import InputError
from gpufleet.units import format_bytes

if TYPE_CHECKING:
    from gpufleet.runtime.checkpoint.store import CheckpointInfo

WhereArgument = typer.Argument(..., help="A checkpoint root: a local folder or a URL (s3://bucket/prefix, file://…).")
StepOption = typer.Option(None, "--step", help="Only this step (default: every checkpoint).")
URL_FORMS = "a folder, or a URL such as s3://bucket/prefix"
SET_ASIDE_NOTE = "set aside (not a checkpoint; delete when reviewed)"
LEFTOVER_NOTE = ("no manifest: an upload or a deletion cut off, not a checkpoint (`gpufleet ckpt prune --incomplete` "
                 "removes it)")
DEFAULT_DEADLINE_S = 30.0
"""Judgement call: long enough to ride out a connection reset or a store's brief 5xx burst, short enough that a
script learns of an outage in well under a minute."""
DeadlineOption = typer.Option(DEFAULT_DEADLINE_S, "--deadline", metavar="SECONDS",
                              help="Give up on a store that does not answer after this many seconds of retries "
                                   f"(exit {EXIT_STORE_UNREACHABLE}); a transfer that is making progress is never "
                                   "cut off.")


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


def _open_url(where: str, deadline_s: float | None = None) -> tuple[Any, str]:
    """The file system and path of a root the user typed; refuses an empty path, a URL with no bucket and an
    in-memory store (it would vanish with this process). With `deadline_s`, one request to an S3 store never
    outlasts it (`store.bounded_storage_options`)."""
    from gpufleet.runtime.checkpoint.store import bounded_storage_options, is_local, open_url

    if not where.strip():
        raise InputError(f"a checkpoint root is required ({URL_FORMS}), got an empty path")
    fs, root = open_url(where, bounded_storage_options(where, deadline_s) if deadline_s else None)
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if "memory" in protocols:
        raise InputError(f"{where} is an in-memory store, which vanishes when this command exits: give {URL_FORMS}")
    if not root:
        if is_local(fs):
            raise InputError(f"a checkpoint root is required ({URL_FORMS}), got {where!r}")
        scheme = where.split("://", 1)[0]
        raise InputError(f"{where} names no bucket: a bucket is required, as in {scheme}://BUCKET or "
                         f"{scheme}://BUCKET/PREFIX")
    return fs, root


def _open(where: str, deadline_s: float | None = None) -> tuple[Any, str]:
    """An existing folder of checkpoints (or store prefix)."""
    from gpufleet.runtime.checkpoint.errors import CheckpointError

    fs, root = _open_url(where, deadline_s)
    if not fs.exists(root):
        raise CheckpointError(f"{where} does not exist")
    if not fs.isdir(root):
        raise CheckpointError(f"{where} is a file, not a folder of checkpoints ({URL_FORMS})")
    return fs, root


def _destination(where: str, deadline_s: float | None = None) -> tuple[Any, str]:
    """A root to copy into: an existing folder, or one that can be created (on a local disk, created here)."""
    from gpufleet.runtime.checkpoint.errors import CheckpointError
    from gpufleet.runtime.checkpoint.store import is_local

    fs, root = _open_url(where, deadline_s)
    if fs.exists(root) and not fs.isdir(root):
        raise CheckpointError(f"{where} is a file; the destination must be a folder (it is created if missing)")
    if is_local(fs):
        try:
            fs.makedirs(root, exist_ok=True)
        except OSError as error:
            raise CheckpointError(f"cannot create the destination folder {where}: {error.strerror or error}") from error
    return fs, root


def _overlap(src_fs: Any, src_root: str, dst_fs: Any, dst_root: str) -> str | None:
    """How two roots overlap, or None: the same place, or one folder inside the other on this disk (links resolved;
    file:// URLs are local), or the same store URL."""
    import os

    from gpufleet.runtime.checkpoint.store import is_local

    if is_local(src_fs) != is_local(dst_fs):
        return None
    if is_local(src_fs):
        src_real, dst_real = os.path.realpath(src_root), os.path.realpath(dst_root)
        if src_real == dst_real:
            return "are the same place"
        common = os.path.commonpath([src_real, dst_real])
        if common == src_real:
            return "overlap: the destination is inside the source"
        if common == dst_real:
            return "overlap: the source is inside the destination"
        return None
    if src_fs.unstrip_protocol(src_root) == dst_fs.unstrip_protocol(dst_root):
        return "are the same place"
    return None


def _listed(fs: Any, info: CheckpointInfo) -> dict[str, Any]:
    """One `ckpt list` row: a checkpoint checked complete, or a file named like one (never read)."""
    from gpufleet.runtime.checkpoint.verify import NOT_A_FOLDER, check_complete

    if not info.is_folder:
        return {"step": info.step, "path": info.path, "complete": False, "size_bytes": None, "world_size": None,
                "problems": [NOT_A_FOLDER]}
    report = check_complete(fs, info.path)
    manifest = report.manifest
    return {"step": info.step, "path": info.path, "complete": report.ok,
            "size_bytes": manifest.total_bytes if manifest else None,
            "world_size": manifest.world_size if manifest else None, "problems": report.problems}


def _check_step(step: int | None) -> None:
    from gpufleet.runtime.checkpoint.names import MAX_STEP

    if step is not None and not 0 <= step <= MAX_STEP:
        raise InputError(f"--step must be an integer in [0, {MAX_STEP}], got {step}")


def _size(size_bytes: int | None) -> str:
    """A checkpoint's size for the table, '-' when it is unknown."""
    return "-" if size_bytes is None else format_bytes(size_bytes)


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="List, verify, prune, upload and download crash-safe checkpoints.",
                        no_args_is_help=True)
    app.add_typer(group, name="ckpt")

    @group.command("list")
    def list_(where: str = WhereArgument, json: bool = JsonOption) -> None:
        """List checkpoints: step, complete (manifest intact, every file it names present at its size), size, ranks.

        No checksums are read: `gpufleet ckpt verify` reads every byte. A file named like a checkpoint is listed as
        not complete, with a note that it is not a checkpoint folder. What a save or a restore moved out of a
        checkpoint's way (`step_….set-aside-…`) is listed after the table (JSON `set_aside`), for a person to review.

        Example: `gpufleet ckpt list /checkpoints/run7` (or `s3://bucket/run7`)
        """
        from gpufleet.runtime.checkpoint.store import list_checkpoints, list_set_aside, store_errors
        from gpufleet.runtime.checkpoint.verify import NOT_A_FOLDER

        with _unreachable_exits(), store_errors(where):
            fs, root = _open(where)
            infos = list_checkpoints(fs, root)
            rows = [_listed(fs, info) for info in infos]
            set_aside = list_set_aside(fs, root)
        not_folders = [info for info in infos if not info.is_folder]

        def render(console: Console) -> None:
            table = Table(title=f"checkpoints in {where}", title_justify="left")
            for column in ("step", "complete", "size", "ranks", "path"):
                table.add_column(column)
            for row in rows:
                table.add_row(str(row["step"]), "yes" if row["complete"] else "NO", _size(row["size_bytes"]),
                              str(row["world_size"] or "-"), row["path"])
            console.print(table)
            for info in not_folders:
                console.print(f"step {info.step}: {info.path} is {NOT_A_FOLDER} (left alone)", soft_wrap=True)
            for path in set_aside:
                console.print(f"{path}: {SET_ASIDE_NOTE}", soft_wrap=True)

        Output(json).emit({"root": where, "checkpoints": rows, "set_aside": set_aside}, render)

    @group.command("verify")
    def verify(where: str = WhereArgument, step: int = StepOption, json: bool = JsonOption) -> None:
        """Check every file of every checkpoint against its manifest; exit 1 naming each bad file.

        In an object store, a step prefix without a manifest is a leftover (an upload cut off, or a deletion cut off):
        not a checkpoint, reported as a leftover and not as a failure (`ckpt prune --incomplete` removes it). On a
        local disk a save commits by a rename, so a step folder without a manifest there is damage. A folder with no
        complete checkpoint in it also exits 1, as does a file named like a checkpoint (it is not one); a path that
        does not exist or is a file exits 2.

        Example: `gpufleet ckpt verify /checkpoints/run7 --step 1200`
        """
        from gpufleet.runtime.checkpoint.store import store_errors

        _check_step(step)
        out = Output(json)
        with _unreachable_exits(), store_errors(where):
            results, leftovers = _verify_all(where, step, out)
        bad = [r for r in results if not r["ok"]]

        def render(console: Console) -> None:
            for result in results:
                mark = "[green]ok[/green]" if result["ok"] else "[red]BAD[/red]"
                console.print(f"{mark}  step {result['step']}  {result['path']}")
                for problem in result["problems"]:
                    console.print(f"      {problem}", soft_wrap=True)
            for item in leftovers:
                console.print(f"leftover  step {item['step']}  {item['path']}: {LEFTOVER_NOTE}", soft_wrap=True,
                              markup=False)
            console.print(f"{len(results) - len(bad)} of {len(results)} checkpoints verify"
                          + (f"; {len(leftovers)} leftover(s), not checkpoints" if leftovers else ""))

        data: dict[str, Any] = {"root": where, "checkpoints": results, "leftovers": leftovers, "ok": not bad}
        if bad:
            out.check_failed(f"{len(bad)} of {len(results)} checkpoint(s) in {where} do not verify (steps "
                             f"{', '.join(str(r['step']) for r in bad)})", data, render)
        out.emit(data, render)

    def _verify_all(where: str, step: int | None, out: Output) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Verify every checkpoint under `where` (or `step`): (results, leftovers); exits 1 when none is there."""
        from gpufleet.runtime.checkpoint.errors import CheckpointError
        from gpufleet.runtime.checkpoint.names import join
        from gpufleet.runtime.checkpoint.store import is_local, list_checkpoints
        from gpufleet.runtime.checkpoint.verify import NOT_A_FOLDER, verify_checkpoint

        fs, root = _open(where)
        infos = list_checkpoints(fs, root)
        if step is not None:
            infos = [info for info in infos if info.step == step]
            if not infos:
                raise CheckpointError(f"no checkpoint step {step} in {where}")
        leftovers = [{"step": info.step, "path": info.path} for info in infos
                     if info.is_folder and not info.has_manifest and not is_local(fs)]
        infos = [info for info in infos if info.step not in {item["step"] for item in leftovers}]
        if not infos:
            found = f" (only {len(leftovers)} leftover(s) without a manifest)" if leftovers else " (no step_… folders)"
            out.check_failed(f"no checkpoints found in {where}{found}: nothing verified",
                             {"root": where, "checkpoints": [], "leftovers": leftovers, "ok": False})
        results: list[dict[str, Any]] = []
        for info in infos:
            if not info.is_folder:
                results.append({"step": info.step, "path": info.path, "ok": False,
                                "problems": [f"{info.path}: {NOT_A_FOLDER}"]})
                continue
            report = verify_checkpoint(fs, info.path)
            results.append({"step": info.step, "path": info.path, "ok": report.ok,
                            "problems": [f"{join(info.path, p)}" for p in report.problems]})
        return results, leftovers

    @group.command("prune")
    def prune(
        where: str = WhereArgument,
        keep_last: int = typer.Option(..., "--keep-last", help="Keep this many newest complete checkpoints (≥ 1)."),
        keep_every: int = typer.Option(None, "--keep-every", help="Also keep steps that are multiples of this."),
        incomplete: bool = typer.Option(False, "--incomplete", help="Also delete checkpoints without a manifest."),
        checksums: bool = typer.Option(True, "--checksums/--no-checksums",
                                       help="Read the newest checkpoints in full before counting them as kept "
                                            "(default); --no-checksums trusts the manifest and file sizes alone."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be deleted, delete nothing."),
        json: bool = JsonOption,
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
        from gpufleet.runtime.checkpoint.retention import delete_checkpoints, plan_retention
        from gpufleet.runtime.checkpoint.store import list_checkpoints, store_errors
        from gpufleet.runtime.checkpoint.verify import NOT_A_FOLDER

        if keep_last < 1:
            raise InputError(f"--keep-last must be at least 1 (the newest complete checkpoint is never deleted), "
                             f"got {keep_last}")
        if keep_every is not None and keep_every < 1:
            raise InputError(f"--keep-every must be a positive number of steps (omit it to keep none extra), "
                             f"got {keep_every}")
        with _unreachable_exits(), store_errors(where):
            fs, root = _open(where)
            infos = list_checkpoints(fs, root)
            checkpoints = [(info.step, info.path) for info in infos if info.is_folder]
            plan = plan_retention(fs, checkpoints, keep_last, keep_every, checksums=checksums)
            doomed = dict(plan.delete)
            if incomplete:
                doomed.update(plan.incomplete)
            doomed = dict(sorted(doomed.items()))
            failed = {} if dry_run else delete_checkpoints(fs, doomed)  # one that cannot go never stops the rest
            not_deleted = [{"step": step, "path": doomed.pop(step), "reason": why} for step, why in failed.items()]
        damaged: list[dict[str, Any]] = [{"step": step, "path": path, "problems": problems}
                   for step, (path, problems) in plan.damaged.items()]
        not_folders = [{"step": info.step, "path": info.path} for info in infos if not info.is_folder]
        data = {"root": where, "dry_run": dry_run, "deleted": list(doomed.values()), "kept": list(plan.keep.values()),
                "damaged": damaged, "not_folders": not_folders, "not_deleted": not_deleted}

        def render(console: Console) -> None:
            verb = "would delete" if dry_run else "deleted"
            for step, path in doomed.items():
                console.print(f"{verb} step {step}  {path}")
            for item in damaged:
                console.print(f"left damaged step {item['step']}  {item['path']}: {'; '.join(item['problems'])}",
                              soft_wrap=True)
            for item in not_folders:
                console.print(f"left step {item['step']}  {item['path']}: {NOT_A_FOLDER}, never deleted",
                              soft_wrap=True)
            summary = f"{verb} {len(doomed)} checkpoint(s), kept {len(plan.keep)} complete"
            if damaged:
                summary += (f"; left {len(damaged)} damaged checkpoint(s) in place, not counted as kept "
                            f"(see `gpufleet ckpt verify {where}`)")
            console.print(summary, soft_wrap=True)

        if not_deleted:
            Output(json).check_failed(f"{len(not_deleted)} checkpoint(s) could not be deleted: " + "; ".join(
                f"step {item['step']} ({item['path']}): {item['reason']}" for item in not_deleted), data, render)
        Output(json).emit(data, render)

    def _copy(src: str, dst: str, step: int | None, max_mib_per_s: float | None, deadline_s: float, json: bool,
              verb: str) -> None:
        from gpufleet.runtime.checkpoint.store import TransferPolicy

        _check_step(step)
        if max_mib_per_s is not None and max_mib_per_s <= 0:
            raise InputError(f"--max-mib-per-s must be a positive number of MiB/s (omit it for no cap), "
                             f"got {max_mib_per_s:g}")
        if not deadline_s > 0:
            raise InputError(f"--deadline must be a positive number of seconds, got {deadline_s:g}")
        policy = TransferPolicy(max_bytes_per_s=None if max_mib_per_s is None else max_mib_per_s * 2**20,
                                max_attempts=None, deadline_s=deadline_s)
        # each retry is logged as a warning; here the outcome (one line, with the attempts) is what a user reads
        logging.getLogger("gpufleet.runtime.checkpoint").addHandler(logging.NullHandler())
        with _unreachable_exits(deadline_s):
            _copy_steps(src, dst, step, policy, Output(json), verb)

    def _copy_steps(src: str, dst: str, step: int | None, policy: Any, out: Output, verb: str) -> None:
        """Copy each complete step of `src` into `dst`; a store that does not answer within the policy's deadline
        raises StoreUnreachableError (at any point: the steps already copied stay copied)."""
        from gpufleet.runtime.checkpoint.errors import CheckpointError, StoreUnreachableError
        from gpufleet.runtime.checkpoint.names import join
        from gpufleet.runtime.checkpoint.store import install_checkpoint, list_checkpoints, store_errors, with_retries
        from gpufleet.runtime.checkpoint.verify import verify_checkpoint

        def reach(action: Any, url: str, what: str) -> Any:
            with store_errors(url):
                return with_retries(action, what, policy)

        src_fs, src_root = reach(lambda: _open(src, policy.deadline_s), src, f"open {src}")
        overlap = reach(lambda: _overlap(src_fs, src_root, *_open_url(dst, policy.deadline_s)), dst, f"open {dst}")
        if overlap is not None:
            raise InputError(f"source and destination {overlap} ({src} and {dst}): give a destination root "
                             f"outside the source (and not containing it)")
        infos = [i for i in reach(lambda: list_checkpoints(src_fs, src_root), src, f"list {src}")
                 if i.has_manifest and (step is None or i.step == step)]
        if step is not None and not infos:
            raise CheckpointError(f"no complete checkpoint step {step} in {src}")
        if not infos:
            out.check_failed(f"no complete checkpoints found in {src} (no step_… folder with a manifest): nothing "
                             f"{verb}", {"from": src, "to": dst, "copied": [], "not_copied": []})
        dst_fs, dst_root = reach(lambda: _destination(dst, policy.deadline_s), dst, f"open {dst}")
        copied: list[dict[str, Any]] = []
        not_copied: list[dict[str, Any]] = []  # a damaged source, or a destination step refused
        for info in infos:  # each step on its own: one bad step never stops the good ones after it
            target = join(dst_root, info.path.rstrip("/").rsplit("/", 1)[-1])
            report = reach(lambda info=info: verify_checkpoint(src_fs, info.path), src, f"verify {info.path}")
            if not report.ok:
                not_copied.append({"step": info.step, "reason": f"{info.path} does not verify: "
                                   + "; ".join(report.problems)})
                continue
            try:
                with store_errors(f"{src} -> {dst}"):
                    manifest, fresh = install_checkpoint(src_fs, info.path, dst_fs, target, policy)
            except StoreUnreachableError as error:  # every later step would wait out the deadline too: stop here
                done = ", ".join(str(item["step"]) for item in copied) or "none"
                raise StoreUnreachableError(f"{error} (steps copied before: {done})") from error
            except CheckpointError as error:
                not_copied.append({"step": info.step, "reason": str(error)})
                continue
            copied.append({"step": info.step, "to": target, "size_bytes": manifest.total_bytes, "copied": fresh})
        _copied(out, {"from": src, "to": dst, "copied": copied, "not_copied": not_copied}, verb)

    def _copied(out: Output, data: dict[str, Any], verb: str) -> None:
        """What a copy did, for people or as JSON; exit 1 naming the steps not copied."""
        copied, not_copied = data["copied"], data["not_copied"]

        def render(console: Console) -> None:
            for item in copied:
                if item["copied"]:
                    console.print(f"{verb} step {item['step']} -> {item['to']} ({_size(item['size_bytes'])})")
                else:
                    console.print(f"step {item['step']} already at {item['to']} (identical), skipped")
            done = sum(1 for item in copied if item["copied"])
            console.print(f"{verb} {done} checkpoint(s), {len(copied) - done} already there")

        if not_copied:  # the good steps are across (and listed); say which were not, and fail the check
            out.check_failed(f"{len(not_copied)} checkpoint(s) not {verb}: " + "; ".join(
                f"step {item['step']}: {item['reason']}" for item in not_copied), data, render)
        out.emit(data, render)

    BandwidthOption = typer.Option(None, "--max-mib-per-s",
                                   help="Cap the transfer rate (MiB/s, a positive number; omit for no cap).")

    @group.command("upload")
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

    @group.command("download")
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
