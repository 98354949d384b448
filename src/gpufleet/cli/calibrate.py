"""`gpufleet calibrate`: run the benches (or read their --json output) and write a calibration profile."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from gpufleet import __version__
from gpufleet.cli.common import CatalogOption, JsonOption, open_catalog
from gpufleet.cli.output import Output
from gpufleet.errors import InputError
from gpufleet.input_files import load_json

CALIBRATE_HELP = """Write a calibration profile (the catalog's `calibrations:` schema: GEMM fraction and shape curve,
HBM fraction, measured collectives, checkpoint write bandwidth, host seconds per launched kernel) from `gpufleet
bench gemm`, `bench memory`, `bench collectives`, `bench disk` and `bench host` results, with host, date and
gpufleet version; `plan`, `memory` and `validate` read it with `--calibration FILE`. Fields the benches do not
measure are kept from the built-in profile of --gpu. Without --from, runs the GEMM (needs --model), memory and host
benches here.

Examples:

    gpufleet calibrate --gpu h100-sxm --model llama3-70b --tp 8 --out h100.yaml

    gpufleet bench gemm --model llama3-8b --json > gemm.json; gpufleet bench memory --json > mem.json
    gpufleet calibrate --gpu h100-sxm --from gemm.json --from mem.json --out h100.yaml

    torchrun --nproc-per-node 8 -m gpufleet bench collectives --json > coll.json
    gpufleet bench disk /checkpoints --json > disk.json
    gpufleet calibrate --gpu h100-sxm --from gemm.json --from coll.json --from disk.json --out h100.yaml

    gpufleet bench host --json > host.json
    gpufleet calibrate --gpu h100-sxm --from host.json --out h100.yaml

    gpufleet plan --model llama3-70b --tokens 15T --gpu h100-sxm --gpus 1024 --calibration h100.yaml
"""


def _load_json(path: Path) -> Any:
    return load_json(path, "bench result", "give the output of a `gpufleet bench ... --json` command")


def _kind(data: Any) -> str:
    """Which bench wrote this JSON."""
    if isinstance(data, dict) and "host_s_per_kernel" in data and "by_op" in data:
        return "host"
    if isinstance(data, dict) and "bandwidth_gbps" in data:
        return "memory"
    rows = data.get("rows") if isinstance(data, dict) else None
    first = rows[0] if isinstance(rows, list) and rows and isinstance(rows[0], dict) else {}
    for kind, key in (("gemm", "tflops"), ("collectives", "busbw_gbps"), ("disk", "write_gbps")):
        if key in first:
            return kind
    return "unknown"


def _collective_points(data: Any) -> list[Any]:
    """A `bench collectives --json` output as measured points (rows of one rank, or sizes without traffic, skipped)."""
    from gpufleet.catalog.calibration import MeasuredCollective

    points = []
    for row in data["rows"]:
        ranks, per_node = int(row.get("ranks", data.get("ranks", 1))), row.get("ranks_per_node")
        if ranks < 2 or not float(row["busbw_gbps"]) > 0:
            continue
        if per_node is None:
            raise InputError("a collectives row has no ranks_per_node (written by an older gpufleet): rerun bench "
                             "collectives")
        points.append(MeasuredCollective(op=row["collective"], size_bytes=float(row["size_bytes"]), ranks=ranks,
                                         ranks_per_node=int(per_node), busbw_gbytes_per_s=float(row["busbw_gbps"])))
    return points


def _measurements_from(paths: list[Path]) -> Any:
    from pydantic import ValidationError

    from gpufleet.runtime.bench.calibrate import GemmPoint, Measurements

    gemm, memory, notes, collectives, disk, host = [], None, [], [], None, None
    for path in paths:
        data = _load_json(path)
        kind = _kind(data)
        if kind == "host":  # checked on its own: its one error line names the field
            host = _host_figure(data, path)
            continue
        try:
            if kind == "gemm":
                gemm += [GemmPoint(int(r["m"]), int(r["n"]), int(r["k"]), str(r["dtype"]), float(r["tflops"]) * 1e12)
                         for r in data["rows"]]
            elif kind == "memory":
                memory = float(data["bandwidth_gbps"]) * 1e9
            elif kind == "collectives":
                collectives += _collective_points(data)
            elif kind == "disk":
                largest = max(data["rows"], key=lambda r: r["size_bytes"])
                disk = float(largest["write_gbps"]) * 1e9
                notes.append(f"disk ({path.name}): read {largest['read_gbps']:.4g} GB/s at {largest['size_bytes']} B")
            else:
                raise InputError(f"{path} is not the --json output of bench gemm, memory, collectives, disk or host")
        except (KeyError, TypeError, ValueError, ValidationError) as error:
            detail = error.errors()[0]["msg"] if isinstance(error, ValidationError) else error
            raise InputError(f"{path}: a {kind} bench row lacks a field or a number ({detail})") from None
    return Measurements(gemm, memory, notes, collectives, disk, host)


def _host_figure(data: dict[str, Any], path: Path) -> float:
    """A `bench host --json` output's host seconds per kernel (a positive, finite number)."""
    value = data["host_s_per_kernel"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise InputError(f"{path}: host_s_per_kernel must be a positive, finite number of seconds, got {value!r}")
    return float(value)


def _measure_here(catalog_paths: list[Path] | None, model: str | None, tokens: int, tp: int, dtype: str) -> Any:
    from gpufleet.runtime.bench.calibrate import GemmPoint, Measurements
    from gpufleet.runtime.bench.gemm import bench_gemm
    from gpufleet.runtime.bench.host import bench_host
    from gpufleet.runtime.bench.memory import bench_memory
    from gpufleet.runtime.bench.shapes import model_gemm_shapes

    if model is None:
        raise InputError("give --model (whose GEMM shapes to run) or --from FILE with bench results")
    shapes = model_gemm_shapes(open_catalog(catalog_paths).model(model), tokens, tp)
    rows = bench_gemm(shapes, [dtype])
    memory, host = bench_memory(), bench_host()
    return Measurements([GemmPoint(r.shape.m, r.shape.n, r.shape.k, r.dtype, r.flops_per_s) for r in rows],
                        memory.bytes_per_s, [f"gemm shapes of {model}, {tokens} tokens, tp {tp}"],
                        host_s_per_kernel=host.host_s_per_kernel)


def _write_atomically(path: Path, text: str) -> None:
    """Temp file, fsync, rename: a crash leaves the old profile or the new one, never half of one."""
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise InputError(f"cannot write {path}: {error.strerror or error}") from None


def calibrate_command(
    gpu: str = typer.Option(..., "--gpu", "-g", help="Catalog GPU id the profile calibrates (its peaks are the "
                            "reference)."),
    out: Path = typer.Option(..., "--out", "-o", help="Profile file to write (YAML)."),
    sources: list[Path] | None = typer.Option(None, "--from", help="A `bench ... --json` output (repeatable)."),
    model: str | None = typer.Option(None, "--model", "-m", help="Without --from: the model whose GEMMs to run."),
    tokens: int = typer.Option(4096, "--tokens", min=1, help="Without --from: tokens per micro-batch (GEMM M)."),
    tp: int = typer.Option(1, "--tp", min=1, help="Without --from: tensor-parallel degree of the shapes."),
    dtype: str = typer.Option("bf16", "--dtype", help="Without --from: GEMM dtype (bf16, fp16)."),
    catalog: list[Path] | None = CatalogOption,
    json_out: bool = JsonOption,
) -> None:
    from gpufleet.catalog.calibration_file import calibration_yaml, read_calibration_file
    from gpufleet.runtime.bench.calibrate import build_profile

    cat = open_catalog(catalog)
    gpu_spec, base = cat.gpu(gpu), cat.calibration(gpu)
    if out.is_dir():
        raise InputError(f"--out {out} is a folder; give a file name such as {out / (gpu + '.yaml')}")
    measured = _measurements_from(list(sources)) if sources else _measure_here(catalog, model, tokens, tp, dtype)
    host, when = socket.gethostname(), datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    provenance = f"gpufleet {__version__} calibrate on host {host}, {when}"
    profile = build_profile(gpu_spec, base, measured, provenance)
    header = (f"gpufleet calibration profile for {gpu}\nhost: {host}\ndate: {when}\ngpufleet_version: {__version__}\n"
              f"use: gpufleet plan ... --calibration {out.name}")
    _write_atomically(out, calibration_yaml([profile], header))
    read_calibration_file(out)  # what plan/memory/validate will read: checked now, not at their first use
    data: dict[str, Any] = {"out": str(out), "host": host, "date": when, "gpufleet_version": __version__,
            "profile": profile.model_dump(mode="json", exclude_none=True),
            "built_in": base.model_dump(mode="json", exclude_none=True)}

    def render(console: Console) -> None:
        table = Table(title=f"calibration for {gpu} written to {out}", title_justify="left")
        for column in ("field", "built-in", "measured"):
            table.add_column(column)
        for name in ("gemm_fraction_16bit", "gemm_fraction_fp8", "gemm_half_dim", "hbm_fraction",
                     "checkpoint_write_gbytes_per_s", "host_s_per_kernel"):
            before, after = data["built_in"].get(name), data["profile"].get(name)
            table.add_row(name, "-" if before is None else f"{before:.4g}", "-" if after is None else f"{after:.4g}")
        console.print(table)
        console.print(profile.note or "")
    Output(json_mode=json_out).emit(data, render)


def register(app: typer.Typer) -> None:
    app.command("calibrate", help=CALIBRATE_HELP)(calibrate_command)
