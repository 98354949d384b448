"""`gpufleet bench memory`: copy bandwidth of the local device's memory (HBM on a GPU, DRAM on a CPU).

A copy of S bytes reads S and writes S: bandwidth = 2·S / t, STREAM's convention for its Copy kernel
(McCalpin, STREAM benchmark: "bytes/iter" of Copy = 2 words). Best of `iters` timed copies after `warmup`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gpufleet.runtime.bench.gemm import local_device, synchronize

#: Default buffer: far beyond every cache level (an H100's L2 is 50 MB, a server CPU's L3 up to ~0.5 GB).
DEFAULT_SIZE_BYTES = 1 * 2**30


@dataclass(frozen=True, slots=True)
class MemoryRow:
    size_bytes: int
    time_s: float  # one copy
    device: str

    @property
    def bytes_per_s(self) -> float:
        return 2 * self.size_bytes / self.time_s


def bench_memory(size_bytes: int = DEFAULT_SIZE_BYTES, iters: int = 10, warmup: int = 2) -> MemoryRow:
    import torch

    device = local_device()
    count = max(1, size_bytes // 4)
    src = torch.ones(count, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    best = float("inf")
    for _ in range(iters):
        synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return MemoryRow(count * 4, best, str(device))
