"""The per-GPU Prometheus families, built from `NvmlReader` samples at each scrape.

Every series carries the `gpu` label with the GPU index, as dcgm-exporter does, so joins written for it find
the GPU the same way. dcgm-exporter's other identity labels are camelCase (UUID, modelName, Hostname), which
`promtool check metrics` rejects; ours are their snake_case twins (uuid, model_name, pci_bus_id, hostname)
and docs/monitoring.md shows the relabelling that renames them for a dashboard that expects DCGM's.
Units are Prometheus base units (hertz, bytes, watts, joules, ratios 0..1); counters end in `_total`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufleet.runtime.monitor.nvml import THROTTLE_REASONS, GpuSample, NvmlReader

GPU_LABELS = ("gpu", "uuid", "model_name", "pci_bus_id", "hostname")
PREFIX = "gpufleet_gpu_"

#: name suffix, help, how to read the value from a sample (None: not supported here, series left out).
GAUGES: tuple[tuple[str, str, Callable[[GpuSample], float | None]], ...] = (
    ("utilization_ratio", "Fraction of the last sample period a kernel ran (NVML utilization.gpu / 100).",
     lambda s: s.utilization_ratio),
    ("memory_utilization_ratio", "Fraction of the last sample period device memory was read or written.",
     lambda s: s.memory_utilization_ratio),
    ("sm_clock_hertz", "Current SM clock.", lambda s: s.sm_clock_hz),
    ("sm_clock_max_hertz", "Highest SM clock the GPU supports.", lambda s: s.sm_clock_max_hz),
    ("sm_clock_base_hertz", "Default applications SM clock (the clock a busy GPU should hold or beat).",
     lambda s: s.sm_clock_base_hz),
    ("memory_used_bytes", "Device memory in use.", lambda s: s.memory_used_bytes),
    ("memory_total_bytes", "Device memory installed.", lambda s: s.memory_total_bytes),
    ("temperature_celsius", "GPU core temperature.", lambda s: s.temperature_celsius),
    ("power_watts", "Power draw of the board.", lambda s: s.power_watts),
    ("nvlink_links", "NVLinks this GPU has.", lambda s: None if s.nvlink is None else s.nvlink.links),
    ("nvlink_links_active", "NVLinks that are up.", lambda s: None if s.nvlink is None else s.nvlink.links_active),
)
COUNTERS: tuple[tuple[str, str, Callable[[GpuSample], float | None]], ...] = (
    ("energy_joules", "Energy used since the driver loaded.", lambda s: s.energy_joules_total),
    ("pcie_replays", "PCIe replay counter (link-level retransmissions).", lambda s: s.pcie_replays_total),
    ("nvlink_transmit_bytes", "NVLink data sent.",
     lambda s: None if s.nvlink is None else s.nvlink.transmit_bytes_total),
    ("nvlink_receive_bytes", "NVLink data received.",
     lambda s: None if s.nvlink is None else s.nvlink.receive_bytes_total),
)


class GpuCollector(Collector):
    """A prometheus-client collector that samples every GPU when scraped."""

    def __init__(self, reader: NvmlReader, hostname: str, clock: Callable[[], float] = time.perf_counter) -> None:
        self.reader = reader
        self.hostname = hostname
        self._clock = clock

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: families are only known once sampled

    def collect(self) -> Iterator[Metric]:
        started = self._clock()
        samples = self.reader.sample()
        yield from self._families(samples)
        yield GaugeMetricFamily("gpufleet_exporter_gpu_sample_seconds", "Time the last GPU sampling took.",
                                value=self._clock() - started)

    def _labels(self, sample: GpuSample) -> list[str]:
        ident = sample.identity
        return [str(ident.index), ident.uuid, ident.model_name, ident.pci_bus_id, self.hostname]

    def _families(self, samples: list[GpuSample]) -> Iterator[Metric]:
        up = GaugeMetricFamily(PREFIX + "up", "1 when NVML answered for this GPU at this scrape, 0 when it failed.",
                               labels=GPU_LABELS)
        for sample in samples:
            up.add_metric(self._labels(sample), 0.0 if sample.error else 1.0)
        yield up
        live = [s for s in samples if s.error is None]
        for suffix, text, read in GAUGES:
            yield self._family(GaugeMetricFamily(PREFIX + suffix, text, labels=GPU_LABELS), live, read)
        for suffix, text, read in COUNTERS:
            yield self._family(CounterMetricFamily(PREFIX + suffix, text, labels=GPU_LABELS), live, read)
        yield from self._labelled(live)

    def _family(self, family: Any, samples: list[GpuSample], read: Callable[[GpuSample], float | None]) -> Any:
        for sample in samples:
            value = read(sample)
            if value is not None:
                family.add_metric(self._labels(sample), float(value))
        return family

    def _labelled(self, samples: list[GpuSample]) -> Iterator[Metric]:
        """The families with one more label: throttle reason, ECC kind, XID code, NVLink error type."""
        throttled = GaugeMetricFamily(PREFIX + "throttled", "1 while NVML reports this clock event (throttle) "
                                      "reason.", labels=(*GPU_LABELS, "reason"))
        ecc = CounterMetricFamily(PREFIX + "ecc_errors", "ECC memory errors; scope volatile counts since the driver "
                                  "loaded, aggregate over the GPU's life.", labels=(*GPU_LABELS, "type", "scope"))
        xid = CounterMetricFamily(PREFIX + "xid_errors", "XID critical-error events seen by this exporter, by XID "
                                  "code.", labels=(*GPU_LABELS, "xid"))
        nvlink = CounterMetricFamily(PREFIX + "nvlink_errors", "NVLink data-link errors summed over the GPU's links.",
                                     labels=(*GPU_LABELS, "type"))
        for sample in samples:
            labels = self._labels(sample)
            for reason in THROTTLE_REASONS:
                if reason in sample.throttle_reasons:
                    throttled.add_metric([*labels, reason], float(sample.throttle_reasons[reason]))
            for (kind, scope), count in sample.ecc_errors_total.items():
                ecc.add_metric([*labels, kind, scope], float(count))
            for code, count in sorted(sample.xid_errors_total.items()):
                xid.add_metric([*labels, str(code)], float(count))
            if sample.nvlink is not None:
                for kind, count in sample.nvlink.errors_total.items():
                    nvlink.add_metric([*labels, kind], float(count))
        yield from (throttled, ecc, xid, nvlink)
