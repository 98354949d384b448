"""The exporter steps: one Prometheus scrape of a real `gpufleet exporter` process over HTTP (NVML on a GPU, the
fake GPUs on the dry path), and each NVML reading it served against `nvidia-smi --query-gpu` taken just before and
just after the scrape, within the tolerance each reading allows."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpufleet.runtime.gpucheck import proc
from gpufleet.runtime.gpucheck.machine import Context
from gpufleet.runtime.gpucheck.results import Outcome

#: families every GPU must have in one scrape (the readings compared below, and the up flag)
REQUIRED = ("gpufleet_gpu_up", "gpufleet_gpu_temperature_celsius", "gpufleet_gpu_power_watts",
            "gpufleet_gpu_memory_used_bytes", "gpufleet_gpu_memory_total_bytes", "gpufleet_gpu_sm_clock_hertz",
            "gpufleet_gpu_utilization_ratio")
SMI_FIELDS = ("index", "temperature.gpu", "power.draw", "memory.used", "memory.total", "clocks.sm",
              "utilization.gpu")
MIB = 2**20


@dataclass(frozen=True)
class Reading:
    """One exporter metric against one nvidia-smi field: `scale` turns the field into the metric's unit; the
    tolerance is `absolute` or `relative` x the larger value, whichever is wider (judgements: the two reads are
    up to a second apart and power, clocks and utilization move within that)."""

    name: str
    metric: str
    smi_field: str
    scale: float
    absolute: float
    relative: float = 0.0


READINGS = (
    Reading("temperature_c", "gpufleet_gpu_temperature_celsius", "temperature.gpu", 1.0, 3.0),
    Reading("power_w", "gpufleet_gpu_power_watts", "power.draw", 1.0, 25.0, 0.10),
    Reading("memory_used_bytes", "gpufleet_gpu_memory_used_bytes", "memory.used", MIB, 512 * MIB, 0.01),
    Reading("memory_total_bytes", "gpufleet_gpu_memory_total_bytes", "memory.total", MIB, 2 * MIB),
    Reading("sm_clock_hz", "gpufleet_gpu_sm_clock_hertz", "clocks.sm", 1e6, 100e6, 0.05),
    Reading("utilization_ratio", "gpufleet_gpu_utilization_ratio", "utilization.gpu", 0.01, 0.15),
)


def parse_scrape(text: str) -> dict[str, dict[str, float]]:
    """metric name -> {gpu label: value} for the samples that carry a `gpu` label (Prometheus' own parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "gpu" in sample.labels and "reason" not in sample.labels:
                samples.setdefault(sample.name, {})[sample.labels["gpu"]] = float(sample.value)
    return samples


def parse_smi(text: str) -> dict[str, dict[str, float | None]]:
    """gpu index -> field -> value from `nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits`
    (`[N/A]` and friends read as None)."""
    rows: dict[str, dict[str, float | None]] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(SMI_FIELDS):
            continue
        values: dict[str, float | None] = {}
        for name, cell in zip(SMI_FIELDS[1:], cells[1:], strict=True):
            try:
                values[name] = float(cell)
            except ValueError:
                values[name] = None
        rows[cells[0]] = values
    return rows


def compare(scrape: Mapping[str, Mapping[str, float]], before: Mapping[str, Mapping[str, float | None]],
            after: Mapping[str, Mapping[str, float | None]]) -> tuple[list[str], dict[str, object]]:
    """Each reading of each GPU: the exporter's value must lie within tolerance of the range nvidia-smi read before
    and after the scrape. The problems (empty: all agree) and the figures compared."""
    problems: list[str] = []
    figures: dict[str, object] = {}
    for gpu in sorted(before, key=int):
        for reading in READINGS:
            served = scrape.get(reading.metric, {}).get(gpu)
            smi = [row.get(reading.smi_field) for row in (before[gpu], after.get(gpu, before[gpu]))]
            known = [value * reading.scale for value in smi if value is not None]
            if served is None or not known:
                figures[f"gpu{gpu}.{reading.name}"] = "not reported"
                continue
            low, high = min(known), max(known)
            tolerance = max(reading.absolute, reading.relative * max(high, served))
            gap = max(low - served, served - high, 0.0)
            figures[f"gpu{gpu}.{reading.name}"] = {"exporter": served, "nvidia_smi": known, "tolerance": tolerance}
            if gap > tolerance:
                problems.append(f"gpu {gpu} {reading.name}: exporter {served:.4g}, nvidia-smi {low:.4g}-{high:.4g} "
                                f"(tolerance {tolerance:.4g})")
    return problems, figures


def _query_smi(timeout_s: float) -> dict[str, dict[str, float | None]]:
    done = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise proc.StepFailed(f"nvidia-smi --query-gpu failed: {(done.stderr or done.stdout).strip()[:200]}")
    return parse_smi(done.stdout)


def _get(url: str, exporter: proc.Proc, deadline: float) -> str:
    """GET `url` once the exporter listens (it binds within a second or two of starting)."""
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:  # a loopback URL built here
                return str(answer.read().decode("utf-8"))
        except OSError:
            if exporter.poll() is not None:
                raise proc.StepFailed(f"the exporter exited {exporter.poll()}: {exporter.done().last_line()}"
                                      ) from None
            if time.monotonic() > deadline:
                raise proc.StepFailed(f"no answer from {url} before the step's timeout") from None
            time.sleep(0.1)


def _families(text: str) -> Sequence[str]:
    return sorted({line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")})


def scrape_step(ctx: Context) -> Outcome:
    """Start the exporter on a free loopback port, GET /metrics once, check every GPU is up with every reading."""
    port = proc.free_port()
    fake = ["--fake-gpus", "1"] if ctx.dry else []
    exporter = proc.start(proc.gpufleet("exporter", "--listen", f"127.0.0.1:{port}", *fake, "--duration",
                                        f"{ctx.left_s():.0f}"), ctx.work("exporter"), ctx.env, "exporter")
    try:
        before = {} if ctx.dry else _query_smi(ctx.left_s())
        text = _get(f"http://127.0.0.1:{port}/metrics", exporter, ctx.deadline)
        after = {} if ctx.dry else _query_smi(ctx.left_s())
    finally:
        exporter.stop()
    (ctx.work("exporter") / "metrics.prom").write_text(text, encoding="utf-8")
    scrape = parse_scrape(text)
    ctx.artifacts["scrape"] = (scrape, before, after)
    gpus = sorted(scrape.get("gpufleet_gpu_up", {}), key=int)
    missing = [f"gpu {gpu} {name}" for gpu in gpus for name in REQUIRED if gpu not in scrape.get(name, {})]
    down = [gpu for gpu in gpus if scrape["gpufleet_gpu_up"][gpu] != 1.0]
    numbers = {"source": "fake GPUs (--fake-gpus 1)" if ctx.dry else "NVML", "gpus": len(gpus),
               "families": len(_families(text)), "bytes": len(text.encode())}
    if not gpus or missing or down:
        why = "no GPU in the scrape" if not gpus else f"down: {down}" if down else f"missing: {missing[:4]}"
        return Outcome("fail", why, numbers)
    return Outcome("pass", f"{len(gpus)} GPU(s) up, {numbers['families']} metric families, every reading present",
                   numbers)


def nvml_step(ctx: Context) -> Outcome:
    """The scrape's NVML readings against nvidia-smi's (GPU only: the fake GPUs have no nvidia-smi to agree with)."""
    if ctx.dry:
        return Outcome("skipped", "no GPU: the fake GPUs' readings have no nvidia-smi to be compared with")
    if "scrape" not in ctx.artifacts:
        return Outcome("fail", "no scrape to compare (the exporter-scrape step failed)")
    scrape, before, after = ctx.artifacts["scrape"]
    if not before:
        return Outcome("fail", "nvidia-smi --query-gpu returned no GPU rows")
    problems, figures = compare(scrape, before, after)
    if problems:
        return Outcome("fail", f"{len(problems)} reading(s) outside tolerance: " + "; ".join(problems[:3]), figures)
    return Outcome("pass", f"{len(READINGS)} readings x {len(before)} GPU(s) within tolerance of nvidia-smi", figures)
