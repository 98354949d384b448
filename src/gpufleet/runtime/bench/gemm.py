"""`gpufleet bench gemm`: achieved FLOP/s of a model's own GEMMs, per dtype, on the local device (GPU, else CPU).

Each shape: `warmup` untimed matmuls, then `iters` back-to-back `torch.matmul(a, b)` of (M×K)·(K×N) between two
clock reads (device synchronised). FLOPs = 2·M·N·K per matmul.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.errors import InputError
from gpufleet.runtime.bench.shapes import GemmShape

DTYPES = ("bf16", "fp16", "fp32")


@dataclass(frozen=True, slots=True)
class GemmRow:
    shape: GemmShape
    dtype: str
    time_s: float  # per matmul
    device: str

    @property
    def flops_per_s(self) -> float:
        return self.shape.flops / self.time_s

    def as_json(self, peak_flops: float | None) -> dict[str, Any]:
        return {"shape": self.shape.name, "m": self.shape.m, "n": self.shape.n, "k": self.shape.k,
                "dtype": self.dtype, "time_s": self.time_s, "tflops": self.flops_per_s / 1e12,
                "peak_tflops": peak_flops / 1e12 if peak_flops else None,
                "fraction_of_peak": self.flops_per_s / peak_flops if peak_flops else None, "device": self.device}


def torch_dtype(name: str) -> Any:
    import torch

    if name not in DTYPES:
        raise InputError(f"dtype {name!r} is not one of {', '.join(DTYPES)}")
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def local_device() -> Any:
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_gemm(shape: GemmShape, dtype: str, iters: int, warmup: int, device: Any) -> float:
    import torch

    a = torch.randn(shape.m, shape.k, dtype=torch_dtype(dtype), device=device)
    b = torch.randn(shape.k, shape.n, dtype=torch_dtype(dtype), device=device)
    out = torch.empty(shape.m, shape.n, dtype=torch_dtype(dtype), device=device)
    for _ in range(warmup):
        torch.matmul(a, b, out=out)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        torch.matmul(a, b, out=out)
    synchronize(device)
    return (time.perf_counter() - start) / iters


def bench_gemm(shapes: Sequence[GemmShape], dtypes: Sequence[str], iters: int = 10, warmup: int = 2
               ) -> list[GemmRow]:
    device = local_device()
    return [GemmRow(shape, dtype, time_gemm(shape, dtype, iters, warmup, device), str(device))
            for dtype in dtypes for shape in shapes]
