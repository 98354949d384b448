"""`gpufleet doctor`: node preflight, `--cluster` outlier search, and `doctor nccl-log FILE`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.cli.common import JsonOption
from gpufleet.cli.output import Output

if TYPE_CHECKING:
    from gpufleet.runtime.doctor.checks import NodeReport
    from gpufleet.runtime.doctor.cluster import Outlier, RankReport
    from gpufleet.runtime.doctor.nccl_log import Finding, NcclLogReport

_SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "cyan", "fail": "red", "warn": "yellow",
                   "ok": "green", "skip": "dim"}

NCCL_LOG_HELP = """Read an NCCL_DEBUG=INFO log: the transport of every connection (NET/IB, NET/Socket = TCP fallback,
P2P, SHM), GPUDirect RDMA, rings/trees/NVLS, the interfaces chosen, PyTorch watchdog timeouts; each finding with an
id and what to change. Exit 1 when a finding is an error (tcp-fallback, watchdog-timeout, ...).

The log is streamed: a regular file only (a pipe, a device or /proc/kmsg is refused unread), lines
past 8 KiB cut, at most 4 GiB (filter a bigger one with grep -E ' NCCL |Watchdog').

Examples:

    NCCL_DEBUG=INFO torchrun ... 2>&1 | tee run.log ;  gpufleet doctor nccl-log run.log

    gpufleet doctor nccl-log run.log --json | jq '.findings[].id'
"""


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
    file: Path = typer.Argument(..., help="An NCCL_DEBUG=INFO log (stdout/stderr of the job): a regular file, "
                                "streamed, at most 4 GiB."),
    json_out: bool = JsonOption,
) -> None:
    from gpufleet.runtime.doctor.nccl_log import read_nccl_log_file

    out = Output(json_mode=json_out)
    report = read_nccl_log_file(file)
    data = _nccl_log_data(file, report)
    failed = [row for row in data["findings"] if row["severity"] == "error"]
    if failed:
        out.check_failed(_failed_message(str(file), failed), data, _render_nccl_log(data))
    out.emit(data, _render_nccl_log(data))


DOCTOR_HELP = """Check this node before training, read-only: GPU count, ECC, persistence mode, clocks, NVLink, RDMA
ports (state and rate), the GPUDirect RDMA module, NCCL and PyTorch allocator environment, memlock limit, the
checkpoint disk (space; speed with --disk-speed) and clock sync. Exit 1 naming each failed check.

With --cluster, run under torchrun or srun (one rank per GPU): every rank checks and benchmarks its node and GPU,
rank 0 prints each rank's report and names the outliers (a figure far below the median of the ranks).

Examples:

    gpufleet doctor --gpus 8 --nic-gbps 400 --checkpoint-path /checkpoints --need-free 2TB

    torchrun --nnodes 16 --nproc-per-node 8 ... -m gpufleet doctor --cluster --gpus 8 --json

    gpufleet doctor nccl-log run.log
"""


def _check_rows(report: NodeReport) -> list[dict[str, Any]]:
    return [{"id": c.id, "status": c.status, "message": c.message, "fix": c.fix, "figures": c.figures,
             "findings": _finding_rows(c.findings)} for c in report.checks]


def _render_checks(host: str, rows: list[dict[str, Any]]) -> Any:
    def render(console: Console) -> None:
        table = Table(title=f"doctor: {host}", title_justify="left")
        for column in ("check", "status", "what", "change"):
            table.add_column(column, overflow="fold")
        for row in rows:
            style = _SEVERITY_STYLE.get(row["status"], "")
            table.add_row(row["id"], f"[{style}]{row['status']}[/{style}]", row["message"], row["fix"])
        console.print(table)
    return render


def _request(gpus: int | None, nic_gbps: float | None, checkpoint_path: Path | None, need_free: str | None,
             disk_speed: bool, min_disk_write_gbps: float | None) -> Any:
    from gpufleet.runtime.doctor.node import DoctorRequest
    from gpufleet.units import parse_bytes

    return DoctorRequest(
        expected_gpus=gpus, expected_nic_gbps=nic_gbps, checkpoint_path=checkpoint_path,
        need_free_bytes=parse_bytes(need_free, "--need-free") if need_free else None,
        measure_disk=_measure_disk if disk_speed or min_disk_write_gbps else None,
        min_disk_write_bytes_per_s=min_disk_write_gbps * 1e9 if min_disk_write_gbps else None)


#: The scratch file `doctor --disk-speed` writes and removes: one checkpoint shard's worth (judgement, as
#: bench disk's smaller default size).
DISK_SPEED_BYTES = 256 * 2**20


def _measure_disk(path: Path) -> Any:
    from gpufleet.runtime.bench.disk import bench_disk
    from gpufleet.runtime.doctor.system import DiskSpeed

    [row] = bench_disk(path, (DISK_SPEED_BYTES,))
    return DiskSpeed(row.write_bytes_per_s, row.read_bytes_per_s)


def _node(out: Output, request: Any, seams: Any) -> None:
    from gpufleet.runtime.doctor.node import check_node

    report = check_node(request, seams)
    rows = _check_rows(report)
    data = {"host": report.host, "checks": rows, "failed": [row["id"] for row in rows if row["status"] == "fail"]}
    failed = [{"id": row["id"], "message": row["message"]} for row in rows if row["status"] == "fail"]
    if failed:
        out.check_failed(_failed_message(report.host, failed), data, _render_checks(report.host, rows))
    out.emit(data, _render_checks(report.host, rows))


def _cluster_data(reports: list[RankReport], outliers: list[Outlier]) -> dict[str, Any]:
    return {
        "ranks": [{"rank": r.rank, "host": r.host, "figures": r.figures(),
                   "failed": [c.id for c in r.report.failed], "checks": _check_rows(r.report)} for r in reports],
        "outliers": [{"rank_label": o.label, "figure": o.figure, "value": o.value, "median": o.median,
                      "fraction_of_median": o.fraction} for o in outliers],
    }


def _render_cluster(data: dict[str, Any]) -> Any:
    def render(console: Console) -> None:
        names = sorted({name for rank in data["ranks"] for name in rank["figures"]})
        table = Table(title=f"doctor --cluster: {len(data['ranks'])} rank(s)", title_justify="left")
        for column in ("rank", "failed checks", *names):
            table.add_column(column, overflow="fold")
        for rank in data["ranks"]:
            table.add_row(f"{rank['host']}/rank{rank['rank']}", ", ".join(rank["failed"]) or "-",
                          *(f"{rank['figures'][name]:.4g}" if name in rank["figures"] else "-" for name in names))
        console.print(table)
        for outlier in data["outliers"]:
            console.print(f"[red]outlier[/red] {outlier['rank_label']}: {outlier['figure']} {outlier['value']:.4g} "
                          f"is {outlier['fraction_of_median']:.0%} of the median {outlier['median']:.4g}")
    return render


def _cluster(out: Output, request: Any, seams: Any, bench: bool, fraction: float) -> None:
    import socket

    from gpufleet.runtime.bench.collectives import init_process_group
    from gpufleet.runtime.doctor.cluster import RankReport, find_outliers, gather_reports, quick_bench
    from gpufleet.runtime.doctor.node import check_node

    dist = init_process_group("doctor --cluster")
    try:
        host = socket.gethostname()
        mine = RankReport(dist.get_rank(), host, check_node(request, seams), quick_bench() if bench else {})
        reports = gather_reports(dist, mine)
    finally:
        dist.destroy_process_group()
    if reports is None:
        return
    outliers = find_outliers(reports, fraction)
    data = _cluster_data(reports, outliers)
    problems = [f"{r.label}: {c.id}" for r in reports for c in r.report.failed]
    problems += [f"{o.label}: {o.figure} at {o.fraction:.0%} of the median" for o in outliers]
    if problems:
        out.check_failed(f"{len(problems)} problem(s) across {len(reports)} rank(s): " + "; ".join(problems), data,
                         _render_cluster(data))
    out.emit(data, _render_cluster(data))


def doctor_callback(
    ctx: typer.Context,
    gpus: int | None = typer.Option(None, "--gpus", min=1, help="GPUs this node must show."),
    nic_gbps: float | None = typer.Option(None, "--nic-gbps", min=1, help="Rate every RDMA port must run at, Gb/s "
                                          "(default: the fastest port's)."),
    checkpoint_path: Path | None = typer.Option(None, "--checkpoint-path", help="Folder checkpoints go to."),
    need_free: str | None = typer.Option(None, "--need-free", help="Free space needed there, e.g. 2TB."),
    disk_speed: bool = typer.Option(False, "--disk-speed", help="Also time a 256 MiB write (fsync'd) and read there; "
                                    "the scratch file is removed."),
    min_disk_write_gbps: float | None = typer.Option(None, "--min-disk-write-gbps", min=0,
                                                     help="Fail below this write speed, GB/s (implies --disk-speed)."),
    cluster: bool = typer.Option(False, "--cluster", help="Gather every rank's report (run under torchrun/srun)."),
    bench: bool = typer.Option(True, "--bench/--no-bench", help="With --cluster: a quick GEMM and memory bench."),
    outlier_fraction: float = typer.Option(0.8, "--outlier-fraction", min=0.01, max=1.0,
                                           help="With --cluster: below this fraction of the median is an outlier."),
    sysfs_root: Path = typer.Option(Path("/sys"), "--sysfs-root", help="Where sysfs is (a container may mount the "
                                    "host's elsewhere)."),
    proc_root: Path = typer.Option(Path("/proc"), "--proc-root", help="Where procfs is."),
    json_out: bool = JsonOption,
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    from gpufleet.runtime.doctor.seams import NodeSeams

    out = Output(json_mode=json_out)
    request = _request(gpus, nic_gbps, checkpoint_path, need_free, disk_speed, min_disk_write_gbps)
    seams = NodeSeams(sysfs_root=sysfs_root, proc_root=proc_root)
    if cluster:
        _cluster(out, request, seams, bench, outlier_fraction)
        return
    _node(out, request, seams)


def register(app: typer.Typer) -> None:
    group = typer.Typer(help=DOCTOR_HELP, invoke_without_command=True)
    group.callback()(doctor_callback)
    group.command("nccl-log", help=NCCL_LOG_HELP)(nccl_log_command)
    app.add_typer(group, name="doctor")
