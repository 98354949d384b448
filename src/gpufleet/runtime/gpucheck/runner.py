"""The gpu-check top loop: detect the GPU, run each step under its own timeout (a step that fails or times out does
not stop the others), write REPORT.md and results.json. Exit 0 when no step failed, 1 otherwise; a missing GPU is
not a failure (the dry path runs instead), a bad flag exits 2."""

from __future__ import annotations

import argparse
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gpufleet.runtime.gpucheck import bench_check, burnin_check, ckpt_check, exporter_check, plan_check
from gpufleet.runtime.gpucheck.machine import DRY_STAND_IN_GPU, Context, Machine, detect
from gpufleet.runtime.gpucheck.proc import StepFailed, child_env
from gpufleet.runtime.gpucheck.results import Outcome, Report, StepResult, write_report


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    run: Callable[[Context], Outcome]
    timeout_s: float  # on the GPU path (the sum stays under the 8 minutes); DRY_TIMEOUT_FACTOR x on the dry


#: a shared 2-core CI machine runs the dry path's small steps more slowly than a GPU node runs its larger ones
DRY_TIMEOUT_FACTOR = 2.0


STEPS = (
    Step("exporter-scrape", "one Prometheus scrape of the exporter", exporter_check.scrape_step, 20),
    Step("nvml-vs-nvidia-smi", "exporter's NVML readings against nvidia-smi", exporter_check.nvml_step, 5),
    Step("bench-gemm-bf16", "bf16 GEMMs against the catalog's peak", bench_check.gemm_step, 40),
    Step("bench-gemm-fp8", "fp8 GEMMs against the catalog's peak", bench_check.fp8_step, 40),
    Step("bench-memory", "HBM copy bandwidth against the catalog's peak", bench_check.memory_step, 20),
    Step("bench-host", "host seconds per launched kernel", bench_check.host_step, 15),
    Step("checkpoint-kill", "DCP checkpoint: async save, SIGKILL mid-save, load, verify", ckpt_check.checkpoint_step,
         55),
    Step("loop-dense", "burnin --measure-host: plan vs measured step (dense)", burnin_check.loop_dense_step, 90),
    Step("burnin-kill-resume", "burn-in killed and resumed, losses bit-identical", burnin_check.kill_resume_step, 75),
    Step("loop-moe", "burnin --measure-host: plan vs measured step (MoE)", burnin_check.loop_moe_step, 70),
    Step("calibrate", "calibrate from the bench outputs", plan_check.calibrate_step, 20),
    Step("plan-calibrated", "plan with the calibration: what moved", plan_check.plan_step, 30),
)


def run_step(step: Step, ctx: Context) -> StepResult:
    """One step under its timeout; any exception becomes a failed step with a one-line reason."""
    start = time.monotonic()
    timeout_s = step.timeout_s * (DRY_TIMEOUT_FACTOR if ctx.dry else 1.0)
    ctx.deadline = start + timeout_s
    try:
        outcome = step.run(ctx)
    except StepFailed as error:
        outcome = Outcome("fail", str(error))
    except Exception as error:  # one step's bug must not stop the others; the report names it
        first = (str(error).strip().splitlines() or [""])[0][:300]
        outcome = Outcome("fail", f"{type(error).__name__}: {first}")
    return StepResult(step.name, step.title, outcome.status, outcome.reason, time.monotonic() - start, timeout_s,
                      outcome.numbers)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("gpufleet", "torch"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def check(out: Path, steps: Sequence[Step], machine: Machine, gpu: str, env: dict[str, str]) -> Report:
    ctx = Context(out=out, env=env, machine=machine, gpu=gpu)
    started, begin = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), time.monotonic()
    results = []
    for step in steps:
        result = run_step(step, ctx)
        print(f"{result.name:<20} {result.status:<8} {result.seconds:6.1f} s  {result.reason}", flush=True)
        results.append(result)
    return Report(mode="dry" if ctx.dry else "gpu", machine={**machine.as_json(), "catalog_gpu": gpu},
                  started=started, wall_s=time.monotonic() - begin, steps=results, versions=_versions())


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path.cwd(), help="folder to write gpu-check/ into (default: .)")
    parser.add_argument("--gpu", help="catalog GPU id to compare with (default: the detected GPU's)")
    parser.add_argument("--dry-run", action="store_true", help="run the dry (CPU) path even where a GPU is")
    parser.add_argument("--only", help="comma list of step names to run (default: all): " +
                        ", ".join(step.name for step in STEPS))
    return parser.parse_args(argv)


def _select(only: str | None) -> list[Step]:
    if not only:
        return list(STEPS)
    names = [name.strip() for name in only.split(",") if name.strip()]
    unknown = [name for name in names if name not in {step.name for step in STEPS}]
    if unknown:
        raise ValueError(f"--only {', '.join(unknown)}: not a step ({', '.join(step.name for step in STEPS)})")
    return [step for step in STEPS if step.name in names]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        steps = _select(args.only)
    except ValueError as error:
        print(f"gpu-check: error: {error}", file=sys.stderr)
        return 2
    env = child_env()
    machine = Machine(hostname=socket.gethostname(), why_no_gpu="--dry-run") if args.dry_run else detect(env)
    gpu = args.gpu or machine.catalog_gpu
    if machine.on_gpu and gpu is None:
        print(f"gpu-check: error: {machine.gpu_name!r} is not in the catalog; pass --gpu ID", file=sys.stderr)
        return 2
    if not machine.on_gpu:
        gpu = gpu or DRY_STAND_IN_GPU
        print(f"no GPU ({machine.why_no_gpu}): running the dry path on the CPU, GPU-only steps skipped", flush=True)
    out = args.out / "gpu-check"
    report = check(out, steps, machine, str(gpu), env)
    results, markdown = write_report(report, out)
    counts = report.counts()
    print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped in {report.wall_s:.0f} s; "
          f"wrote {markdown} and {results}")
    return 1 if counts["fail"] else 0
