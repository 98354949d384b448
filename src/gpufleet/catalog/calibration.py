"""Calibration profiles: what a GPU really achieves (GEMM, attention, HBM), per GPU id.

The built-in profiles come from public measurements (sources in `data/calibration.yaml`); a runtime
benchmark (`gpufleet bench gemm`) can write a user profile with the same id that overrides them. A measured
profile may also carry what its cluster's collectives, checkpoint disk and optimizer achieved (`gpufleet
calibrate` from `bench collectives` / `bench disk`, or `gpufleet burnin --measure-host`); every such field is
optional and a profile without them plans exactly as before.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from gpufleet.catalog.records import RECORD_CONFIG, Record

AttentionKernel = Literal["flash", "cudnn", "flash-v1", "materialized"]
#: The collectives a measurement can name (fabric.collectives.Op; the catalog does not import the model half).
CollectiveOp = Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast", "send-recv"]


class MeasuredCollective(BaseModel):
    """One measured collective: `op` over a full buffer of `size_bytes` (nccl-tests' size) on `ranks` ranks,
    `ranks_per_node` of them on each node, at bus bandwidth `busbw_gbytes_per_s` (GB/s = 1e9 B/s, nccl-tests'
    definition, latency included). A group on one node measures the scale-up tier; one across nodes the network."""

    model_config = RECORD_CONFIG

    op: CollectiveOp
    size_bytes: float = Field(gt=0)
    ranks: int = Field(ge=2)
    ranks_per_node: int = Field(ge=1)
    busbw_gbytes_per_s: float = Field(gt=0)

    @model_validator(mode="after")
    def _ranks_fill_nodes(self) -> MeasuredCollective:
        if self.ranks_per_node > self.ranks or self.ranks % self.ranks_per_node:
            raise ValueError(f"ranks_per_node ({self.ranks_per_node}) must divide ranks ({self.ranks})")
        return self

    @property
    def tier(self) -> Literal["scale-up", "network"]:
        return "scale-up" if self.ranks_per_node == self.ranks else "network"

    @property
    def time_s(self) -> float:
        """Seconds per call: bus bytes / bus bandwidth (nccl-tests' bus factor for `ranks`)."""
        n = self.ranks
        factor = 2 * (n - 1) / n if self.op == "all-reduce" else (
            (n - 1) / n if self.op in ("all-gather", "reduce-scatter", "all-to-all") else 1.0)
        return self.size_bytes * factor / (self.busbw_gbytes_per_s * 1e9)


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
        description="host (framework + launch) seconds per kernel of a MoE layer; measured by `gpufleet bench host` "
        "when the profile sets it, else a recorded fit (data/fits.yaml)",
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
    collectives: tuple[MeasuredCollective, ...] = Field(
        default=(),
        description="measured collectives (bench collectives); the collective model scales its time for each op "
        "and tier by modelled / measured time, interpolated over size (fabric/collectives.py); empty = unmeasured",
    )
    checkpoint_write_gbytes_per_s: float | None = Field(
        default=None, gt=0,
        description="sequential write with fsync at the checkpoint path, one node (bench disk), GB/s; replaces "
        "reliability_defaults' per-node write bandwidth (the storage system's aggregate cap still applies)",
    )
    optimizer_s_per_param: float | None = Field(
        default=None, gt=0,
        description="seconds per local parameter of the optimizer update as the framework runs it over the model's "
        "own parameter shards (per-tensor dispatch included; burnin --measure-host); unset = the step model's Adam "
        "traffic at HBM bandwidth x hbm_fraction",
    )

    def gemm_fraction(self, precision: str) -> float:
        """Sustained best-shape GEMM fraction of the precision's own peak."""
        if precision in ("fp8", "fp4") and self.gemm_fraction_fp8 is not None:
            return self.gemm_fraction_fp8 * self.gemm_sustained_fraction
        return self.gemm_fraction_16bit * self.gemm_sustained_fraction

    def optimizer_seconds_per_param(self, modeled_s_per_param: float) -> float:
        """Optimizer seconds per local parameter: measured (`optimizer_s_per_param`), else the model's figure."""
        return modeled_s_per_param if self.optimizer_s_per_param is None else self.optimizer_s_per_param
