"""Calibration profiles: what a GPU really achieves (GEMM, attention, HBM), per GPU id.

The built-in profiles come from public measurements (sources in `data/calibration.yaml`); a runtime
benchmark (`gpufleet bench gemm`) can write a user profile with the same id that overrides them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpufleet.catalog.records import Record

AttentionKernel = Literal["flash", "cudnn", "flash-v1", "materialized"]


class CalibrationProfile(Record):
    """Achievable fractions of a GPU's peaks; `id` is the GPU id it calibrates."""

    gemm_fraction_16bit: float = Field(gt=0, le=1, description="best-shape bf16/fp16 GEMM / dense peak (MAMF)")
    gemm_fraction_fp8: float | None = Field(default=None, gt=0, le=1, description="best-shape fp8 GEMM / fp8 peak")
    attention_fraction: float = Field(gt=0, le=1, description="fused attention kernel (fwd+bwd) / 16-bit peak")
    hbm_fraction: float = Field(gt=0, le=1, description="achievable HBM bandwidth for streaming kernels / peak")
    in_training_fraction: float = Field(
        default=1.0, gt=0, le=1,
        description="tensor-core kernels (GEMMs, fused attention) inside a training step / the same kernels "
        "in an isolated benchmark; a recorded fit (data/fits.yaml) unless the profile sets it",
    )
    gemm_sustained_fraction: float = Field(
        default=1.0, gt=0, le=1,
        description="sustained (all GPUs busy, power-limited clock) / burst GEMM fraction, for profiles whose "
        "gemm_fraction_* are burst (MAMF) figures; 1 where they are sustained already; a recorded fit for "
        "Blackwell (data/fits.yaml)",
    )
    host_s_per_kernel: float = Field(
        default=0.0, ge=0,
        description="host (framework + launch) seconds per kernel of a MoE layer; a recorded fit (data/fits.yaml)",
    )
    cudnn_attention_fraction: float | None = Field(
        default=None, gt=0, le=1,
        description="cuDNN fused attention (fwd+bwd) / 16-bit peak: Transformer Engine's choice on Hopper and newer; "
        "unset = attention_fraction",
    )
    attention_kernel: AttentionKernel = Field(
        default="flash",
        description="flash (fused, FlashAttention-2 class), cudnn (cuDNN fused attention, at "
        "cudnn_attention_fraction), flash-v1 (first-generation fused kernels: FlashAttention-1, its Triton port) "
        "or materialized (s×s scores in HBM)",
    )
    gemm_half_dim: int = Field(
        default=128, ge=1, description="a GEMM dimension of this size runs at half efficiency (shape curve)"
    )

    def gemm_fraction(self, precision: str) -> float:
        """Sustained best-shape GEMM fraction of the precision's own peak."""
        if precision in ("fp8", "fp4") and self.gemm_fraction_fp8 is not None:
            return self.gemm_fraction_fp8 * self.gemm_sustained_fraction
        return self.gemm_fraction_16bit * self.gemm_sustained_fraction
