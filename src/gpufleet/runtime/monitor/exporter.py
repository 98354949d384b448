"""The node exporter: a registry of the GPU and node collectors served over HTTP on a loopback port by default.

Never imports torch. One exporter per node; the training ranks serve their own StepMonitor series (per-rank
ports, see step_monitor.py).
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import start_http_server

from gpufleet.errors import InputError
from gpufleet.runtime.monitor.gpu_collector import GpuCollector
from gpufleet.runtime.monitor.node_collector import NodeCollector
from gpufleet.runtime.monitor.nvml import NvmlReader
from gpufleet.runtime.monitor.plan_target import PlanTarget, plan_collector

DEFAULT_HOST = "127.0.0.1"
#: Judgement: the next free port after dcgm-exporter's 9400 (source: dcgm-exporter docs, "default listener :9400").
DEFAULT_PORT = 9401


class ExporterError(InputError):
    """The exporter cannot start: a bad address, a port in use, no NVML."""


@dataclass(frozen=True)
class ExporterConfig:
    """What `gpufleet exporter` serves; the CLI and the Python API build the same object."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    fake_gpus: int | None = None
    fake_events: tuple[str, ...] = ()
    checkpoint_dirs: tuple[Path, ...] = ()
    sysfs_root: Path = Path("/sys")
    plan: PlanTarget | None = None
    hostname: str = field(default_factory=socket.gethostname)

    def __post_init__(self) -> None:
        if self.fake_events and self.fake_gpus is None:
            raise InputError("--fake-event needs --fake-gpus N (faults are injected into simulated GPUs only)")
        for folder in self.checkpoint_dirs:
            if not folder.is_dir():
                raise InputError(f"--checkpoint-dir {folder} is not a folder")


def check_duration_s(duration: float | None) -> float | None:
    """How long to serve (None: until stopped), refused unless positive."""
    if duration is not None and duration <= 0:
        raise InputError(f"--duration must be a positive number of seconds, got {duration}")
    return duration


def parse_listen(text: str) -> tuple[str, int]:
    """`ADDR:PORT` or `:PORT` (loopback) or `[v6]:PORT` -> (host, port), refusing anything else in one line."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ExporterError(f"--listen must be ADDR:PORT with a port in 1..65535 (as in 127.0.0.1:9401), got {text!r}")
    return host.strip("[]") or DEFAULT_HOST, int(port_text)


def open_reader(config: ExporterConfig) -> NvmlReader:
    """The real NVML (pynvml) or, with fake_gpus, the simulated one with its faults injected."""
    import pynvml

    if config.fake_gpus is not None:
        from gpufleet.runtime.monitor.fake_nvml import FakeNvml

        fake = FakeNvml(config.fake_gpus)
        for event in config.fake_events:
            fake.inject(event)
        return NvmlReader(fake)
    try:
        return NvmlReader(pynvml)
    except pynvml.NVMLError as error:
        raise ExporterError(f"cannot open NVML ({error}): no NVIDIA driver here? Use --fake-gpus N to serve "
                            "simulated GPUs") from None


def build_registry(config: ExporterConfig, reader: NvmlReader) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(reader, config.hostname))
    registry.register(NodeCollector(config.hostname, config.sysfs_root, config.checkpoint_dirs))
    if config.plan is not None:
        registry.register(plan_collector(config.plan))
    return registry


def scrape(registry: CollectorRegistry) -> str:
    """One scrape in the Prometheus text format (what GET /metrics returns)."""
    return generate_latest(registry).decode()


def serve(config: ExporterConfig, registry: CollectorRegistry) -> Any:
    """Start serving /metrics on a daemon thread; returns the server (call `.shutdown()` to stop)."""
    try:
        server, _thread = start_http_server(config.port, addr=config.host, registry=registry)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise ExporterError(f"port {config.port} on {config.host} is in use; pick another with --listen "
                                f"{config.host}:PORT") from None
        raise ExporterError(f"cannot listen on {config.host}:{config.port}: {error.strerror or error}") from None
    return server
