"""Node checks outside the GPU: RDMA ports (/sys/class/infiniband), GPUDirect RDMA module (/proc/modules), NCCL and
PyTorch allocator environment, memlock limit (/proc/self/limits), checkpoint disk, clock sync.

sysfs layout read: `/sys/class/infiniband/DEV/ports/N/{state,phys_state,rate,link_layer}` (kernel ABI
Documentation/ABI/stable/sysfs-class-infiniband: state "4: ACTIVE", phys_state "5: LinkUp", rate
"400 Gb/sec (4X NDR)"); `/sys/class/net/IFACE` for NCCL_SOCKET_IFNAME.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.runtime.doctor.checks import CheckResult
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
    """The ports NCCL_IB_HCA selects (prefix match; `^a,b` excludes; `=a` exact), else every port."""
    if not hca:
        return ports
    exclude, exact = hca.startswith("^"), hca.lstrip("^").startswith("=")
    names = [name.split(":")[0] for name in hca.lstrip("^=").split(",") if name]

    def matches(port: RdmaPort) -> bool:
        return any(port.device == name if exact else port.device.startswith(name) for name in names)

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
    if problems:
        return CheckResult("nccl-env", "fail", "; ".join(problems), "unset or correct these in the job's environment")
    if notes:
        return CheckResult("nccl-env", "warn", "forced: " + "; ".join(notes),
                           "unset unless a benchmark on this cluster shows they help")
    shown = sorted(name for name in env if name.startswith("NCCL_"))
    return CheckResult("nccl-env", "ok", f"no harmful NCCL settings ({', '.join(shown) or 'none set'})")


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
    return CheckResult("allocator-env", "ok", f"{name}={conf}")


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
