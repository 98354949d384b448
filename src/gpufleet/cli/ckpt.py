"""`gpufleet ckpt list|verify|prune|upload|download`: inspect and move checkpoints, local or in a store."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.cli.common import JsonOption
from gpufleet.cli.output import EXIT_CHECK_FAILED, Output

WhereArgument = typer.Argument(..., help="A checkpoint root: a local folder or a URL (s3://bucket/prefix, file://…).")
StepOption = typer.Option(None, "--step", help="Only this step (default: every checkpoint).")


def _open(where: str) -> tuple[Any, str]:
    from gpufleet.runtime.checkpoint.errors import CheckpointError
    from gpufleet.runtime.checkpoint.store import open_url

    fs, root = open_url(where)
    if not fs.exists(root):
        raise CheckpointError(f"{where} does not exist")
    return fs, root


def _human_bytes(size: int | None) -> str:
    if size is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return str(size)


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="List, verify, prune, upload and download crash-safe checkpoints.",
                        no_args_is_help=True)
    app.add_typer(group, name="ckpt")

    @group.command("list")
    def list_(where: str = WhereArgument, json: bool = JsonOption) -> None:
        """List checkpoints: step, complete (manifest present), size, ranks; no checksums read."""
        from gpufleet.runtime.checkpoint.errors import CorruptCheckpointError
        from gpufleet.runtime.checkpoint.store import list_checkpoints
        from gpufleet.runtime.checkpoint.verify import read_manifest

        fs, root = _open(where)
        rows = []
        for info in list_checkpoints(fs, root):
            row: dict[str, Any] = {"step": info.step, "path": info.path, "complete": info.complete,
                                   "size_bytes": None, "world_size": None}
            if info.complete:
                try:
                    manifest = read_manifest(fs, info.path)
                    row.update(size_bytes=manifest.total_bytes, world_size=manifest.world_size)
                except CorruptCheckpointError:
                    row["complete"] = False
            rows.append(row)

        def render(console: Console) -> None:
            table = Table(title=f"checkpoints in {where}", title_justify="left")
            for column in ("step", "complete", "size", "ranks", "path"):
                table.add_column(column)
            for row in rows:
                table.add_row(str(row["step"]), "yes" if row["complete"] else "NO", _human_bytes(row["size_bytes"]),
                              str(row["world_size"] or "-"), row["path"])
            console.print(table)

        Output(json).emit({"root": where, "checkpoints": rows}, render)

    @group.command("verify")
    def verify(where: str = WhereArgument, step: int = StepOption, json: bool = JsonOption) -> None:
        """Check every file of every checkpoint against its manifest; exit 1 naming each bad file."""
        from gpufleet.runtime.checkpoint.names import step_dirname
        from gpufleet.runtime.checkpoint.store import join, list_checkpoints
        from gpufleet.runtime.checkpoint.verify import verify_checkpoint

        fs, root = _open(where)
        infos = list_checkpoints(fs, root)
        if step is not None:
            step_dirname(step)
            infos = [info for info in infos if info.step == step]
            if not infos:
                from gpufleet.runtime.checkpoint.errors import CheckpointError

                raise CheckpointError(f"no checkpoint step {step} in {where}")
        results: list[dict[str, Any]] = []
        for info in infos:
            report = verify_checkpoint(fs, info.path)
            results.append({"step": info.step, "path": info.path, "ok": report.ok,
                            "problems": [f"{join(info.path, p)}" for p in report.problems]})
        bad = [r for r in results if not r["ok"]]

        def render(console: Console) -> None:
            for result in results:
                mark = "[green]ok[/green]" if result["ok"] else "[red]BAD[/red]"
                console.print(f"{mark}  step {result['step']}  {result['path']}")
                for problem in result["problems"]:
                    console.print(f"      {problem}", soft_wrap=True)
            console.print(f"{len(results) - len(bad)} of {len(results)} checkpoints verify")

        out = Output(json)
        out.emit({"root": where, "checkpoints": results, "ok": not bad}, render)
        if bad:
            out.exit(EXIT_CHECK_FAILED)

    @group.command("prune")
    def prune(
        where: str = WhereArgument,
        keep_last: int = typer.Option(..., "--keep-last", help="Keep this many newest complete checkpoints."),
        keep_every: int = typer.Option(None, "--keep-every", help="Also keep steps that are multiples of this."),
        incomplete: bool = typer.Option(False, "--incomplete", help="Also delete checkpoints without a manifest."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be deleted, delete nothing."),
        json: bool = JsonOption,
    ) -> None:
        """Delete old complete checkpoints (manifest first, so none is ever half-listed)."""
        from pathlib import Path

        from gpufleet.runtime.checkpoint.fsutil import remove_tree
        from gpufleet.runtime.checkpoint.retention import steps_to_delete
        from gpufleet.runtime.checkpoint.store import delete_checkpoint, list_checkpoints

        fs, root = _open(where)
        infos = list_checkpoints(fs, root)
        complete = {info.step: info for info in infos if info.complete}
        doomed = [complete[s] for s in steps_to_delete(complete, keep_last, keep_every)]
        if incomplete:
            doomed += [info for info in infos if not info.complete]
        local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
        if not dry_run:
            for info in doomed:
                if local:
                    remove_tree(Path(info.path))
                else:
                    delete_checkpoint(fs, info.path)
        data = {"root": where, "dry_run": dry_run, "deleted": [info.path for info in doomed]}

        def render(console: Console) -> None:
            verb = "would delete" if dry_run else "deleted"
            for info in doomed:
                console.print(f"{verb} step {info.step}  {info.path}")
            console.print(f"{verb} {len(doomed)} checkpoint(s)")

        Output(json).emit(data, render)

    def _copy(src: str, dst: str, step: int | None, max_mib_per_s: float | None, json: bool, verb: str) -> None:
        from gpufleet.runtime.checkpoint.errors import CheckpointError
        from gpufleet.runtime.checkpoint.store import TransferPolicy, copy_checkpoint, join, list_checkpoints, open_url
        from gpufleet.runtime.checkpoint.verify import verify_checkpoint

        src_fs, src_root = _open(src)
        dst_fs, dst_root = open_url(dst)
        policy = TransferPolicy(max_bytes_per_s=max_mib_per_s * 2**20 if max_mib_per_s else None)
        infos = [i for i in list_checkpoints(src_fs, src_root) if i.complete and (step is None or i.step == step)]
        if step is not None and not infos:
            raise CheckpointError(f"no complete checkpoint step {step} in {src}")
        copied: list[dict[str, Any]] = []
        for info in infos:
            report = verify_checkpoint(src_fs, info.path)
            if not report.ok:
                raise CheckpointError(f"{info.path} does not verify, not copied: {'; '.join(report.problems)}")
            target = join(dst_root, info.path.rstrip("/").rsplit("/", 1)[-1])
            manifest = copy_checkpoint(src_fs, info.path, dst_fs, target, policy)
            copied.append({"step": info.step, "to": target, "size_bytes": manifest.total_bytes})

        def render(console: Console) -> None:
            for item in copied:
                console.print(f"{verb} step {item['step']} -> {item['to']} ({_human_bytes(item['size_bytes'])})")
            console.print(f"{verb} {len(copied)} checkpoint(s)")

        Output(json).emit({"from": src, "to": dst, "copied": copied}, render)

    BandwidthOption = typer.Option(None, "--max-mib-per-s", help="Cap the transfer rate (MiB/s).")

    @group.command("upload")
    def upload(
        root: str = typer.Argument(..., help="Local checkpoint root."),
        url: str = typer.Argument(..., help="Destination, e.g. s3://bucket/run-7."),
        step: int = StepOption,
        max_mib_per_s: float = BandwidthOption,
        json: bool = JsonOption,
    ) -> None:
        """Upload verified complete checkpoints; each manifest goes last."""
        _copy(root, url, step, max_mib_per_s, json, "uploaded")

    @group.command("download")
    def download(
        url: str = typer.Argument(..., help="Source, e.g. s3://bucket/run-7."),
        root: str = typer.Argument(..., help="Local checkpoint root."),
        step: int = StepOption,
        max_mib_per_s: float = BandwidthOption,
        json: bool = JsonOption,
    ) -> None:
        """Download complete checkpoints, verified before and after; each manifest goes last."""
        _copy(url, root, step, max_mib_per_s, json, "downloaded")
