"""`gpufleet bench gemm`: achieved FLOP/s of a model's own GEMMs, per dtype, on the local device (GPU, else CPU).

Each shape: `warmup` untimed matmuls, then `iters` back-to-back `torch.matmul(a, b)` of (M×K)·(K×N) between two
clock reads (device synchronised). FLOPs = 2·M·N·K per matmul. `fp8` is `torch._scaled_mm` of e4m3 operands (B
column-major, as cuBLASLt wants it) with unit scales and a bf16 result, the GEMM an FP8 recipe runs; on CUDA it needs
compute capability 8.9 or newer (Ada, Hopper, Blackwell), and on a CPU torch emulates it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.errors import InputError
from gpufleet.runtime.bench.shapes import GemmShape

DTYPES = ("bf16", "fp16", "fp32", "fp8")


def parse_dtypes(text: str) -> list[str]:
    """A comma list of DTYPES, at least one."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or any(name not in DTYPES for name in names):
        raise InputError(f"--dtype {text!r}: each must be one of {', '.join(DTYPES)}")
    return names
#: CUDA compute capability from which FP8 tensor-core GEMMs exist (Ada 8.9, Hopper 9.0)
FP8_MIN_CAPABILITY = (8, 9)


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
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}[name]


def fp8_supported(device: Any) -> bool:
    """Whether `device` runs FP8 GEMMs: a CUDA GPU of compute capability 8.9 or newer, or a CPU (emulated)."""
    import torch

    if device.type != "cuda":
        return True
    return tuple(torch.cuda.get_device_capability(device)) >= FP8_MIN_CAPABILITY


def local_device() -> Any:
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _matmul(shape: GemmShape, dtype: str, device: Any) -> Callable[[], object]:
    """One (M×K)·(K×N) matmul of `dtype` on `device`, operands allocated once."""
    import torch

    if dtype != "fp8":
        a = torch.randn(shape.m, shape.k, dtype=torch_dtype(dtype), device=device)
        b = torch.randn(shape.k, shape.n, dtype=torch_dtype(dtype), device=device)
        out = torch.empty(shape.m, shape.n, dtype=torch_dtype(dtype), device=device)
        return lambda: torch.matmul(a, b, out=out)
    if not fp8_supported(device):
        raise InputError(f"fp8 GEMMs need compute capability {'.'.join(map(str, FP8_MIN_CAPABILITY))} or newer; "
                         f"{device} has {'.'.join(map(str, torch.cuda.get_device_capability(device)))}")
    if shape.k % 16 or shape.n % 16:
        raise InputError(f"fp8 GEMM {shape.name} ({shape.m}x{shape.n}x{shape.k}): K and N must be multiples of 16")
    a8 = torch.randn(shape.m, shape.k, device=device).to(torch.float8_e4m3fn)
    b8 = torch.randn(shape.n, shape.k, device=device).to(torch.float8_e4m3fn).t()  # column-major K×N
    scale = torch.ones((), dtype=torch.float32, device=device)
    return lambda: torch._scaled_mm(a8, b8, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)


def time_gemm(shape: GemmShape, dtype: str, iters: int, warmup: int, device: Any) -> float:
    run = _matmul(shape, dtype, device)
    for _ in range(warmup):
        run()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        run()
    synchronize(device)
    return (time.perf_counter() - start) / iters


def bench_gemm(shapes: Sequence[GemmShape], dtypes: Sequence[str], iters: int = 10, warmup: int = 2
               ) -> list[GemmRow]:
    device = local_device()
    return [GemmRow(shape, dtype, time_gemm(shape, dtype, iters, warmup, device), str(device))
            for dtype in dtypes for shape in shapes]
