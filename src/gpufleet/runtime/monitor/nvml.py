"""Reading GPUs through NVML: one `GpuSample` per GPU per scrape, from any object with pynvml's interface.

The seam is the module object: `NvmlReader(pynvml)` on a GPU machine, `NvmlReader(FakeNvml(...))` everywhere
else. Both raise pynvml's `NVMLError` subclasses, so the same code decides what an error means: a field the GPU
does not support is left out (None); any other error on a GPU marks that GPU down for this scrape and leaves the
other GPUs alone.
"""

from __future__ import annotations

import ctypes
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pynvml

#: Clock event (throttle) reasons we export, by NVML bit (source: nvml.h, nvmlClocksEventReason*; pynvml constants).
THROTTLE_REASONS: dict[str, int] = {
    "gpu_idle": pynvml.nvmlClocksThrottleReasonGpuIdle,
    "applications_clocks": pynvml.nvmlClocksThrottleReasonApplicationsClocksSetting,
    "sw_power_cap": pynvml.nvmlClocksThrottleReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksThrottleReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksThrottleReasonSyncBoost,
    "sw_thermal": pynvml.nvmlClocksThrottleReasonSwThermalSlowdown,
    "hw_thermal": pynvml.nvmlClocksThrottleReasonHwThermalSlowdown,
    "hw_power_brake": pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown,
}
#: The reasons that mean the GPU is slowed by heat or power (not idle, not a clock the user set).
SLOWDOWN_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
NVLINK_ERRORS: dict[str, int] = {
    "replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
    "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
}
ECC_KINDS: dict[tuple[str, str], tuple[int, int]] = {
    ("corrected", "volatile"): (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
    ("uncorrected", "volatile"): (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
    ("corrected", "aggregate"): (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
    ("uncorrected", "aggregate"): (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
}
MHZ_TO_HZ = 1e6
MILLI = 1e-3
KIB_BYTES = 1024
PERCENT = 100.0


@dataclass(frozen=True)
class GpuIdentity:
    """The labels every per-GPU series carries (gpu as in dcgm-exporter; uuid, model_name, pci_bus_id)."""

    index: int
    uuid: str
    model_name: str
    pci_bus_id: str


@dataclass(frozen=True)
class NvlinkSample:
    links: int
    links_active: int
    errors_total: dict[str, int]
    transmit_bytes_total: float | None
    receive_bytes_total: float | None


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one scrape. `error` is set (and the readings are None) when NVML failed on this GPU."""

    identity: GpuIdentity
    error: str | None = None
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    sm_clock_hz: float | None = None
    sm_clock_max_hz: float | None = None
    sm_clock_base_hz: float | None = None
    throttle_reasons: dict[str, bool] = field(default_factory=dict)
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    energy_joules_total: float | None = None
    ecc_errors_total: dict[tuple[str, str], int] = field(default_factory=dict)
    xid_errors_total: dict[int, int] = field(default_factory=dict)
    nvlink: NvlinkSample | None = None
    pcie_replays_total: int | None = None

    @property
    def slowed_down(self) -> bool:
        """Thermal or power throttling is on, or the SM clock sits below base while the GPU is busy."""
        if any(self.throttle_reasons.get(reason, False) for reason in SLOWDOWN_REASONS):
            return True
        busy = (self.utilization_ratio or 0.0) > 0
        return bool(busy and self.sm_clock_hz and self.sm_clock_base_hz and self.sm_clock_hz < self.sm_clock_base_hz)


def _optional(call: Any, *args: Any) -> Any:
    """`call(*args)`, or None when NVML says the GPU does not support it (any other NVML error propagates)."""
    try:
        return call(*args)
    except pynvml.NVMLError_NotSupported:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlReader:
    """Samples every GPU through `nvml` (the pynvml module or a fake with the same functions)."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        nvml.nvmlInit()
        self._handles = [self._handle(i) for i in range(nvml.nvmlDeviceGetCount())]
        self._identities = [self._identity(i, h) for i, h in enumerate(self._handles)]
        self._xids: list[Counter[int]] = [Counter() for _ in self._handles]
        self._events = self._register_xid_events()

    def _handle(self, index: int) -> Any:
        """The GPU's NVML handle, or None when NVML cannot open it (that GPU is reported down, the rest served)."""
        try:
            return self.nvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError:
            return None

    @property
    def count(self) -> int:
        return len(self._handles)

    def close(self) -> None:
        self.nvml.nvmlShutdown()

    def _identity(self, index: int, handle: Any) -> GpuIdentity:
        nvml = self.nvml
        if handle is None:
            return GpuIdentity(index, f"unknown-{index}", "unknown", "")
        try:
            return GpuIdentity(index, _text(nvml.nvmlDeviceGetUUID(handle)), _text(nvml.nvmlDeviceGetName(handle)),
                               _text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        except pynvml.NVMLError:
            return GpuIdentity(index, f"unknown-{index}", "unknown", "")

    def _register_xid_events(self) -> Any:
        """An NVML event set receiving XID critical errors from every GPU that supports them, or None."""
        try:
            events = self.nvml.nvmlEventSetCreate()
        except pynvml.NVMLError:
            return None
        for handle in self._handles:
            if handle is None:
                continue
            try:
                self.nvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, events)
            except pynvml.NVMLError:  # not supported on this GPU (or it is failing): the others still report XIDs
                continue
        return events

    def _drain_xid_events(self) -> None:
        """Count every XID event waiting in the set (wait 0 ms: never blocks a scrape)."""
        if self._events is None:
            return
        while True:
            try:
                data = self.nvml.nvmlEventSetWait(self._events, 0)
            except pynvml.NVMLError:  # NVML_ERROR_TIMEOUT: nothing pending
                return
            for index, handle in enumerate(self._handles):
                if _same_handle(data.device, handle):
                    self._xids[index][int(data.eventData)] += 1

    def sample(self) -> list[GpuSample]:
        """Every GPU now; one GPU failing becomes a GpuSample with `error`, never an exception."""
        self._drain_xid_events()
        return [self.sample_one(index) for index in range(len(self._handles))]

    def sample_one(self, index: int) -> GpuSample:
        """One GPU now (an NVML error becomes a GpuSample with `error`)."""
        if self._handles[index] is None:
            return GpuSample(self._identities[index], error="NVML could not open this GPU")
        try:
            return self._sample_one(index, self._handles[index])
        except pynvml.NVMLError as error:
            return GpuSample(self._identities[index], error=str(error))

    def sample_clocks(self, index: int) -> GpuSample:
        """Only what a straggler check needs (utilization, SM clocks, throttle reasons): 4 NVML calls, not ~90."""
        handle = self._handles[index]
        if handle is None:
            return GpuSample(self._identities[index], error="NVML could not open this GPU")
        nvml = self.nvml
        try:
            rates = _optional(nvml.nvmlDeviceGetUtilizationRates, handle)
            reasons = _optional(nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
            return GpuSample(
                identity=self._identities[index],
                utilization_ratio=None if rates is None else rates.gpu / PERCENT,
                sm_clock_hz=_hz(_optional(nvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)),
                sm_clock_base_hz=_hz(_optional(nvml.nvmlDeviceGetDefaultApplicationsClock, handle,
                                               pynvml.NVML_CLOCK_SM)),
                throttle_reasons={} if reasons is None else {name: bool(reasons & bit)
                                                             for name, bit in THROTTLE_REASONS.items()})
        except pynvml.NVMLError as error:
            return GpuSample(self._identities[index], error=str(error))

    def _sample_one(self, index: int, handle: Any) -> GpuSample:
        nvml = self.nvml
        rates = _optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        reasons = _optional(nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
        power_mw = _optional(nvml.nvmlDeviceGetPowerUsage, handle)
        energy_mj = _optional(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        return GpuSample(
            identity=self._identities[index],
            utilization_ratio=None if rates is None else rates.gpu / PERCENT,
            memory_utilization_ratio=None if rates is None else rates.memory / PERCENT,
            sm_clock_hz=_hz(_optional(nvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)),
            sm_clock_max_hz=_hz(_optional(nvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM)),
            sm_clock_base_hz=_hz(_optional(nvml.nvmlDeviceGetDefaultApplicationsClock, handle, pynvml.NVML_CLOCK_SM)),
            throttle_reasons={} if reasons is None else {name: bool(reasons & bit)
                                                         for name, bit in THROTTLE_REASONS.items()},
            memory_used_bytes=int(memory.used),
            memory_total_bytes=int(memory.total),
            temperature_celsius=_optional(nvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
            power_watts=None if power_mw is None else power_mw * MILLI,
            energy_joules_total=None if energy_mj is None else energy_mj * MILLI,
            ecc_errors_total=self._ecc(handle),
            xid_errors_total=dict(self._xids[index]),
            nvlink=self._nvlink(handle),
            pcie_replays_total=_optional(nvml.nvmlDeviceGetPcieReplayCounter, handle),
        )

    def _ecc(self, handle: Any) -> dict[tuple[str, str], int]:
        counts = {}
        for kind, (error_type, counter_type) in ECC_KINDS.items():
            value = _optional(self.nvml.nvmlDeviceGetTotalEccErrors, handle, error_type, counter_type)
            if value is not None:
                counts[kind] = int(value)
        return counts

    def _nvlink(self, handle: Any) -> NvlinkSample | None:
        """Links that exist (state readable), how many are up, their error counters summed, and data throughput."""
        nvml = self.nvml
        links = active = 0
        errors = dict.fromkeys(NVLINK_ERRORS, 0)
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            state = _optional(nvml.nvmlDeviceGetNvLinkState, handle, link)
            if state is None:
                continue
            links += 1
            active += int(state == pynvml.NVML_FEATURE_ENABLED)
            for name, counter in NVLINK_ERRORS.items():
                errors[name] += int(_optional(nvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter) or 0)
        if links == 0:
            return None
        tx, rx = self._nvlink_throughput(handle)
        return NvlinkSample(links, active, errors, tx, rx)

    def _nvlink_throughput(self, handle: Any) -> tuple[float | None, float | None]:
        fields = [pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]
        values = _optional(self.nvml.nvmlDeviceGetFieldValues, handle, fields)
        if values is None:
            return None, None
        read = [float(v.value.ullVal) * KIB_BYTES if v.nvmlReturn == pynvml.NVML_SUCCESS else None for v in values]
        return read[0], read[1]


def _hz(mhz: float | None) -> float | None:
    return None if mhz is None else mhz * MHZ_TO_HZ


def _same_handle(a: Any, b: Any) -> bool:
    """NVML device handles are ctypes pointers (compare the addresses they hold); a fake's are plain objects."""
    if isinstance(a, ctypes._Pointer) and isinstance(b, ctypes._Pointer):
        return bool(ctypes.cast(a, ctypes.c_void_p).value == ctypes.cast(b, ctypes.c_void_p).value)
    return a is b
