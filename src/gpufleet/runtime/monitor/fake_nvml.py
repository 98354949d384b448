"""A simulated NVML with pynvml's functions, for machines without GPUs: deterministic readings, injectable faults.

`FakeNvml(8)` looks like an 8-GPU H100 SXM node to `NvmlReader`. Its numbers are plausible H100 SXM values
(judgement, not measurements: 80 GiB HBM, 1980 MHz max / 1755 MHz default SM clock, 18 NVLinks, ~650 W busy);
tests only rely on the faults they inject:

- `throttle(gpu, reason)`: set a clock event reason bit; a slowdown reason also drops the SM clock and heats it;
- `ecc(gpu, corrected=, uncorrected=)`: add ECC errors (volatile and aggregate);
- `xid(gpu, code)`: queue an XID critical-error event;
- `nvlink_down(gpu, link)`: take one NVLink down and count a recovery error on it;
- `fail(gpu)`: every call on that GPU raises NVMLError (GPU is lost), as a fallen-off-the-bus GPU does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

from gpufleet.errors import InputError
from gpufleet.runtime.monitor.nvml import SLOWDOWN_REASONS, THROTTLE_REASONS

GIB = 1024**3
FAKE_MODEL = "NVIDIA H100 80GB HBM3 (fake)"
MAX_SM_MHZ = 1980
BASE_SM_MHZ = 1755
THROTTLED_SM_MHZ = 1410
NVLINKS = 18
BUSY_POWER_MW = 650_000
COOL_C = 62
HOT_C = 88
FAKE_MAX_GPUS = 64
#: Faults `--fake-event GPU:KIND[=VALUE]` understands (and the FakeNvml method each calls).
EVENT_KINDS = (*THROTTLE_REASONS, "ecc_corrected", "ecc_uncorrected", "xid", "nvlink_down", "fail")


@dataclass
class _FakeGpu:
    index: int
    reasons: int = 0
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)
    links_down: set[int] = field(default_factory=set)
    link_recoveries: dict[int, int] = field(default_factory=dict)
    lost: bool = False


class FakeNvml:
    """The subset of pynvml that NvmlReader calls, over `count` simulated GPUs."""

    def __init__(self, count: int, clock: Callable[[], float] = time.monotonic) -> None:
        if not 1 <= count <= FAKE_MAX_GPUS:
            raise InputError(f"--fake-gpus must be between 1 and {FAKE_MAX_GPUS}, got {count}")
        self._gpus = [_FakeGpu(i) for i in range(count)]
        self._clock = clock
        self._start = clock()
        self._events: list[SimpleNamespace] = []
        self.calls = 0

    # ---- fault injection -------------------------------------------------------------------------------------
    def throttle(self, gpu: int, reason: str = "hw_thermal") -> None:
        if reason not in THROTTLE_REASONS:
            raise InputError(f"unknown throttle reason {reason!r}; known: {', '.join(THROTTLE_REASONS)}")
        self._gpu(gpu).reasons |= THROTTLE_REASONS[reason]

    def clear_throttle(self, gpu: int) -> None:
        self._gpu(gpu).reasons = 0

    def ecc(self, gpu: int, corrected: int = 0, uncorrected: int = 0) -> None:
        state = self._gpu(gpu)
        for error_type, count in ((pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, corrected),
                                  (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, uncorrected)):
            for counter_type in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
                state.ecc[(error_type, counter_type)] = state.ecc.get((error_type, counter_type), 0) + count

    def xid(self, gpu: int, code: int) -> None:
        self._events.append(SimpleNamespace(device=self._gpu(gpu), eventType=pynvml.nvmlEventTypeXidCriticalError,
                                            eventData=code))

    def nvlink_down(self, gpu: int, link: int) -> None:
        if not 0 <= link < NVLINKS:
            raise InputError(f"NVLink index must be in [0, {NVLINKS - 1}], got {link}")
        state = self._gpu(gpu)
        state.links_down.add(link)
        state.link_recoveries[link] = state.link_recoveries.get(link, 0) + 1

    def fail(self, gpu: int) -> None:
        self._gpu(gpu).lost = True

    def inject(self, event: str) -> None:
        """One `GPU:KIND[=VALUE]` fault, as `gpufleet exporter --fake-event` spells it."""
        gpu_text, _, rest = event.partition(":")
        kind, _, value_text = rest.partition("=")
        if not gpu_text.isdigit() or kind not in EVENT_KINDS:
            raise InputError(f"--fake-event must be GPU:KIND[=VALUE] with KIND one of {', '.join(EVENT_KINDS)}, "
                             f"got {event!r}")
        gpu = int(gpu_text)
        value = int(value_text) if value_text.isdigit() else None
        if kind in ("xid", "nvlink_down") and value is None:
            raise InputError(f"--fake-event {kind} needs a number, as in {gpu}:{kind}=79, got {event!r}")
        actions: dict[str, Callable[[], None]] = {
            "ecc_corrected": lambda: self.ecc(gpu, corrected=value or 1),
            "ecc_uncorrected": lambda: self.ecc(gpu, uncorrected=value or 1),
            "xid": lambda: self.xid(gpu, value or 0),
            "nvlink_down": lambda: self.nvlink_down(gpu, value or 0),
            "fail": lambda: self.fail(gpu),
        }
        actions.get(kind, lambda: self.throttle(gpu, kind))()

    def _gpu(self, index: int) -> _FakeGpu:
        if not 0 <= index < len(self._gpus):
            raise InputError(f"GPU index must be in [0, {len(self._gpus) - 1}], got {index}")
        return self._gpus[index]

    def _live(self, handle: _FakeGpu) -> _FakeGpu:
        self.calls += 1
        if handle.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return handle

    def _slowed(self, gpu: _FakeGpu) -> bool:
        return any(gpu.reasons & THROTTLE_REASONS[reason] for reason in SLOWDOWN_REASONS)

    # ---- the pynvml interface --------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        return None

    def nvmlShutdown(self) -> None:
        return None

    def nvmlDeviceGetCount(self) -> int:
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _FakeGpu:
        if not 0 <= index < len(self._gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._live(self._gpus[index])

    def nvmlDeviceGetUUID(self, handle: _FakeGpu) -> str:
        return f"GPU-00000000-fake-0000-0000-{self._live(handle).index:012d}"

    def nvmlDeviceGetName(self, handle: _FakeGpu) -> str:
        self._live(handle)
        return FAKE_MODEL

    def nvmlDeviceGetPciInfo(self, handle: _FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(busId=f"00000000:{0x18 + 0x10 * self._live(handle).index:02X}:00.0")

    def nvmlDeviceGetUtilizationRates(self, handle: _FakeGpu) -> SimpleNamespace:
        self._live(handle)
        return SimpleNamespace(gpu=97, memory=41)

    def nvmlDeviceGetMemoryInfo(self, handle: _FakeGpu) -> SimpleNamespace:
        gpu = self._live(handle)
        return SimpleNamespace(total=80 * GIB, used=(60 + gpu.index % 8) * GIB, free=(20 - gpu.index % 8) * GIB)

    def nvmlDeviceGetClockInfo(self, handle: _FakeGpu, clock_type: int) -> int:
        gpu = self._live(handle)
        return THROTTLED_SM_MHZ if self._slowed(gpu) else MAX_SM_MHZ

    def nvmlDeviceGetMaxClockInfo(self, handle: _FakeGpu, clock_type: int) -> int:
        self._live(handle)
        return MAX_SM_MHZ

    def nvmlDeviceGetDefaultApplicationsClock(self, handle: _FakeGpu, clock_type: int) -> int:
        self._live(handle)
        return BASE_SM_MHZ

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _FakeGpu) -> int:
        return self._live(handle).reasons

    def nvmlDeviceGetTemperature(self, handle: _FakeGpu, sensor: int) -> int:
        gpu = self._live(handle)
        return HOT_C if self._slowed(gpu) else COOL_C + gpu.index % 4

    def nvmlDeviceGetPowerUsage(self, handle: _FakeGpu) -> int:
        self._live(handle)
        return BUSY_POWER_MW

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _FakeGpu) -> int:
        self._live(handle)
        return int(BUSY_POWER_MW * (self._clock() - self._start))  # mW x s = mJ

    def nvmlDeviceGetTotalEccErrors(self, handle: _FakeGpu, error_type: int, counter_type: int) -> int:
        return self._live(handle).ecc.get((error_type, counter_type), 0)

    def nvmlDeviceGetPcieReplayCounter(self, handle: _FakeGpu) -> int:
        self._live(handle)
        return 0

    def nvmlDeviceGetNvLinkState(self, handle: _FakeGpu, link: int) -> int:
        gpu = self._live(handle)
        if link >= NVLINKS:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.NVML_FEATURE_DISABLED if link in gpu.links_down else pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: _FakeGpu, link: int, counter: int) -> int:
        gpu = self._live(handle)
        return gpu.link_recoveries.get(link, 0) if counter == pynvml.NVML_NVLINK_ERROR_DL_RECOVERY else 0

    def nvmlDeviceGetFieldValues(self, handle: _FakeGpu, field_ids: list[int]) -> list[SimpleNamespace]:
        self._live(handle)
        kib = int(self._clock() - self._start) * 100 * 1024**2  # a steady 100 GiB/s each way
        return [SimpleNamespace(fieldId=f, nvmlReturn=pynvml.NVML_SUCCESS, value=SimpleNamespace(ullVal=kib))
                for f in field_ids]

    def nvmlEventSetCreate(self) -> list[SimpleNamespace]:
        return self._events

    def nvmlDeviceRegisterEvents(self, handle: _FakeGpu, event_types: int, event_set: Any) -> None:
        return None

    def nvmlEventSetWait(self, event_set: list[SimpleNamespace], timeout_ms: int) -> SimpleNamespace:
        if not event_set:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return event_set.pop(0)
