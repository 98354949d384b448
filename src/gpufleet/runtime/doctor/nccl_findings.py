"""Findings from an NCCL log summary: each with a stable `id`, what was seen and what to change.

The rules are the failure modes cluster teams report most (NVIDIA/nccl and pytorch issue threads): a job that
silently runs over TCP, GPUDirect RDMA off, the bootstrap on a loopback or container bridge, NVLS present but
unused, NCCL settings forced from the environment, P2P replaced by host shared memory, and collectives that the
PyTorch watchdog timed out.
"""

from __future__ import annotations

from collections import defaultdict

from gpufleet.runtime.doctor.nccl_log import VIRTUAL_INTERFACE_PREFIXES, Finding, NcclLogSummary, Severity

#: How many distinct NCCL WARN messages are quoted one by one before the rest are counted.
MAX_QUOTED_WARNINGS = 5


#: The most GPUs one host holds (judgement: DGX-2 and HGX-2 hold 16, today's HGX boards 8): a job of more ranks
#: spans nodes even when its log ends before NCCL says how many.
MAX_GPUS_PER_HOST = 16


def _multi_node(summary: NcclLogSummary) -> bool:
    return (summary.nodes or 0) > 1 or len(summary.hosts) > 1 or (summary.ranks or 0) > MAX_GPUS_PER_HOST


def _why_no_ib(summary: NcclLogSummary) -> str:
    env = summary.environment
    if env.get("NCCL_IB_DISABLE", "0").strip() not in ("0", ""):
        return f"NCCL_IB_DISABLE is {env['NCCL_IB_DISABLE']} in the job's environment: unset it"
    if env.get("NCCL_NET", "").lower() == "socket":
        return "NCCL_NET=Socket is set in the job's environment: unset it"
    if summary.no_ib_device:
        return ("NCCL found no IB device: check that `ibv_devinfo` lists the HCAs as PORT_ACTIVE, that /dev/infiniband "
                "is mounted into the container and libibverbs is installed (on AWS EFA: install aws-ofi-nccl)")
    return ("check that the HCAs are visible (`ibv_devinfo`), NCCL_IB_HCA names them, and no NCCL_IB_DISABLE/NCCL_NET "
            "override is set")


def tcp_fallback(summary: NcclLogSummary) -> list[Finding]:
    counts = summary.transport_counts()
    socket = counts.get("net-socket", 0)
    network = socket + counts.get("net-ib", 0) + counts.get("net-plugin", 0)
    severity: Severity = "error"
    if socket:
        seen = f"{socket} of {network} network connections use NET/Socket (TCP through the kernel, not RDMA)"
    elif "Socket" in summary.networks and _multi_node(summary):
        ranks = f" of {summary.ranks} ranks" if summary.ranks else ""
        cut = " (the log ends before its connection lines)" if not summary.connections else ""
        seen = f"NCCL chose `Using network Socket` for a job{ranks} that spans nodes{cut} (TCP, not RDMA)"
    elif "Socket" in summary.networks and not summary.connections and summary.nodes is None:
        severity = "warning"
        seen = ("NCCL chose `Using network Socket` (TCP, not RDMA) and the log ends before its connection lines and "
                "node count: if the job spans nodes, it runs over TCP")
    else:
        return []
    return [Finding("tcp-fallback", severity, seen + ": expect a fraction of the fabric's bandwidth",
                    _why_no_ib(summary))]


def gdr(summary: NcclLogSummary) -> list[Finding]:
    ib = [connection for connection in summary.connections if connection.kind in ("net-ib", "net-plugin")]
    without = [connection for connection in ib if not connection.gdr]
    if not without and not summary.gdr_disabled_hcas:
        return []
    parts = []
    if without:
        parts.append(f"{len(without)} of {len(ib)} RDMA connections lack /GDRDMA (data is staged through host memory)")
    if summary.gdr_disabled_hcas:
        parts.append(f"GPU Direct RDMA disabled for {', '.join(summary.gdr_disabled_hcas)}")
    level = summary.environment.get("NCCL_NET_GDR_LEVEL")
    fix = ("load the nvidia_peermem kernel module (or use DMA-BUF with a recent driver and kernel); "
           "`gpufleet doctor` checks it; disable PCIe ACS on the switches between GPU and NIC")
    if level is not None:
        fix = f"NCCL_NET_GDR_LEVEL is {level}: unset it or raise it to PHB/SYS; " + fix
    return [Finding("no-gdrdma", "warning", "; ".join(parts), fix)]


def interfaces(summary: NcclLogSummary) -> list[Finding]:
    chosen = [*summary.bootstrap_interfaces,
              *(device for device in summary.net_devices if "<" in device)]  # NET/Socket devices carry <n>
    def interface(name: str) -> str:
        return name.split(":", 1)[0]

    virtual = sorted({name for name in chosen
                      if interface(name) == "lo" or interface(name).startswith(VIRTUAL_INTERFACE_PREFIXES)})
    if not virtual:
        return []
    loopback = any(interface(name) == "lo" for name in virtual)
    severity: Severity = "error" if loopback and _multi_node(summary) else "warning"
    return [Finding("virtual-interface", severity,
                    f"NCCL uses a loopback or virtual interface: {', '.join(virtual)}",
                    "set NCCL_SOCKET_IFNAME to the data network's interface (e.g. NCCL_SOCKET_IFNAME=ib0, or "
                    "=^docker,lo to exclude bridges and loopback)")]


def nvls(summary: NcclLogSummary) -> list[Finding]:
    if not summary.nvls_available or summary.nvls_channels != 0:
        return []
    fix = "check NCCL_ALGO does not exclude NVLS, the NVSwitch fabric manager is running and CUDA driver ≥ 530"
    if summary.environment.get("NCCL_NVLS_ENABLE") == "0":
        fix = "NCCL_NVLS_ENABLE=0 is set in the job's environment: unset it"
    return [Finding("nvls-unused", "warning",
                    "NVLS (NVSwitch multicast) is available but NCCL built 0 NVLS channels", fix)]


def forced_settings(summary: NcclLogSummary) -> list[Finding]:
    forced = {name: value for name, value in summary.environment.items()
              if name in ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS")}
    if not forced:
        return []
    listing = ", ".join(f"{name}={value}" for name, value in forced.items())
    return [Finding("forced-tuning", "info", f"NCCL's tuning is forced from the environment: {listing}",
                    "unset these unless a benchmark on this cluster (`gpufleet bench collectives`) shows they help: "
                    "NCCL picks ring, tree or NVLS per size on its own")]


def shared_memory(summary: NcclLogSummary) -> list[Finding]:
    shm = [connection for connection in summary.connections if connection.kind == "shm"]
    if not shm:
        return []
    fix = ("GPUs on one node talk through host memory instead of NVLink/PCIe P2P: check `nvidia-smi topo -m`, "
           "PCIe ACS and IOMMU settings")
    if summary.environment.get("NCCL_P2P_DISABLE", "0") not in ("0", ""):
        fix = "NCCL_P2P_DISABLE is set in the job's environment: unset it"
    return [Finding("intra-node-shm", "warning", f"{len(shm)} intra-node connections use SHM, not P2P", fix)]


def timeouts(summary: NcclLogSummary) -> list[Finding]:
    by_op: dict[tuple[int, str], list[int]] = defaultdict(list)
    for timeout in summary.timeouts:
        by_op[(timeout.seq, timeout.op)].append(timeout.rank)
    findings = []
    for (seq, op), ranks in sorted(by_op.items()):
        limit_s = max(t.timeout_ms for t in summary.timeouts if (t.seq, t.op) == (seq, op)) / 1000
        findings.append(Finding(
            "watchdog-timeout", "error",
            f"{op} #{seq} timed out after {limit_s:g} s on rank(s) {', '.join(map(str, sorted(set(ranks))))}",
            "a rank never entered this collective (crashed, hung, or diverged in control flow): find the rank whose "
            "log stops before it; set TORCH_NCCL_DUMP_ON_TIMEOUT=1 to dump the flight recorder; a longer timeout "
            "only hides the hang"))
    return findings


def nccl_warnings(summary: NcclLogSummary) -> list[Finding]:
    quoted = summary.warnings[:MAX_QUOTED_WARNINGS]
    findings = [Finding("nccl-warn", "warning", f"NCCL WARN {text}", "read the line's context in the log")
                for text in quoted]
    if len(summary.warnings) > len(quoted):
        findings.append(Finding("nccl-warn", "warning",
                                f"{len(summary.warnings) - len(quoted)} more distinct NCCL WARN lines",
                                "read them in the log"))
    return findings


RULES = (tcp_fallback, gdr, interfaces, nvls, forced_settings, shared_memory, timeouts, nccl_warnings)


def findings_for(summary: NcclLogSummary) -> tuple[Finding, ...]:
    """Every rule's findings, errors first."""
    order = {"error": 0, "warning": 1, "info": 2}
    found = [finding for rule in RULES for finding in rule(summary)]
    return tuple(sorted(found, key=lambda finding: order[finding.severity]))
