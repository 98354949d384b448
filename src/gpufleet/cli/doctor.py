"""`gpufleet doctor`: node preflight, `--cluster` outlier search, and `doctor nccl-log FILE`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.cli.common import JsonOption
from gpufleet.cli.output import Output
from gpufleet.errors import InputError

if TYPE_CHECKING:
    from gpufleet.runtime.doctor.nccl_log import Finding, NcclLogReport

_SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "cyan", "fail": "red", "warn": "yellow",
                   "ok": "green", "skip": "dim"}

NCCL_LOG_HELP = """Read an NCCL_DEBUG=INFO log: the transport of every connection (NET/IB, NET/Socket = TCP fallback,
P2P, SHM), GPUDirect RDMA, rings/trees/NVLS, the interfaces chosen, PyTorch watchdog timeouts; each finding with an
id and what to change. Exit 1 when a finding is an error (tcp-fallback, watchdog-timeout, ...).

Examples:

    NCCL_DEBUG=INFO torchrun ... 2>&1 | tee run.log ;  gpufleet doctor nccl-log run.log

    gpufleet doctor nccl-log run.log --json | jq '.findings[].id'
"""


def _read_text(path: Path) -> str:
    """A log's text; one line when it cannot be read."""
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise InputError(f"{path} is a folder; give the log file (NCCL_DEBUG=INFO output)") from None
    except OSError as error:
        raise InputError(f"cannot read {path}: {error.strerror or error}") from None
    return data.decode("utf-8", errors="replace")


def _finding_rows(findings: tuple[Finding, ...]) -> list[dict[str, Any]]:
    return [{"id": f.id, "severity": f.severity, "message": f.message, "fix": f.fix} for f in findings]


def _nccl_log_data(path: Path, report: NcclLogReport) -> dict[str, Any]:
    summary = report.summary
    return {
        "file": str(path), "version": summary.version, "hosts": list(summary.hosts), "ranks": summary.ranks,
        "nodes": summary.nodes, "networks": list(summary.networks), "net_devices": list(summary.net_devices),
        "bootstrap_interfaces": list(summary.bootstrap_interfaces), "environment": summary.environment,
        "transports": summary.transport_counts(),
        "links": [{"src_rank": link.src_rank, "dst_rank": link.dst_rank, "via": link.via, "kind": link.kind,
                   "channels": link.channels} for link in summary.links()],
        "gdr_enabled_hcas": list(summary.gdr_enabled_hcas), "gdr_disabled_hcas": list(summary.gdr_disabled_hcas),
        "algorithms": {"ring": summary.rings, "tree": summary.trees, "nvls_available": summary.nvls_available,
                       "nvls_channels": summary.nvls_channels, "collnet_channels": summary.collnet_channels},
        "timeouts": [{"rank": t.rank, "seq": t.seq, "op": t.op, "timeout_ms": t.timeout_ms, "ran_ms": t.ran_ms}
                     for t in summary.timeouts],
        "findings": _finding_rows(report.findings),
    }


def _render_findings(console: Console, rows: list[dict[str, Any]], empty: str) -> None:
    if not rows:
        console.print(f"[green]{empty}[/green]")
        return
    table = Table(title="findings", title_justify="left")
    for column in ("id", "severity", "what", "change"):
        table.add_column(column, overflow="fold")
    for row in rows:
        style = _SEVERITY_STYLE.get(row["severity"], "")
        table.add_row(row["id"], f"[{style}]{row['severity']}[/{style}]", row["message"], row["fix"])
    console.print(table)


def _render_nccl_log(data: dict[str, Any]) -> Any:
    def render(console: Console) -> None:
        algorithms = data["algorithms"]
        used = [name for name, on in (("ring", algorithms["ring"]), ("tree", algorithms["tree"]),
                                      ("nvls", (algorithms["nvls_channels"] or 0) > 0)) if on]
        console.print(f"[bold]{data['file']}[/bold]: NCCL {data['version'] or '(version not logged)'}, "
                      f"{len(data['hosts'])} host(s), ranks {data['ranks'] or '?'}, nodes {data['nodes'] or '?'}")
        console.print(f"network: {', '.join(data['networks']) or '(not logged)'}; devices: "
                      f"{', '.join(data['net_devices']) or '-'}; bootstrap: "
                      f"{', '.join(data['bootstrap_interfaces']) or '-'}")
        gdr_on, gdr_off = ", ".join(data["gdr_enabled_hcas"]) or "-", ", ".join(data["gdr_disabled_hcas"]) or "-"
        console.print(f"algorithms: {', '.join(used) or '(not logged)'}; GPUDirect RDMA on: {gdr_on}, off: {gdr_off}")
        if data["links"]:
            table = Table(title="connections (rank pair, transport, channels)", title_justify="left")
            for column in ("src", "dst", "via", "kind", "channels"):
                table.add_column(column, justify="right" if column in ("src", "dst", "channels") else "left")
            for link in data["links"]:
                style = "red" if link["kind"] == "net-socket" else ""
                table.add_row(str(link["src_rank"]), str(link["dst_rank"]), f"[{style}]{link['via']}[/{style}]"
                              if style else link["via"], link["kind"], str(link["channels"]))
            console.print(table)
        _render_findings(console, data["findings"], "no findings: nothing in this log needs changing")
    return render


def _failed_message(what: str, failed: list[dict[str, Any]]) -> str:
    return f"{what}: {len(failed)} failed: " + "; ".join(f"{row['id']}: {row['message']}" for row in failed)


def nccl_log_command(
    file: Path = typer.Argument(..., help="An NCCL_DEBUG=INFO log (stdout/stderr of the job)."),
    json_out: bool = JsonOption,
) -> None:
    from gpufleet.runtime.doctor.nccl_log import read_nccl_log

    out = Output(json_mode=json_out)
    report = read_nccl_log(_read_text(file), source=str(file))
    data = _nccl_log_data(file, report)
    failed = [row for row in data["findings"] if row["severity"] == "error"]
    if failed:
        out.check_failed(_failed_message(str(file), failed), data, _render_nccl_log(data))
    out.emit(data, _render_nccl_log(data))


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Check a node (or every node of a job) before training; read NCCL logs.",
                        no_args_is_help=True)
    group.command("nccl-log", help=NCCL_LOG_HELP)(nccl_log_command)
    app.add_typer(group, name="doctor")
