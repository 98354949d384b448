"""GPU checks through `nvidia-smi` queries (the NVML seam: tests give canned output for a fake node).

`nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits` prints one comma-separated line per GPU; the field
names are nvidia-smi's own (`nvidia-smi --help-query-gpu`). `nvidia-smi nvlink --status` prints, per GPU,
`GPU 0: NAME (UUID: ...)` then one `Link N: 26.562 GB/s` or `Link N: <inactive>` line per link.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpufleet.runtime.doctor.checks import CheckResult
from gpufleet.runtime.doctor.seams import NodeSeams, Status

GPU_QUERY_FIELDS = (
    "index", "name", "persistence_mode", "ecc.mode.current", "ecc.errors.uncorrected.volatile.total",
    "clocks.applications.graphics", "clocks.max.graphics", "clocks_throttle_reasons.hw_slowdown",
    "clocks_throttle_reasons.sw_thermal_slowdown",
)
#: Application clocks below this fraction of the GPU's maximum mean someone locked them low (judgement: boost
#: tables step by ~15 MHz, so 0.9 leaves room for a deliberate power-capped setting to be flagged, not noise).
MIN_APPLICATION_CLOCK_FRACTION = 0.9
_LINK = re.compile(r"^\s*Link (?P<link>\d+): (?P<state>.+?)\s*$")
_GPU = re.compile(r"^GPU (?P<index>\d+): ")


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One GPU as nvidia-smi reports it; None where it says N/A."""

    index: int
    name: str
    persistence: str | None
    ecc_mode: str | None
    uncorrected_errors: int | None
    app_clock_mhz: float | None
    max_clock_mhz: float | None
    hw_slowdown: str | None
    thermal_slowdown: str | None


def _value(text: str) -> str | None:
    text = text.strip()
    return None if not text or "N/A" in text or text.startswith("[") else text


def _number(text: str) -> float | None:
    value = _value(text)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def parse_gpu_rows(stdout: str) -> list[GpuRow]:
    rows = []
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(GPU_QUERY_FIELDS) or not cells[0].isdigit():
            continue
        errors = _number(cells[4])
        rows.append(GpuRow(int(cells[0]), cells[1], _value(cells[2]), _value(cells[3]),
                           int(errors) if errors is not None else None, _number(cells[5]), _number(cells[6]),
                           _value(cells[7]), _value(cells[8])))
    return rows


def query_gpus(seams: NodeSeams) -> tuple[list[GpuRow] | None, str]:
    """The GPUs, or None and why not (no nvidia-smi, or it failed)."""
    result = seams.run(["nvidia-smi", f"--query-gpu={','.join(GPU_QUERY_FIELDS)}", "--format=csv,noheader,nounits"])
    if not result.found:
        return None, "nvidia-smi is not installed: no NVIDIA driver on this node"
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        return None, f"nvidia-smi failed (exit {result.returncode}): {detail[0] if detail else 'no output'}"
    return parse_gpu_rows(result.stdout), ""


def gpu_count(rows: list[GpuRow] | None, why: str, expected: int | None) -> CheckResult:
    if rows is None:
        status: Status = "fail" if expected else "skip"
        return CheckResult("gpu-count", status, why, "install the driver or run on a GPU node" if expected else "")
    seen = len(rows)
    names = sorted({row.name for row in rows})
    message = f"{seen} GPU(s): {', '.join(names) or '-'}"
    if expected is not None and seen != expected:
        return CheckResult("gpu-count", "fail", f"{message}; expected {expected}",
                           "a GPU fell off the bus or is hidden: check `dmesg` for Xid 79 and CUDA_VISIBLE_DEVICES; "
                           "drain the node", {"gpus": seen})
    return CheckResult("gpu-count", "ok", message, figures={"gpus": seen})


def ecc(rows: list[GpuRow]) -> CheckResult:
    off = [row.index for row in rows if row.ecc_mode is not None and row.ecc_mode.lower() != "enabled"]
    bad = [(row.index, row.uncorrected_errors) for row in rows if row.uncorrected_errors]
    if bad:
        listing = ", ".join(f"GPU {index}: {count}" for index, count in bad)
        return CheckResult("ecc", "fail", f"uncorrected ECC errors since boot ({listing})",
                           "drain the node and reset the GPU (or RMA it if errors return); row remapping needs a reset")
    if off:
        return CheckResult("ecc", "warn", f"ECC is off on GPU {', '.join(map(str, off))}",
                           "enable it (`nvidia-smi -e 1`, then reboot): silent bit flips corrupt training")
    return CheckResult("ecc", "ok", "ECC on, no uncorrected errors")


def persistence(rows: list[GpuRow]) -> CheckResult:
    off = [row.index for row in rows if row.persistence is not None and row.persistence.lower() != "enabled"]
    if off:
        return CheckResult("persistence", "warn", f"persistence mode off on GPU {', '.join(map(str, off))}",
                           "run nvidia-persistenced (or `nvidia-smi -pm 1`): without it every job start re-initialises "
                           "the GPUs")
    return CheckResult("persistence", "ok", "persistence mode on")


def clocks(rows: list[GpuRow]) -> CheckResult:
    throttled = [row.index for row in rows if (row.hw_slowdown or "").lower() == "active"
                 or (row.thermal_slowdown or "").lower() == "active"]
    if throttled:
        return CheckResult("clocks", "fail", f"GPU {', '.join(map(str, throttled))} throttled (hardware or thermal "
                           "slowdown active)", "check cooling, power supply and `nvidia-smi -q -d PERFORMANCE`")
    low = [row.index for row in rows if row.app_clock_mhz and row.max_clock_mhz
           and row.app_clock_mhz < MIN_APPLICATION_CLOCK_FRACTION * row.max_clock_mhz]
    if low:
        return CheckResult("clocks", "warn", f"application clocks below {MIN_APPLICATION_CLOCK_FRACTION:.0%} of max on "
                           f"GPU {', '.join(map(str, low))}", "reset them: `nvidia-smi -rac` (and `-rgc` if locked)")
    lowest = min((row.app_clock_mhz for row in rows if row.app_clock_mhz), default=0.0)
    return CheckResult("clocks", "ok", "no slowdown active; application clocks at max",
                       figures={"app_clock_mhz": lowest} if lowest else {})


def parse_nvlink_status(stdout: str) -> dict[int, tuple[int, int]]:
    """Per GPU index: (links up, links listed)."""
    links: dict[int, tuple[int, int]] = {}
    gpu: int | None = None
    for line in stdout.splitlines():
        if (match := _GPU.match(line)) is not None:
            gpu = int(match["index"])
            links[gpu] = (0, 0)
        elif gpu is not None and (match := _LINK.match(line)) is not None:
            up, total = links[gpu]
            links[gpu] = (up + ("inactive" not in match["state"].lower()), total + 1)
    return links


def nvlink(seams: NodeSeams, rows: list[GpuRow]) -> CheckResult:
    result = seams.run(["nvidia-smi", "nvlink", "--status"])
    if not result.found or result.returncode != 0:
        return CheckResult("nvlink", "skip", "`nvidia-smi nvlink --status` gave no answer")
    links = parse_nvlink_status(result.stdout)
    if not any(total for _, total in links.values()):
        return CheckResult("nvlink", "skip", "no NVLink on these GPUs (PCIe only)")
    most = max(total for _, total in links.values())
    down = {gpu: total - up for gpu, (up, total) in links.items() if up < most}
    if down:
        listing = ", ".join(f"GPU {gpu}: {most - links[gpu][0]} of {most} down" for gpu in sorted(down))
        return CheckResult("nvlink", "fail", f"NVLink links down ({listing})",
                           "drain the node: a GPU with links down slows every collective it joins; reset or RMA",
                           {"links_up_min": min(up for up, _ in links.values())})
    return CheckResult("nvlink", "ok", f"all {most} NVLink links up on {len(links)} GPU(s)",
                       figures={"links_up_min": most})


def gpu_checks(seams: NodeSeams, expected_gpus: int | None) -> list[CheckResult]:
    rows, why = query_gpus(seams)
    count = gpu_count(rows, why, expected_gpus)
    if not rows:
        return [count]
    return [count, ecc(rows), persistence(rows), clocks(rows), nvlink(seams, rows)]
