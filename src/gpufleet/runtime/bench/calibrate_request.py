"""What `gpufleet calibrate` asks, as one typed request, and the call that answers it: bench results read (or the
benches run here), a calibration profile built against --gpu's built-in one and written atomically."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from gpufleet import __version__
from gpufleet.bench_file import CollectivesBench, GemmBench, HostBench, MemoryBench, read_bench_result
from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.registry import Catalog
from gpufleet.errors import InputError
from gpufleet.input_files import load_json
from gpufleet.request import Request
from gpufleet.runtime.bench.calibrate import build_profile


class CalibrateRequest(Request):
    """A profile for catalog GPU `gpu` written to `out`, from `sources` (bench --json outputs) or, without them,
    from the GEMM (of `model`'s shapes), memory and host benches run here."""

    gpu: str
    out: Path
    sources: tuple[Path, ...] = ()
    model: str | None = None
    tokens: int = Field(4096, ge=1)
    tp: int = Field(1, ge=1)
    dtype: str = "bf16"

    @model_validator(mode="after")
    def _check(self) -> CalibrateRequest:
        if self.out.is_dir():
            example = self.out / f"{self.gpu}.yaml"
            raise InputError(f"--out {self.out} is a folder; give a file name such as {example}")
        return self


@dataclass(frozen=True)
class Calibration:
    """The profile written, the built-in one it replaces, and where, when and by what it was measured."""

    profile: CalibrationProfile
    built_in: CalibrationProfile
    host: str
    when: str
    data: dict[str, Any]


def _load_json(path: Path) -> Any:
    return load_json(path, "bench result", "give the output of a `gpufleet bench ... --json` command")


def _collective_points(data: CollectivesBench) -> list[Any]:
    """A `bench collectives --json` output as measured points (rows of one rank, or sizes without traffic, skipped)."""
    from gpufleet.catalog.calibration import MeasuredCollective

    points = []
    for row in data.rows:
        if row.ranks < 2 or not row.busbw_gbps > 0:
            continue
        if row.ranks_per_node is None:
            raise InputError("a collectives row has no ranks_per_node (written by an older gpufleet): rerun bench "
                             "collectives")
        points.append(MeasuredCollective(op=row.collective, size_bytes=float(row.size_bytes), ranks=row.ranks,
                                         ranks_per_node=row.ranks_per_node, busbw_gbytes_per_s=row.busbw_gbps))
    return points


def measurements_from(paths: list[Path]) -> Any:
    """The measurements in `bench ... --json` files (bench_file.py's schemas, one line naming a bad field)."""
    from gpufleet.runtime.bench.calibrate import GemmPoint, Measurements

    gemm, memory, notes, collectives, disk, host = [], None, [], [], None, None
    for path in paths:
        data = read_bench_result(_load_json(path), str(path))
        if isinstance(data, HostBench):
            host = data.host_s_per_kernel
        elif isinstance(data, GemmBench):
            gemm += [GemmPoint(r.m, r.n, r.k, r.dtype, r.tflops * 1e12) for r in data.rows]
        elif isinstance(data, MemoryBench):
            memory = data.bandwidth_gbps * 1e9
        elif isinstance(data, CollectivesBench):
            collectives += _collective_points(data)
        else:
            largest = max(data.rows, key=lambda r: r.size_bytes)
            disk = largest.write_gbps * 1e9
            notes.append(f"disk ({path.name}): read {largest.read_gbps:.4g} GB/s at {largest.size_bytes} B")
    return Measurements(gemm, memory, notes, collectives, disk, host)


def measure_here(catalog: Catalog, model: str | None, tokens: int, tp: int, dtype: str) -> Any:
    from gpufleet.runtime.bench.calibrate import GemmPoint, Measurements
    from gpufleet.runtime.bench.gemm import bench_gemm
    from gpufleet.runtime.bench.host import bench_host
    from gpufleet.runtime.bench.memory import bench_memory
    from gpufleet.runtime.bench.shapes import model_gemm_shapes

    if model is None:
        raise InputError("give --model (whose GEMM shapes to run) or --from FILE with bench results")
    shapes = model_gemm_shapes(catalog.model(model), tokens, tp)
    rows = bench_gemm(shapes, [dtype])
    memory, host = bench_memory(), bench_host()
    return Measurements([GemmPoint(r.shape.m, r.shape.n, r.shape.k, r.dtype, r.flops_per_s) for r in rows],
                        memory.bytes_per_s, [f"gemm shapes of {model}, {tokens} tokens, tp {tp}"],
                        host_s_per_kernel=host.host_s_per_kernel)


def write_atomically(path: Path, text: str) -> None:
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


def calibrate(request: CalibrateRequest, catalog: Catalog) -> Calibration:
    """Measure (or read the measurements), build the profile, write it atomically and read it back as plan will."""
    from gpufleet.catalog.calibration_file import calibration_yaml, read_calibration_file

    gpu_spec, base = catalog.gpu(request.gpu), catalog.calibration(request.gpu)
    measured = (measurements_from(list(request.sources)) if request.sources else
                measure_here(catalog, request.model, request.tokens, request.tp, request.dtype))
    host, when = socket.gethostname(), datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    provenance = f"gpufleet {__version__} calibrate on host {host}, {when}"
    profile = build_profile(gpu_spec, base, measured, provenance)
    header = (f"gpufleet calibration profile for {request.gpu}\nhost: {host}\ndate: {when}\n"
              f"gpufleet_version: {__version__}\nuse: gpufleet plan ... --calibration {request.out.name}")
    write_atomically(request.out, calibration_yaml([profile], header))
    read_calibration_file(request.out)  # what plan/memory/validate will read: checked now, not at their first use
    data: dict[str, Any] = {"out": str(request.out), "host": host, "date": when, "gpufleet_version": __version__,
                            "profile": profile.model_dump(mode="json", exclude_none=True),
                            "built_in": base.model_dump(mode="json", exclude_none=True)}
    return Calibration(profile, base, host, when, data)
