"""The bench steps: `bench gemm` (bf16, and fp8 where the device has it) at a model's own shapes and `bench memory`,
against the catalog's peaks for the detected GPU, and `bench host` (the seconds per launched kernel the MoE step
model uses). Each writes its `--json` output for `calibrate`. On the dry path the shapes are the burn-in model's
(a catalog file written for it), small enough for a CPU, and no floor applies: a CPU is not the GPU it is compared
with."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml

from gpufleet.bench_file import GemmBench, HostBench, MemoryBench, read_bench_result
from gpufleet.errors import InputError
from gpufleet.runtime.burnin.config import MODEL_ID
from gpufleet.runtime.gpucheck import proc
from gpufleet.runtime.gpucheck.burnin_check import DRY_RUN
from gpufleet.runtime.gpucheck.machine import Context
from gpufleet.runtime.gpucheck.results import Outcome, Status

R = TypeVar("R", GemmBench, MemoryBench, HostBench)

#: What the GPU path benches: a real model's GEMMs at a training micro-batch's tokens, and a copy of 2 GiB.
GPU_MODEL, GPU_TOKENS, GPU_COPY = "llama3-8b", 4096, "2GiB"
#: Floors on the GPU (judgements: cuBLAS reaches 60-80 % of the dense bf16 peak at these shapes on Hopper, a
#: device-to-device copy 80-90 % of HBM; well below that is a sick GPU, a clock cap or a wrong peak in the catalog).
GEMM_FLOOR = {"bf16": 0.5, "fp8": 0.4}
HBM_FLOOR = 0.7
#: The dry path's shapes: the burn-in model its loop step trains, at its tokens per step.
DRY_SHAPE = DRY_RUN.shape
DRY_TOKENS = DRY_RUN.micro_batch * DRY_RUN.shape.seq_len


def tiny_catalog(ctx: Context) -> Path:
    path = ctx.out / "work" / "dry-model.yaml"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({"models": [DRY_SHAPE.model_record(MODEL_ID)]}, sort_keys=False))
    return path


def _gemm(ctx: Context, dtype: str) -> GemmBench:
    shape = (["--catalog", str(tiny_catalog(ctx)), "--model", MODEL_ID, "--tokens", str(DRY_TOKENS), "--iters", "3",
              "--warmup", "1"] if ctx.dry else ["--model", GPU_MODEL, "--tokens", str(GPU_TOKENS)])
    work = ctx.work(f"bench-gemm-{dtype}")
    done = proc.run(proc.gpufleet("bench", "gemm", *shape, "--dtype", dtype, "--gpu", ctx.gpu, "--json"), work,
                    ctx.env, ctx.left_s(), "gemm")
    (work / "gemm.json").write_text(done.stdout)
    ctx.artifacts.setdefault("calibrate_from", []).append(work / "gemm.json")
    return _read(done.stdout, "bench gemm", GemmBench)


def _read(stdout: str, what: str, kind: type[R]) -> R:
    """The bench's --json document, checked against its schema (bench_file.py)."""
    data = read_bench_result(proc.json_document(stdout), f"{what}'s --json output")
    if not isinstance(data, kind):
        raise InputError(f"{what} wrote a {data.kind} bench result")
    return data


def gemm_outcome(ctx: Context, dtype: str, data: GemmBench) -> Outcome:
    rows = data.rows
    best = max(rows, key=lambda row: row.tflops)
    numbers: dict[str, Any] = {"model": data.model, "tokens": data.tokens, "device": best.device,
                               "peak_tflops": best.peak_tflops, "best_tflops": best.tflops,
                               "best_fraction_of_peak": best.fraction_of_peak,
                               "rows": {row.shape: round(row.tflops, 4) for row in rows}}
    if ctx.dry:
        return Outcome("pass", f"{len(rows)} {dtype} shapes on the CPU, best {best.tflops:.3g} TFLOP/s (no floor: "
                       f"{ctx.gpu} is a stand-in, not this device)", numbers)
    fraction = best.fraction_of_peak or 0.0
    verdict: Status = "pass" if fraction >= GEMM_FLOOR[dtype] else "fail"
    return Outcome(verdict, f"best {best.tflops:.0f} TFLOP/s = {fraction:.1%} of {ctx.gpu}'s dense {dtype} peak "
                   f"(floor {GEMM_FLOOR[dtype]:.0%})", numbers)


def gemm_step(ctx: Context) -> Outcome:
    return gemm_outcome(ctx, "bf16", _gemm(ctx, "bf16"))


def fp8_step(ctx: Context) -> Outcome:
    capability = ctx.machine.capability
    if not ctx.dry and (capability is None or tuple(capability) < (8, 9)):
        return Outcome("skipped", f"compute capability {capability} has no FP8 tensor cores (needs 8.9+)")
    return gemm_outcome(ctx, "fp8", _gemm(ctx, "fp8"))


def memory_step(ctx: Context) -> Outcome:
    size = ["--size", "64MiB", "--iters", "3"] if ctx.dry else ["--size", GPU_COPY]
    work = ctx.work("bench-memory")
    done = proc.run(proc.gpufleet("bench", "memory", *size, "--gpu", ctx.gpu, "--json"), work, ctx.env, ctx.left_s(),
                    "memory")
    (work / "memory.json").write_text(done.stdout)
    ctx.artifacts.setdefault("calibrate_from", []).append(work / "memory.json")
    data = _read(done.stdout, "bench memory", MemoryBench)
    numbers = data.model_dump(include={"device", "size_bytes", "bandwidth_gbps", "peak_gbps", "fraction_of_peak"})
    if ctx.dry:
        return Outcome("pass", f"copy {data.bandwidth_gbps:.3g} GB/s on the CPU (no floor: {ctx.gpu} is a "
                       "stand-in)", numbers)
    fraction = data.fraction_of_peak or 0.0
    verdict: Status = "pass" if fraction >= HBM_FLOOR else "fail"
    return Outcome(verdict, f"copy {data.bandwidth_gbps:.0f} GB/s = {fraction:.1%} of {ctx.gpu}'s HBM "
                   f"(floor {HBM_FLOOR:.0%})", numbers)


def host_step(ctx: Context) -> Outcome:
    work = ctx.work("bench-host")
    done = proc.run(proc.gpufleet("bench", "host", "--json"), work, ctx.env, ctx.left_s(), "host")
    (work / "host.json").write_text(done.stdout)
    ctx.artifacts.setdefault("calibrate_from", []).append(work / "host.json")
    data = _read(done.stdout, "bench host", HostBench)
    return Outcome("pass", f"{data.host_s_per_kernel * 1e6:.2f} µs of host time per launched kernel ({data.device})",
                   {"host_s_per_kernel": data.host_s_per_kernel, "device": data.device,
                    "by_op_us": {op: round(row.host_s_per_kernel * 1e6, 3) for op, row in data.by_op.items()}})
