"""`gpufleet bench host`: host seconds per launched op, as eager PyTorch dispatches it on the local device.

A MoE layer launches ~100 small kernels per micro-batch (perf/moe_host.py), and under dropless routing the GPU
waits for the host to launch them. What each costs on the host (Python, autograd recording, the dispatcher, the
caching allocator, `cudaLaunchKernel`) is the calibration field `host_s_per_kernel`; this bench measures it.

Per op kind (the MoE layer's kinds: index/gather, small matmul, elementwise, cast) and repeat: `warmup` untimed
calls, a device sync, then `iters` calls in a Python loop between two clock reads, with *no* sync inside the loop:
on a GPU the host runs ahead of the device (the launch queue absorbs the kernels), so the loop's time is the host's
cost. A sync after the loop gives the wall time until the device has run them all: the device-side throughput,
reported separately. On a CPU, dispatch and kernel run on the host thread, so the two coincide and the figure is
the tiny ops' whole dispatch cost. Inputs that are floating point require grad (a training forward records an
autograd node per op) unless `autograd` is off.

Each op's figure is the median of `repeats`; the headline `host_s_per_kernel` is the mean over the op kinds
(judgement: the layer's mix weighted equally; by_op shows the spread).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.errors import InputError
from gpufleet.runtime.bench.gemm import local_device, synchronize

#: Rows (and columns) of the tiny tensors (judgement: 16 × 16 fp32 is 1 KiB and a 16³ matmul 4,096 multiply-adds,
#: so each op's arithmetic is well under a microsecond even on a CPU core, and what is timed is the dispatch; on a
#: GPU such a kernel runs in a few µs, below the host's cost, so the host, not the device, sets the pace).
TINY_ROWS = 16
OP_KINDS = ("index", "matmul", "elementwise", "cast")


@dataclass(frozen=True, slots=True)
class HostOpRow:
    op: str
    host_s_per_kernel: float  # median over repeats of the loop's time / iters
    device_s_per_kernel: float  # median over repeats of (loop + final sync) / iters: device-side throughput
    repeats: tuple[float, ...]  # each repeat's host seconds per kernel

    def as_json(self) -> dict[str, Any]:
        return {"host_s_per_kernel": self.host_s_per_kernel, "device_s_per_kernel": self.device_s_per_kernel,
                "device_kernels_per_s": 1.0 / self.device_s_per_kernel, "repeats_s": list(self.repeats)}


@dataclass(frozen=True, slots=True)
class HostBench:
    rows: tuple[HostOpRow, ...]
    device: str
    repeats: int
    iters: int
    autograd: bool

    @property
    def host_s_per_kernel(self) -> float:
        return statistics.fmean(row.host_s_per_kernel for row in self.rows)

    def as_json(self) -> dict[str, Any]:
        return {"host_s_per_kernel": self.host_s_per_kernel, "by_op": {r.op: r.as_json() for r in self.rows},
                "device": self.device, "repeats": self.repeats, "iters": self.iters, "autograd": self.autograd}


def parse_op_kinds(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    if names == ("all",):
        return OP_KINDS
    if not names or any(name not in OP_KINDS for name in names):
        raise InputError(f"--ops {text!r}: each must be one of {', '.join(OP_KINDS)}, or all")
    return names


def _op(kind: str, device: Any, autograd: bool) -> Callable[[], Any]:
    """A call that launches one kernel of `kind` (one eager op) on tiny tensors."""
    import torch

    x = torch.randn(TINY_ROWS, TINY_ROWS, device=device, requires_grad=autograd)
    if kind == "index":  # the permute / un-permute gathers of token rows
        order = torch.randperm(TINY_ROWS, device=device)
        return lambda: torch.index_select(x, 0, order)
    if kind == "matmul":  # the router and a small expert GEMM
        w = torch.randn(TINY_ROWS, TINY_ROWS, device=device, requires_grad=autograd)
        return lambda: torch.matmul(x, w)
    if kind == "elementwise":  # the top-k probabilities' scaling, the combine's weighted sum
        y = torch.randn(TINY_ROWS, TINY_ROWS, device=device)
        return lambda: torch.mul(x, y)
    if kind == "cast":  # the dispatch's dtype casts
        return lambda: x.to(torch.bfloat16)
    raise InputError(f"op {kind!r} is not one of {', '.join(OP_KINDS)}")


def _time_op(kind: str, device: Any, autograd: bool, iters: int, warmup: int, repeats: int) -> HostOpRow:
    call = _op(kind, device, autograd)
    host, wall = [], []
    for _ in range(repeats):
        for _ in range(warmup):
            call()
        synchronize(device)
        start = time.perf_counter()
        for _ in range(iters):
            call()
        launched = time.perf_counter()
        synchronize(device)
        done = time.perf_counter()
        host.append((launched - start) / iters)
        wall.append((done - start) / iters)
    return HostOpRow(kind, statistics.median(host), statistics.median(wall), tuple(host))


def bench_host(ops: Sequence[str] = OP_KINDS, iters: int = 2000, warmup: int = 200, repeats: int = 5,
               autograd: bool = True) -> HostBench:
    """Host seconds per launched op for each kind in `ops` on the local device (GPU, else CPU)."""
    if iters < 1 or repeats < 1 or warmup < 0:
        raise InputError(f"iters ({iters}) and repeats ({repeats}) must be at least 1, warmup ({warmup}) at least 0")
    device = local_device()
    rows = tuple(_time_op(kind, device, autograd, iters, warmup, repeats) for kind in ops)
    return HostBench(rows, str(device), repeats, iters, autograd)
