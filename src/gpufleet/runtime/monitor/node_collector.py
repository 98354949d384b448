"""Per-node families: InfiniBand / RoCE port state and counters from sysfs, and free space of checkpoint folders.

`sysfs_root` is injectable (tests point it at a fake tree). The kernel's IB counters live at
`/sys/class/infiniband/DEVICE/ports/PORT/`; `port_xmit_data` and `port_rcv_data` count 4-octet words (source:
IBTA spec vol. 1, PortCounters; Linux Documentation/ABI/stable/sysfs-class-infiniband).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufleet.runtime.checkpoint.names import parse_step

IB_LABELS = ("device", "port", "link_layer", "hostname")
WORD_BYTES = 4
GBIT_BYTES_PER_S = 1e9 / 8
#: counter file -> (metric suffix, help, multiplier to base units)
IB_COUNTERS: dict[str, tuple[str, str, float]] = {
    "port_xmit_data": ("transmit_bytes", "Data sent by the port.", WORD_BYTES),
    "port_rcv_data": ("receive_bytes", "Data received by the port.", WORD_BYTES),
    "link_downed": ("link_downed", "Times the link went down (a flap).", 1),
    "link_error_recovery": ("link_error_recovery", "Link error recoveries.", 1),
    "symbol_error": ("symbol_errors", "Symbol errors on the link (a bad cable or transceiver).", 1),
    "port_rcv_errors": ("receive_errors", "Packets received with errors.", 1),
    "port_xmit_discards": ("transmit_discards", "Packets dropped on send (congestion or a down link).", 1),
}
ACTIVE_STATE = 4  # "4: ACTIVE" (IBTA port state)


@dataclass(frozen=True)
class IbPort:
    device: str
    port: str
    link_layer: str
    active: bool
    rate_bytes_per_s: float | None
    counters: dict[str, float]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _rate(text: str | None) -> float | None:
    """'400 Gb/sec (4X NDR)' -> bytes per second."""
    try:
        return float((text or "").split()[0]) * GBIT_BYTES_PER_S
    except (ValueError, IndexError):
        return None


def read_ib_ports(sysfs_root: Path) -> list[IbPort]:
    """Every port of every RDMA device under `sysfs_root/class/infiniband` (none when the folder is absent)."""
    base = sysfs_root / "class" / "infiniband"
    ports = []
    for device in sorted(base.iterdir()) if base.is_dir() else []:
        for port in sorted((device / "ports").iterdir()) if (device / "ports").is_dir() else []:
            state = _read(port / "state") or ""
            counters = {}
            for name, (_, _, scale) in IB_COUNTERS.items():
                raw = _read(port / "counters" / name)
                if raw is not None and raw.isdigit():
                    counters[name] = int(raw) * scale
            ports.append(IbPort(device.name, port.name, _read(port / "link_layer") or "unknown",
                                state.split(":")[0].strip() == str(ACTIVE_STATE), _rate(_read(port / "rate")),
                                counters))
    return ports


def newest_checkpoint_mtime(folder: Path) -> float | None:
    """The modification time of the newest committed `step_…` folder in `folder`, or None."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return None
    times = [entry.stat().st_mtime for entry in entries if parse_step(entry.name) is not None and entry.is_dir()]
    return max(times) if times else None


class NodeCollector(Collector):
    """IB/RoCE ports and checkpoint folders of this node."""

    def __init__(self, hostname: str, sysfs_root: Path = Path("/sys"), checkpoint_dirs: tuple[Path, ...] = ()) -> None:
        self.hostname = hostname
        self.sysfs_root = sysfs_root
        self.checkpoint_dirs = checkpoint_dirs

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._ib()
        yield from self._checkpoints()

    def _ib(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("gpufleet_ib_port_up", "1 when the InfiniBand/RoCE port state is ACTIVE.",
                               labels=IB_LABELS)
        rate = GaugeMetricFamily("gpufleet_ib_port_rate_bytes_per_second", "Negotiated port rate.", labels=IB_LABELS)
        counters = {name: CounterMetricFamily(f"gpufleet_ib_port_{suffix}", text, labels=IB_LABELS)
                    for name, (suffix, text, _) in IB_COUNTERS.items()}
        for port in read_ib_ports(self.sysfs_root):
            labels = [port.device, port.port, port.link_layer, self.hostname]
            up.add_metric(labels, float(port.active))
            if port.rate_bytes_per_s is not None:
                rate.add_metric(labels, port.rate_bytes_per_s)
            for name, value in port.counters.items():
                counters[name].add_metric(labels, value)
        yield up
        yield rate
        yield from counters.values()

    def _checkpoints(self) -> Iterator[Metric]:
        free = GaugeMetricFamily("gpufleet_checkpoint_free_bytes", "Free space (for unprivileged users) of the file "
                                 "system holding the checkpoint folder.", labels=("path", "hostname"))
        age = GaugeMetricFamily("gpufleet_checkpoint_last_timestamp_seconds", "Modification time (Unix seconds) of "
                                "the newest committed step_… checkpoint in the folder.", labels=("path", "hostname"))
        for folder in self.checkpoint_dirs:
            labels = [str(folder), self.hostname]
            try:
                stats = os.statvfs(folder)
            except OSError:
                continue
            free.add_metric(labels, float(stats.f_bavail * stats.f_frsize))
            newest = newest_checkpoint_mtime(folder)
            if newest is not None:
                age.add_metric(labels, newest)
        yield free
        yield age
