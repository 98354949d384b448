"""`gpufleet exporter`: serve per-GPU (NVML) and per-node (InfiniBand, checkpoint disk) metrics for Prometheus."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gpufleet.runtime.monitor.exporter import ExporterConfig

ListenOption = typer.Option("127.0.0.1:9401", "--listen", help="ADDR:PORT to serve /metrics on (loopback unless "
                            "told otherwise; 0.0.0.0:9401 for every interface).")
FakeGpusOption = typer.Option(None, "--fake-gpus", help="Serve N simulated GPUs instead of NVML (no GPU needed).")
FakeEventOption = typer.Option(None, "--fake-event", help="With --fake-gpus: inject GPU:KIND[=VALUE], e.g. "
                               "2:hw_thermal, 0:ecc_uncorrected=3, 5:xid=79, 1:nvlink_down=4, 3:fail (repeatable).")
CheckpointDirOption = typer.Option(None, "--checkpoint-dir", help="A checkpoint folder whose free space and newest "
                                   "step_… are exported (repeatable).")
PlanOption = typer.Option(None, "--plan", help="plan.json from `gpufleet plan --json`: its step time, tokens/s "
                          "per GPU and MFU are exported for the step-time-above-plan alert.")
PlanIndexOption = typer.Option(0, "--plan-index", help="Which plan in the file (0 = the best).")
SysfsOption = typer.Option(Path("/sys"), "--sysfs-root", help="Where sysfs is (InfiniBand counters).")
OnceOption = typer.Option(False, "--once", help="Print one scrape to stdout and exit (for promtool or a look).")
DurationOption = typer.Option(None, "--duration", help="Stop after this many seconds (default: serve until "
                              "interrupted).")


def register(app: typer.Typer) -> None:
    @app.command("exporter")
    def exporter(listen: str = ListenOption, fake_gpus: int = FakeGpusOption, fake_event: list[str] = FakeEventOption,
                 checkpoint_dir: list[Path] = CheckpointDirOption, plan: Path = PlanOption,
                 plan_index: int = PlanIndexOption, sysfs_root: Path = SysfsOption, once: bool = OnceOption,
                 duration: float = DurationOption) -> None:
        """Serve GPU and node metrics on /metrics for Prometheus (run one per node).

        Per GPU from NVML: utilization, SM clock and throttle reasons, memory, temperature, power and energy, ECC,
        XID events, NVLink state, throughput and errors, PCIe replays; labels: gpu (the index, as in
        dcgm-exporter), uuid, model_name, pci_bus_id, hostname. Per node: InfiniBand/RoCE port state and
        counters, checkpoint disk space. An NVML error on one GPU sets its gpufleet_gpu_up to 0 and the rest carry on.

        Examples:

        - `gpufleet exporter` (this node's GPUs on 127.0.0.1:9401)
        - `gpufleet exporter --listen 0.0.0.0:9401 --checkpoint-dir /checkpoints/run7 --plan plan.json`
        - `gpufleet exporter --fake-gpus 8 --fake-event 2:hw_thermal --once | promtool check metrics`
        """
        from gpufleet.runtime.monitor.exporter import (
            ExporterConfig,
            build_registry,
            check_duration_s,
            open_reader,
            parse_listen,
        )
        from gpufleet.runtime.monitor.plan_target import PlanTarget

        host, port = parse_listen(listen)
        check_duration_s(duration)
        config = ExporterConfig(host=host, port=port, fake_gpus=fake_gpus, fake_events=tuple(fake_event or ()),
                                checkpoint_dirs=tuple(checkpoint_dir or ()), sysfs_root=sysfs_root,
                                plan=None if plan is None else PlanTarget.from_file(plan, plan_index))
        reader = open_reader(config)
        registry = build_registry(config, reader)
        if once:
            from gpufleet.runtime.monitor.exporter import scrape

            sys.stdout.write(scrape(registry))
            return
        _serve_until_stopped(config, registry, reader.count, duration)


def _serve_until_stopped(config: ExporterConfig, registry: CollectorRegistry, gpus: int,
                         duration: float | None) -> None:
    """Serve until SIGTERM, Ctrl-C or `duration` seconds, then close the socket."""
    from gpufleet.runtime.monitor.exporter import serve

    server = serve(config, registry)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    host, port = server.server_address[:2]
    sys.stderr.write(f"serving http://{host}:{port}/metrics ({gpus} GPUs)\n")
    sys.stderr.flush()
    try:
        stop.wait(duration)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
