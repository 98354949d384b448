"""Node checks outside the GPU: RDMA ports (/sys/class/infiniband), GPUDirect RDMA module (/proc/modules), NCCL and
PyTorch allocator environment, memlock limit (/proc/self/limits), checkpoint disk, clock sync.

sysfs layout read: `/sys/class/infiniband/DEV/ports/N/{state,phys_state,rate,link_layer}` (kernel ABI
Documentation/ABI/stable/sysfs-class-infiniband: state "4: ACTIVE", phys_state "5: LinkUp", rate
"400 Gb/sec (4X NDR)"); `/sys/class/net/IFACE` for NCCL_SOCKET_IFNAME.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpufleet.runtime.doctor.checks import CheckResult
from gpufleet.runtime.doctor.nccl_env_vars import (
    ELSEWHERE,
    NCCL_VARIABLES,
    REMOVED,
    is_default,
    is_pytorch_alias,
    nearest,
)
from gpufleet.runtime.doctor.nccl_log import Finding
from gpufleet.runtime.doctor.seams import NodeSeams, read_text
from gpufleet.units import format_bytes

#: Kernel modules that give NCCL GPUDirect RDMA (nvidia_peermem ships with the driver since R465; nv_peer_mem is
#: Mellanox's older out-of-tree module).
GDR_MODULES = ("nvidia_peermem", "nv_peer_mem")
#: Keys PyTorch's CUDA caching allocator accepts in PYTORCH_CUDA_ALLOC_CONF (c10/cuda/CUDAAllocatorConfig.cpp,
#: and c10/core/AllocatorConfig.h of PyTorch 2.13; docs "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF"). PyTorch
#: refuses other keys at the first CUDA allocation; a newer PyTorch may add keys, so an unknown one is a warning.
ALLOCATOR_KEYS = frozenset({
    "backend", "max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
    "roundup_power2_divisions", "expandable_segments", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
    "pinned_num_register_threads", "pinned_use_background_threads", "per_process_memory_fraction",
    "graph_capture_record_stream_reuse", "pinned_reserve_segment_size_mb", "pinned_free_catch_all",
    "pinned_use_hip_host_register",
})
#: Allocator settings that are PyTorch's defaults, so setting them changes nothing: `use_expandable_segments_{false}`
#: and the native caching allocator (c10/core/AllocatorConfig.h and c10/cuda/CUDAAllocatorConfig.h of PyTorch 2.13;
#: docs "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF": backend "native (default)").
ALLOCATOR_DEFAULTS = {"expandable_segments": "false", "backend": "native"}
_TOP_LEVEL_COMMA = re.compile(r",(?![^\[]*\])")  # roundup_power2_divisions:[256:1,512:2] keeps its commas
#: A checkpoint disk with less free space than this fraction of its size is flagged (judgement: keep-last-N
#: retention needs room for one more checkpoint than it keeps).
LOW_FREE_FRACTION = 0.10
_RATE = re.compile(r"(?P<gbps>[\d.]+) Gb/sec")
_MEMLOCK = re.compile(r"^Max locked memory\s+(?P<soft>\S+)\s+(?P<hard>\S+)", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class RdmaPort:
    device: str
    port: str
    state: str
    phys_state: str
    rate_gbps: float | None
    link_layer: str


def rdma_ports(seams: NodeSeams) -> list[RdmaPort]:
    root = seams.sys_path("class", "infiniband")
    ports = []
    for device in sorted(root.iterdir()) if root.is_dir() else []:
        for port in sorted((device / "ports").iterdir()) if (device / "ports").is_dir() else []:
            rate = _RATE.search(read_text(port / "rate") or "")
            ports.append(RdmaPort(device.name, port.name, read_text(port / "state") or "?",
                                  read_text(port / "phys_state") or "?", float(rate["gbps"]) if rate else None,
                                  read_text(port / "link_layer") or "?"))
    return ports


def _selected(ports: list[RdmaPort], hca: str | None) -> list[RdmaPort]:
    """The ports NCCL_IB_HCA selects (prefix match; `^a,b` excludes; `=a` exact; `a:1` port 1 only), else every
    port."""
    if not hca:
        return ports
    exclude, exact, entries = _hca_entries(hca)

    def matches(port: RdmaPort) -> bool:
        return any((port.device == device if exact else port.device.startswith(device))
                   and (wanted is None or port.port == wanted) for device, wanted in entries)

    return [port for port in ports if matches(port) != exclude]


def rdma_check(seams: NodeSeams, expected_gbps: float | None) -> CheckResult:
    ports = _selected(rdma_ports(seams), seams.environ.get("NCCL_IB_HCA"))
    if not ports:
        return CheckResult("rdma-ports", "skip", "no RDMA (InfiniBand/RoCE) ports: NCCL will use TCP between nodes")
    down = [f"{p.device}/{p.port} ({p.state}, {p.phys_state})" for p in ports
            if "ACTIVE" not in p.state or "LinkUp" not in p.phys_state]
    rates = [p.rate_gbps for p in ports if p.rate_gbps]
    want = expected_gbps or max(rates, default=0.0)
    slow = [f"{p.device}/{p.port} at {p.rate_gbps:g} Gb/s" for p in ports if p.rate_gbps and p.rate_gbps < want]
    figures = {"ports_active": float(len(ports) - len(down)), "rate_gbps_min": min(rates, default=0.0)}
    layers = sorted({p.link_layer for p in ports})
    if down:
        return CheckResult("rdma-ports", "fail", f"{len(down)} of {len(ports)} RDMA ports not up: {', '.join(down)}",
                           "check cables and the switch port (`ibstat`); a down rail halves that GPU's bandwidth",
                           figures)
    if slow:
        return CheckResult("rdma-ports", "fail", f"ports below {want:g} Gb/s: {', '.join(slow)}",
                           "a link trained at a lower rate: reseat or replace the cable/transceiver", figures)
    return CheckResult("rdma-ports", "ok", f"{len(ports)} port(s) ACTIVE at {want:g} Gb/s ({', '.join(layers)})",
                       figures=figures)


def gdr_module(seams: NodeSeams, has_rdma: bool) -> CheckResult:
    modules = read_text(seams.proc_path("modules"))
    if not has_rdma:
        return CheckResult("gdr-module", "skip", "no RDMA ports: GPUDirect RDMA does not apply")
    if modules is None:
        return CheckResult("gdr-module", "skip", "cannot read /proc/modules")
    loaded = {line.split()[0] for line in modules.splitlines() if line.strip()}
    found = [name for name in GDR_MODULES if name in loaded]
    if found:
        return CheckResult("gdr-module", "ok", f"{found[0]} loaded (GPUDirect RDMA)")
    return CheckResult("gdr-module", "warn", "no nvidia_peermem module: NCCL stages network traffic through host "
                       "memory unless DMA-BUF is available", "`modprobe nvidia_peermem` (and load it at boot)")


def _interfaces(seams: NodeSeams) -> list[str]:
    root = seams.sys_path("class", "net")
    return sorted(path.name for path in root.iterdir()) if root.is_dir() else []


def _nccl_names(env: Mapping[str, str]) -> list[Finding]:
    """Unknown NCCL_* names (warning), removed ones and documented defaults (info)."""
    found = []
    for name in sorted(n for n in env if n.startswith("NCCL_")):
        value = env[name]
        if name not in NCCL_VARIABLES:
            near = nearest(name)
            where = ELSEWHERE.get(name, f"nearest NCCL variable: {near}" if near else "no NCCL variable is close")
            fix = (f"rename to TORCH_{name}" if is_pytorch_alias(name) else
                   f"remove it{f' (or did you mean {near}?)' if near else ''}")
            found.append(Finding("nccl-env-unknown", "warning", f"{name} is not an NCCL variable (not in NCCL's "
                                 f"documented environment variables): {where}", fix))
        elif name in REMOVED:
            found.append(Finding("nccl-env-removed", "info", f"{name}={value}: removed in NCCL {REMOVED[name]}, "
                                 "no effect on a current NCCL", "remove it"))
        elif is_default(name, value):
            found.append(Finding("nccl-env-default", "info", f"{name}={value} is NCCL's default (no effect)",
                                 "remove it, or keep it only to pin the value"))
    return found


def nccl_environment(seams: NodeSeams, has_rdma: bool) -> CheckResult:
    env, problems, notes = seams.environ, [], []
    if env.get("NCCL_IB_DISABLE", "0") not in ("0", "") and has_rdma:
        problems.append("NCCL_IB_DISABLE=1 on a node with RDMA ports (TCP fallback)")
    if env.get("NCCL_NET", "").lower() == "socket" and has_rdma:
        problems.append("NCCL_NET=Socket on a node with RDMA ports (TCP fallback)")
    if (ifname := env.get("NCCL_SOCKET_IFNAME")) and not ifname.startswith("^"):
        present = _interfaces(seams)
        wanted = [name for name in ifname.lstrip("=").split(",") if name]
        if present and not any(iface.startswith(name) for name in wanted for iface in present):
            problems.append(f"NCCL_SOCKET_IFNAME={ifname} matches no interface (have {', '.join(present)})")
    for name in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"):
        if env.get(name, "0") not in ("0", ""):
            notes.append(f"{name}={env[name]}")
    notes += [f"{name}={env[name]}" for name in ("NCCL_ALGO", "NCCL_PROTO") if env.get(name)]
    if env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "0":
        notes.append("TORCH_NCCL_ASYNC_ERROR_HANDLING=0 (a failed collective hangs instead of exiting)")
    names = _nccl_names(env)
    unknown = [f.message for f in names if f.severity == "warning"]
    infos = "".join(f"; {f.message}" for f in names if f.severity == "info")
    if problems:
        return CheckResult("nccl-env", "fail", "; ".join(problems + unknown) + infos,
                           "unset or correct these in the job's environment", findings=tuple(names))
    if notes or unknown:
        forced = ["forced: " + "; ".join(notes)] if notes else []
        return CheckResult("nccl-env", "warn", "; ".join(forced + unknown) + infos,
                           "; ".join(f.fix for f in names if f.severity == "warning")
                           or "unset unless a benchmark on this cluster shows they help", findings=tuple(names))
    shown = sorted(name for name in env if name.startswith("NCCL_"))
    return CheckResult("nccl-env", "ok", f"no harmful NCCL settings ({', '.join(shown) or 'none set'})" + infos,
                       findings=tuple(names))


def _hca_entries(hca: str) -> tuple[bool, bool, list[tuple[str, str | None]]]:
    """NCCL_IB_HCA as (exclude, exact, [(device, port or None)]); entries are `hca[:port[:rail[:plane]]]`."""
    exclude = hca.startswith("^")
    body = hca.removeprefix("^")
    exact = body.startswith("=")
    entries = []
    for token in body.removeprefix("=").split(","):
        device, _, rest = token.strip().partition(":")
        if device:
            entries.append((device, rest.split(":")[0] or None))
    return exclude, exact, entries


def nccl_ib_hca(seams: NodeSeams) -> CheckResult | None:
    """NCCL_IB_HCA against the node's RDMA ports: none selected (TCP fallback), some (the rest carry nothing)."""
    hca = seams.environ.get("NCCL_IB_HCA")
    if not hca:
        return None
    ports = rdma_ports(seams)
    if not ports:
        return CheckResult("nccl-ib-hca", "skip", f"NCCL_IB_HCA={hca} could not be checked: no RDMA ports visible "
                           f"under {seams.sys_path('class', 'infiniband')} (a container without the host's sysfs?)",
                           "run doctor where /sys/class/infiniband shows the node's HCAs (or pass --sysfs-root)")
    chosen = _selected(ports, hca)
    names = ", ".join(f"{p.device}/{p.port}" for p in chosen)
    figures = {"ports_selected": float(len(chosen)), "ports_present": float(len(ports))}
    if not chosen:
        return CheckResult("nccl-ib-hca", "fail", f"NCCL_IB_HCA={hca} selects none of the node's {len(ports)} RDMA "
                           "port(s): NCCL finds no IB device and falls back to TCP sockets",
                           "name the node's HCAs (`ibv_devices`), with '=' for exact names", figures)
    if len(chosen) < len(ports):
        return CheckResult("nccl-ib-hca", "warn", f"NCCL_IB_HCA={hca} selects {len(chosen)} of the node's "
                           f"{len(ports)} RDMA ports ({names}): the other {len(ports) - len(chosen)} carry no NCCL "
                           "traffic", "list every compute HCA (leave out only storage/management NICs), or unset it",
                           figures)
    return CheckResult("nccl-ib-hca", "ok", f"NCCL_IB_HCA={hca} selects all {len(ports)} RDMA ports", figures=figures)


def allocator_environment(seams: NodeSeams) -> CheckResult:
    name = "PYTORCH_CUDA_ALLOC_CONF" if "PYTORCH_CUDA_ALLOC_CONF" in seams.environ else "PYTORCH_ALLOC_CONF"
    conf = seams.environ.get(name, "")
    if not conf:
        return CheckResult("allocator-env", "ok", "PYTORCH_CUDA_ALLOC_CONF not set (default caching allocator; "
                           "expandable_segments:True reduces fragmentation on long runs)")
    pairs = [item.split(":", 1) for item in _TOP_LEVEL_COMMA.split(conf) if item.strip()]
    unknown = [pair[0] for pair in pairs if pair[0].strip() not in ALLOCATOR_KEYS or len(pair) != 2]
    if unknown:
        return CheckResult("allocator-env", "warn", f"{name}={conf}: unknown or valueless key(s) {', '.join(unknown)}",
                           "PyTorch 2.13 refuses these at the first CUDA allocation; its keys: "
                           + ", ".join(sorted(ALLOCATOR_KEYS)))
    defaults = [f"{key.strip()}:{value.strip()}" for key, value in pairs
                if ALLOCATOR_DEFAULTS.get(key.strip()) == value.strip().lower()]
    note = f" ({', '.join(defaults)} is PyTorch's default: no effect)" if defaults else ""
    return CheckResult("allocator-env", "ok", f"{name}={conf}{note}")


def memlock(seams: NodeSeams, has_rdma: bool) -> CheckResult:
    match = _MEMLOCK.search(read_text(seams.proc_path("self", "limits")) or "")
    if match is None:
        return CheckResult("memlock", "skip", "cannot read the locked-memory limit from /proc/self/limits")
    soft = match["soft"]
    if soft == "unlimited":
        return CheckResult("memlock", "ok", "locked memory: unlimited")
    limit = f"locked memory limited to {format_bytes(float(soft))}" if soft.isdigit() else f"locked memory: {soft}"
    fix = "set `ulimit -l unlimited` (limits.conf memlock, or the container's --ulimit memlock=-1)"
    return CheckResult("memlock", "fail" if has_rdma else "warn",
                       limit + (": RDMA cannot register NCCL's buffers" if has_rdma else ""), fix)


@dataclass(frozen=True, slots=True)
class DiskSpeed:
    write_bytes_per_s: float
    read_bytes_per_s: float


def disk_space(seams: NodeSeams, path: Path, need_bytes: float | None) -> CheckResult:
    if not path.is_dir():
        return CheckResult("disk-space", "fail", f"checkpoint path {path} is not a folder", "create or mount it")
    usage = seams.disk_usage(path)
    figures = {"free_bytes": float(usage.free_bytes)}
    message = f"{format_bytes(usage.free_bytes)} free of {format_bytes(usage.total_bytes)} at {path}"
    if need_bytes is not None and usage.free_bytes < need_bytes:
        return CheckResult("disk-space", "fail", f"{message}; need {format_bytes(need_bytes)}",
                           "free space or point checkpoints elsewhere", figures)
    if usage.total_bytes and usage.free_bytes < LOW_FREE_FRACTION * usage.total_bytes:
        return CheckResult("disk-space", "warn", f"{message} (under {LOW_FREE_FRACTION:.0%})",
                           "prune old checkpoints (`gpufleet ckpt prune`)", figures)
    return CheckResult("disk-space", "ok", message, figures=figures)


def disk_speed(path: Path, measure: Callable[[Path], DiskSpeed], min_write_bytes_per_s: float | None
               ) -> CheckResult:
    speed = measure(path)
    figures = {"write_bytes_per_s": speed.write_bytes_per_s, "read_bytes_per_s": speed.read_bytes_per_s}
    message = (f"write {format_bytes(speed.write_bytes_per_s)}/s (fsync'd), read "
               f"{format_bytes(speed.read_bytes_per_s)}/s at {path}")
    if min_write_bytes_per_s is not None and speed.write_bytes_per_s < min_write_bytes_per_s:
        return CheckResult("disk-speed", "fail", f"{message}; need {format_bytes(min_write_bytes_per_s)}/s",
                           "checkpoints will stall training: use a faster volume or async upload", figures)
    return CheckResult("disk-speed", "ok", message, figures=figures)


def clock_sync(seams: NodeSeams) -> CheckResult:
    result = seams.run(["timedatectl", "show", "--property=NTPSynchronized", "--value"])
    if result.found and result.returncode == 0 and result.stdout.strip() in ("yes", "no"):
        if result.stdout.strip() == "yes":
            return CheckResult("clock-sync", "ok", "system clock NTP-synchronised (timedatectl)")
        return CheckResult("clock-sync", "fail", "system clock not NTP-synchronised (timedatectl)",
                           "start chronyd or systemd-timesyncd: skewed clocks break log ordering, Slurm and "
                           "token/credential expiry")
    chrony = seams.run(["chronyc", "-n", "tracking"])
    if chrony.found and chrony.returncode == 0:
        leap = re.search(r"Leap status\s*:\s*(?P<status>.+)", chrony.stdout)
        if leap and leap["status"].strip() == "Normal":
            return CheckResult("clock-sync", "ok", "system clock synchronised (chronyc: Leap status Normal)")
        return CheckResult("clock-sync", "fail", f"chronyc: {leap['status'].strip() if leap else 'no Leap status'}",
                           "check chronyd's sources (`chronyc sources`)")
    return CheckResult("clock-sync", "skip", "neither timedatectl nor chronyc answered")
