"""Read an `NCCL_DEBUG=INFO` log (and PyTorch's NCCL watchdog lines) into what a cluster engineer checks first.

A log file is streamed (`read_nccl_log_file`): a regular file only, at most MAX_LOG_BYTES, each line cut at
MAX_LINE_BYTES, and every pattern below runs in time linear in its line, so a 20 MB single-line file reads in a
second and memory stays bounded.

NCCL prefixes every line with `host:pid:tid [cudaDev] NCCL INFO|WARN ...`; launchers often prepend their own
tags (`[rank0]:`, `[default0]:`, a timestamp), so a line is recognised wherever that prefix starts. What is
read, with the line shapes it comes from (as printed by NCCL 2.4–2.2x; see tests/data/nccl_logs/ for the
excerpts and where each was taken from):

* connections: `Channel 00/0 : 3[3] -> 4[0] [receive] via NET/IB/0/GDRDMA` (older: `Ring 00 : 15 -> 0 [receive]
  via NET/Socket/0`); `NET/Socket` is TCP, `NET/IB…` verbs (InfiniBand or RoCE), any other `NET/…` a plugin
  (EFA, …); `/GDRDMA` means GPUDirect RDMA; `P2P/…` and `SHM/…` stay inside a node;
* the network and interfaces: `Using network IB`, `NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_2:1/RoCE [RO]; OOB …`,
  `NET/Socket : Using [0]eth0:10.0.0.1<0>`, `Bootstrap : Using ibp12s0:10.149.0.32<0>`, `NET/IB : No device found.`;
* GPUDirect RDMA per HCA: `NET/IB : GPU Direct RDMA Enabled|Disabled for HCA 0 'mlx5_0'`, and per GPU and HCA:
  `GPU Direct RDMA Enabled for GPU 81000 / HCA 1 (distance 6 <= 7), read 0` (the HCA named from `NET/IB : Using`);
* the rank count: `comm 0x… rank 0 nRanks 16 nNodes 2 …`, or `ncclCommInitRank comm 0x… rank 0 nranks 32 … - Init
  START` when the log ends before the first (the largest communicator's count: the job's);
* algorithms: `Connected all rings`, `Connected all trees`, `NVLS multicast support is available on dev 4`,
  `16 coll channels, 0 collnet channels, 16 nvls channels, …`;
* the environment NCCL saw: `NCCL_IB_DISABLE set by environment to 1.`;
* PyTorch's watchdog: `[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE,
  …, Timeout(ms)=600000) ran for 600013 milliseconds before timing out.`
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

from gpufleet.errors import InputError, shorten
from gpufleet.fsio import FileTooLarge, NotARegularFile, open_regular_file
from gpufleet.units import format_bytes

Severity = Literal["error", "warning", "info"]
#: Transport kinds a connection can use, from NCCL's `via` word.
TransportKind = Literal["net-ib", "net-socket", "net-plugin", "p2p", "shm", "other"]

#: A captured number has at most this many digits (a longer one is no NCCL figure, and Python refuses to read one
#: past 4,300 digits).
_N = r"\d{1,18}"
#: Every regular expression below takes time linear in the line: each starts at a literal word or at the start of
#: the message, so that a long line of one repeated character cannot make the search quadratic.
_LEVEL = re.compile(r"\[(?P<dev>\d{1,9})\] NCCL (?P<level>INFO|WARN|ERROR) ")
_ORIGIN = re.compile(r"(?P<host>[\w.\-<>]+):(?P<pid>\d{1,18}):(?P<tid>\d{1,18}) $")
#: How far before `[dev] NCCL` the `host:pid:tid ` prefix is looked for (a host name has at most 253 characters).
_ORIGIN_CHARS = 300
_BUS = r"(?:\[[0-9a-fA-F]{1,16}\])?"
_CONNECTION = re.compile(rf"(?:Channel|Ring) (?P<channel>{_N})(?:/\d{{1,9}})? : (?P<src>{_N}){_BUS} -> "
                         rf"(?P<dst>{_N}){_BUS}(?: \[(?P<direction>send|receive)\])? via (?P<via>.+)$")
_NETWORK = re.compile(r"^Using network (?P<name>\S+)")
_NET_DEVICES = re.compile(r"^NET/(?P<net>\w+) ?: Using (?P<devices>(?:\[\d+\]\S+\s*)+)")
_DEVICE = re.compile(r"\[(?P<index>\d{1,9})\](?P<name>[^\s\[;]+)")
_BOOTSTRAP = re.compile(r"^Bootstrap ?: Using (?P<interface>\S+)")
#: `NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'` (per HCA), and per GPU and HCA pair (NCCL's
#: ncclTopoCheckGdr): `GPU Direct RDMA Enabled for GPU 81000 / HCA 1 (distance 6 <= 7), read 0` or
#: `GPU Direct RDMA Disabled for GPU 1b000 / HCA 3 (distance 9 > 4)`; some releases put `NET/IB : ` before it.
_GDR = re.compile(r"GPU Direct RDMA (?P<state>Enabled|Disabled) for (?:HCA [\d.]{1,12} '(?P<hca>[^']+)'|"
                  r"GPU (?P<gpu>[0-9a-fA-F]{1,16})(?:\[\d{1,9}\])? / HCA (?P<index>\d{1,9}))")
_CHANNEL_COUNTS = re.compile(rf"(?P<coll>{_N}) coll channels, (?:(?P<collnet>{_N}) collnet channels, )?"
                             rf"(?:(?P<nvls>{_N}) nvls channels, )?")
_ENV = re.compile(r"^(?P<name>NCCL_\w+) set by environment to (?P<value>.*)$")
_VERSION = re.compile(r"NCCL version (?P<version>\d{1,9}\.\d{1,9}\.\d{1,9}\S*)")
_COMM = re.compile(rf"nRanks (?P<nranks>{_N}) nNodes (?P<nnodes>{_N})")
#: `ncclCommInitRank comm 0x… rank 0 nranks 32 cudaDev 0 nvmlDev 0 busId 18000 commId 0x… - Init START` (and
#: `Init COMPLETE`, `ncclCommSplit …`, `Init timings - ncclCommInitRank: rank 0 nranks 32 …`): NCCL's init.cc.
_INIT_RANKS = re.compile(rf"\brank {_N} nranks (?P<nranks>{_N})\b")
_WATCHDOG = re.compile(rf"\[Rank (?P<rank>{_N})\] Watchdog caught collective operation timeout: WorkNCCL\("
                       rf"SeqNum=(?P<seq>{_N}), OpType=(?P<op>\w+).*?Timeout\(ms\)=(?P<timeout_ms>{_N})\) ran for "
                       rf"(?P<ran_ms>{_N}) milliseconds")
#: The most distinct connections and WARN messages kept (judgement: a 16,384-GPU job's start-up logs about a million
#: connections; past these, a hostile or looping log cannot grow memory without bound).
MAX_CONNECTIONS = 2_000_000
MAX_WARNINGS = 1_000
#: Interface name prefixes of virtual devices, never the data network between nodes (judgement: docker/podman
#: bridges, veth pairs, libvirt bridges, CNI overlays); the loopback `lo` is matched by name.
VIRTUAL_INTERFACE_PREFIXES = ("docker", "veth", "virbr", "br-", "cni", "flannel")


@dataclass(frozen=True, slots=True)
class Connection:
    """One channel's link between two ranks as NCCL set it up."""

    host: str
    channel: int
    src_rank: int
    dst_rank: int
    direction: str  # send, receive, or "" for intra-node links
    via: str  # NCCL's own words: NET/IB/0/GDRDMA, P2P/CUMEM/read, NET/Socket/1
    kind: TransportKind
    gdr: bool


@dataclass(frozen=True, slots=True)
class PeerLink:
    """The transport between two ranks and how many channel connections (send and receive sides) use it."""

    src_rank: int
    dst_rank: int
    via: str
    kind: TransportKind
    channels: int


@dataclass(frozen=True, slots=True)
class WatchdogTimeout:
    """A collective that PyTorch's NCCL watchdog gave up on."""

    rank: int
    seq: int
    op: str
    timeout_ms: int
    ran_ms: int


@dataclass(frozen=True, slots=True)
class Finding:
    """Something to act on: a stable `id` for scripts, what was seen, and what to change."""

    id: str
    severity: Severity
    message: str
    fix: str


@dataclass(frozen=True, slots=True)
class NcclLogSummary:
    """What the log says NCCL did."""

    nccl_lines: int
    version: str | None
    hosts: tuple[str, ...]
    ranks: int | None
    nodes: int | None
    networks: tuple[str, ...]  # `Using network X`: IB, Socket, a plugin's name
    net_devices: tuple[str, ...]  # NET/IB or NET/Socket devices: mlx5_0:1/IB, eth0:10.0.0.1<0>
    bootstrap_interfaces: tuple[str, ...]
    environment: dict[str, str]
    connections: tuple[Connection, ...]
    gdr_enabled_hcas: tuple[str, ...]
    gdr_disabled_hcas: tuple[str, ...]
    rings: bool
    trees: bool
    nvls_available: bool
    nvls_channels: int | None
    collnet_channels: int | None
    no_ib_device: bool
    timeouts: tuple[WatchdogTimeout, ...]
    warnings: tuple[str, ...]

    def transport_counts(self) -> dict[str, int]:
        """Connections per transport kind (each channel and direction counted once)."""
        return dict(Counter(connection.kind for connection in self.connections))

    def links(self) -> list[PeerLink]:
        """The connections grouped by rank pair and transport, with how many channels use each."""
        channels: Counter[tuple[int, int, str, TransportKind]] = Counter()
        for connection in self.connections:
            channels[(connection.src_rank, connection.dst_rank, connection.via, connection.kind)] += 1
        return [PeerLink(src, dst, via, kind, count) for (src, dst, via, kind), count in sorted(channels.items())]


@dataclass(frozen=True, slots=True)
class NcclLogReport:
    summary: NcclLogSummary
    findings: tuple[Finding, ...]

    @property
    def failed(self) -> tuple[Finding, ...]:
        return tuple(finding for finding in self.findings if finding.severity == "error")


def transport_kind(via: str) -> TransportKind:
    """NCCL's `via` word as a kind: NET/Socket is TCP, NET/IB… verbs, other NET/… a plugin (EFA, …)."""
    head = via.split("/", 2)
    if head[0] == "NET" and len(head) > 1:
        if head[1].startswith("Socket"):
            return "net-socket"
        return "net-ib" if head[1].startswith("IB") else "net-plugin"
    if head[0] == "P2P" or via.startswith("direct pointer"):
        return "p2p"
    if head[0] == "SHM" or "shared memory" in via:
        return "shm"
    return "other"


@dataclass
class _Builder:
    """Mutable state of one pass over the log; frozen into an NcclLogSummary at the end."""

    nccl_lines: int = 0
    version: str | None = None
    hosts: dict[str, None] = field(default_factory=dict)
    ranks: int | None = None
    nodes: int | None = None
    networks: dict[str, None] = field(default_factory=dict)
    net_devices: dict[str, None] = field(default_factory=dict)
    hca_names: dict[str, str] = field(default_factory=dict)  # NET/IB's device index -> name: "0" -> "mlx5_0"
    bootstrap: dict[str, None] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)
    connections: dict[Connection, None] = field(default_factory=dict)
    gdr_on: dict[str, None] = field(default_factory=dict)
    gdr_off: dict[str, None] = field(default_factory=dict)
    gdr_pairs: list[tuple[bool, str, str]] = field(default_factory=list)  # (enabled, GPU bus id, HCA index)
    rings: bool = False
    trees: bool = False
    nvls_available: bool = False
    nvls_channels: int | None = None
    collnet_channels: int | None = None
    no_ib_device: bool = False
    timeouts: dict[WatchdogTimeout, None] = field(default_factory=dict)
    warnings: dict[str, None] = field(default_factory=dict)

    def read_message(self, host: str, level: str, message: str) -> None:
        """One NCCL message (the text after `NCCL INFO `)."""
        if level != "INFO":
            if len(self.warnings) < MAX_WARNINGS:
                self.warnings[re.sub(r"0x[0-9a-f]+", "0x…", message.strip())] = None
            return
        if " via " in message and (match := _CONNECTION.search(message)) is not None:
            self._read_connection(host, match)
        elif (match := _NETWORK.search(message)) is not None:
            self.networks[match["name"]] = None
        elif (match := _NET_DEVICES.search(message)) is not None:
            for device in _DEVICE.finditer(match["devices"]):
                self.net_devices[device["name"]] = None
                if match["net"] != "Socket":
                    self.hca_names.setdefault(device["index"], device["name"].split(":", 1)[0])
        elif (match := _BOOTSTRAP.search(message)) is not None:
            self.bootstrap[match["interface"]] = None
        elif "GPU Direct RDMA" in message and (match := _GDR.search(message)) is not None:
            self._read_gdr(message[:match.start()], match)
        elif (match := _ENV.search(message)) is not None:
            value = match["value"].rstrip()
            self.environment[match["name"]] = value.removesuffix(".").strip()
        else:
            self._read_topology(message)

    def _read_connection(self, host: str, match: re.Match[str]) -> None:
        if len(self.connections) >= MAX_CONNECTIONS:
            return
        via = match["via"].strip()
        self.connections[Connection(host, int(match["channel"]), int(match["src"]), int(match["dst"]),
                                    match["direction"] or "", via, transport_kind(via), "GDRDMA" in via)] = None

    def _read_gdr(self, before: str, match: re.Match[str]) -> None:
        """A GPU Direct RDMA line, per HCA or per GPU and HCA pair (TCP has no RDMA to enable: NCCL prints the line
        for every net, NET/Socket's is not an HCA)."""
        if before.strip().removeprefix("NET/").rstrip(": ").strip() == "Socket":
            return
        if match["hca"] is not None:
            (self.gdr_on if match["state"] == "Enabled" else self.gdr_off)[match["hca"]] = None
        elif len(self.gdr_pairs) < MAX_WARNINGS:
            self.gdr_pairs.append((match["state"] == "Enabled", match["gpu"], match["index"]))

    def _read_topology(self, message: str) -> None:
        if "Connected all rings" in message:
            self.rings = True
        elif "Connected all trees" in message:
            self.trees = True
        elif "NVLS multicast support is available" in message:
            self.nvls_available = True
        elif "NET/IB : No device found" in message:
            self.no_ib_device = True
        elif "coll channels" in message and (match := _CHANNEL_COUNTS.search(message)) is not None:
            if match["nvls"] is not None:
                self.nvls_channels = max(self.nvls_channels or 0, int(match["nvls"]))
            if match["collnet"] is not None:
                self.collnet_channels = max(self.collnet_channels or 0, int(match["collnet"]))
        elif "nRanks" in message and (match := _COMM.search(message)) is not None:
            # several communicators (the world's, each TP or DP group's): the largest is the job's
            self.ranks = max(self.ranks or 0, int(match["nranks"]))
            self.nodes = max(self.nodes or 0, int(match["nnodes"]))
        elif "nranks" in message and (match := _INIT_RANKS.search(message)) is not None:
            self.ranks = max(self.ranks or 0, int(match["nranks"]))

    def read_line(self, line: str) -> None:
        if "NCCL" not in line and "Watchdog" not in line:
            return
        if "NCCL version" in line and (match := _VERSION.search(line)) is not None:
            self.version = self.version or match["version"]
        if "Watchdog caught" in line and (match := _WATCHDOG.search(line)) is not None:
            self.timeouts[WatchdogTimeout(int(match["rank"]), int(match["seq"]), match["op"],
                                          int(match["timeout_ms"]), int(match["ran_ms"]))] = None
        for level in _LEVEL.finditer(line):
            origin = _ORIGIN.search(line, max(level.start() - _ORIGIN_CHARS, 0), level.start())
            if origin is not None:
                self.nccl_lines += 1
                self.hosts[origin["host"]] = None
                self.read_message(origin["host"], level["level"], line[level.end():])
                return

    def _gdr_by_hca(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The HCAs with GPU Direct RDMA on, and those off (per GPU where a GPU and HCA pair says so)."""
        on, off = dict(self.gdr_on), dict(self.gdr_off)
        for enabled, gpu, index in self.gdr_pairs:
            name = self.hca_names.get(index, f"HCA {index}")
            if enabled:
                on[name] = None
            else:
                off[f"{name} (GPU {gpu})"] = None
        return tuple(on), tuple(off)

    def freeze(self) -> NcclLogSummary:
        gdr_on, gdr_off = self._gdr_by_hca()
        return NcclLogSummary(
            nccl_lines=self.nccl_lines, version=self.version, hosts=tuple(self.hosts), ranks=self.ranks,
            nodes=self.nodes, networks=tuple(self.networks), net_devices=tuple(self.net_devices),
            bootstrap_interfaces=tuple(self.bootstrap), environment=dict(self.environment),
            connections=tuple(self.connections), gdr_enabled_hcas=gdr_on, gdr_disabled_hcas=gdr_off,
            rings=self.rings, trees=self.trees, nvls_available=self.nvls_available, nvls_channels=self.nvls_channels,
            collnet_channels=self.collnet_channels, no_ib_device=self.no_ib_device,
            timeouts=tuple(self.timeouts), warnings=tuple(self.warnings))


def summarize(lines: Iterable[str]) -> NcclLogSummary:
    """One pass over the log's lines."""
    builder = _Builder()
    for line in lines:
        builder.read_line(line.rstrip("\r\n"))
    return builder.freeze()


def _checked(summary: NcclLogSummary, source: str) -> NcclLogReport:
    from gpufleet.runtime.doctor.nccl_findings import findings_for

    if summary.nccl_lines == 0 and not summary.timeouts:
        raise InputError(f"{source} holds no NCCL log line (expected NCCL_DEBUG=INFO output such as "
                         "'host:1234:1300 [0] NCCL INFO Using network IB'); run with NCCL_DEBUG=INFO")
    return NcclLogReport(summary, findings_for(summary))


def read_nccl_log(text: str, source: str = "the log") -> NcclLogReport:
    """The summary and findings of a log; InputError when it holds no NCCL line and no watchdog line."""
    return _checked(summarize(text.splitlines()), source)


#: The longest line read whole, in bytes (judgement: NCCL's longest lines, the device list of a node with 18 HCAs,
#: are under 1 KB); the rest of a longer line is skipped unread by the parser, so a log of one 20 MB line reads in
#: a second.
MAX_LINE_BYTES = 8192
#: The largest log read (judgement: NCCL_DEBUG=INFO from the start of a 16,384-GPU job is about 2 GB; a bigger file
#: is refused before it is read, with how to cut it down).
MAX_LOG_BYTES = 4 * 2**30
_CHUNK_BYTES = 2**20


def _log_lines(handle: BinaryIO, path: Path, max_bytes: int) -> Iterator[bytes]:
    """The lines of an open log, each cut at MAX_LINE_BYTES, read in chunks: memory stays bounded whatever the file
    holds; FileTooLarge if it grows past `max_bytes` while read."""
    head = b""  # the start of the line the last chunk ended in
    total = 0
    while chunk := handle.read(_CHUNK_BYTES):
        total += len(chunk)
        if total > max_bytes:
            raise FileTooLarge(path, total, max_bytes, grew=True)
        *complete, rest = chunk.split(b"\n")
        for piece in complete:
            yield (head + piece[:MAX_LINE_BYTES])[:MAX_LINE_BYTES]
            head = b""
        head = (head + rest[:MAX_LINE_BYTES])[:MAX_LINE_BYTES]
    if head:
        yield head


def _relevant(lines: Iterable[bytes]) -> Iterator[str]:
    """The lines that may hold an NCCL message or a watchdog timeout, as text (a bad byte becomes U+FFFD)."""
    for line in lines:
        if b"NCCL" in line or b"Watchdog" in line:
            yield line.decode("utf-8", errors="replace")


def read_nccl_log_file(path: Path, max_bytes: int = MAX_LOG_BYTES) -> NcclLogReport:
    """The summary and findings of the log at `path`, streamed; one-line InputError unless it is a regular file
    (never a pipe, a device, a folder or a /proc file such as /proc/kmsg: refused unread, without blocking) of at
    most `max_bytes` that holds an NCCL or watchdog line."""
    from gpufleet.input_files import describe_os_error

    what = f"log {shorten(str(path))}"
    fix = "give the job's NCCL_DEBUG=INFO log file"
    try:
        with open_regular_file(path, max_bytes) as handle:
            return _checked(summarize(_relevant(_log_lines(handle, path, max_bytes))), what)
    except ValueError as problem:  # a NUL character in the name
        if isinstance(problem, InputError):
            raise
        raise InputError(f"{shorten(repr(str(path)))} is not a file name (it holds a NUL character)") from None
    except NotARegularFile as problem:
        raise InputError(f"{what} is {problem.kind}, not a regular file; {fix}") from None
    except FileTooLarge as problem:
        size = "grew past" if problem.grew else f"is {format_bytes(problem.size_bytes)}, more than"
        raise InputError(f"{what} {size} the {format_bytes(max_bytes)} read; keep NCCL's lines and the watchdog's "
                         f"(grep -E ' NCCL |Watchdog' {shorten(str(path))} > nccl.log) and read that") from None
    except OSError as problem:
        raise InputError(f"{what} {describe_os_error(path, problem)}") from None
