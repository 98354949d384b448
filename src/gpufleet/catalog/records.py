"""Typed catalog records: what is trained (ModelSpec) and on what (GPUSpec, NodeSpec, NetworkSpec).

YAML files carry human units in the key name (`hbm_gib`, `dense_tflops`, `link_gbps`); the records
expose SI base units through properties (`hbm_bytes`, `peak_flops()`, `link_bytes_per_s`).
Every record has `source:`; records of things that change over time carry `as_of:` too.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "fp4"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")
#: Every catalog record: frozen, unknown keys refused, and no infinite or NaN number (YAML's `.inf` reads as a float).
RECORD_CONFIG = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Record(BaseModel):
    """Base of every catalog record: frozen, unknown keys rejected, a source required."""

    model_config = RECORD_CONFIG

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    source: str = Field(min_length=3)
    note: str | None = None


class DenseTflops(BaseModel):
    """Dense (not 2:4-sparse) peak tensor throughput per precision, TFLOP/s; null = unsupported/unknown."""

    model_config = RECORD_CONFIG

    fp32: float | None = Field(default=None, gt=0)
    tf32: float | None = Field(default=None, gt=0)
    bf16: float | None = Field(default=None, gt=0)
    fp16: float | None = Field(default=None, gt=0)
    fp8: float | None = Field(default=None, gt=0)
    fp4: float | None = Field(default=None, gt=0)


class ScaleUp(BaseModel):
    """The GPU's scale-up (NVLink / Infinity Fabric) link as the collective model sees it."""

    model_config = RECORD_CONFIG

    kind: Literal["switched", "mesh", "pcie"]
    gbytes_per_s_per_direction: float = Field(
        gt=0, lt=1e6, description="per GPU, one direction, line rate (below 1 PB/s: a bound against typos, judgement)")
    domain_gpus: int = Field(ge=1, description="GPUs reachable over scale-up links")
    links: int | None = Field(default=None, ge=1, description="links per GPU (mesh: one per peer)")
    achievable_fraction: float = Field(
        gt=0, le=1, description="ring bus bandwidth / line rate measured with nccl-tests (calibratable)"
    )

    @property
    def bytes_per_s_per_direction(self) -> float:
        return self.gbytes_per_s_per_direction * 1e9


class GPUSpec(Record):
    """One accelerator: peak FLOP/s per precision, HBM, scale-up link, power."""

    name: str
    vendor: Literal["nvidia", "amd", "intel"]
    dense_tflops: DenseTflops
    hbm_gib: float = Field(gt=0, description="HBM capacity; vendors' 'GB' on HBM is binary (80 GB = 80 GiB)")
    hbm_tbps: float = Field(gt=0, description="HBM bandwidth, TB/s (decimal)")
    scale_up: ScaleUp
    tdp_w: float = Field(gt=0)
    host_link_gbytes_per_s: float | None = Field(
        default=None, gt=0, description="GPU-to-CPU link per direction, GB/s (PCIe x16 or NVLink-C2C); None: unknown"
    )

    def peak_flops(self, precision: Precision) -> float:
        """Dense peak FLOP/s for a precision; raises if the GPU lacks it."""
        tflops = getattr(self.dense_tflops, precision)
        if tflops is None:
            from gpufleet.errors import InputError

            supported = [p for p in PRECISIONS if getattr(self.dense_tflops, p) is not None]
            raise InputError(f"{self.id} has no dense {precision} peak; supported: {', '.join(supported)}")
        return float(tflops) * 1e12

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gib * 2**30

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tbps * 1e12


class NodeSpec(Record):
    """A server (or NVL72 rack treated as one scale-up node): GPUs, NICs, power, size."""

    name: str
    gpu: str
    gpus: int = Field(ge=1)
    nics: int = Field(ge=1, description="compute-fabric NICs (storage NICs excluded)")
    nic_gbps: float = Field(gt=0, description="line rate per compute NIC, Gb/s")
    default_network: str
    cpu_ram_gib: float = Field(gt=0)
    max_power_w: float = Field(gt=0)
    typical_power_w: float | None = Field(default=None, gt=0)
    rack_units: int = Field(ge=1)
    rack_scale: bool = Field(
        default=False, description="the node is a whole rack with its own power shelves and cooling (GB200 NVL72): "
        "one rack per node, not packed into the facility's standard racks"
    )
    scale_up_override: ScaleUp | None = Field(
        default=None, description="this node's GPU-to-GPU links when they differ from the GPU's own (e.g. PCIe)"
    )

    @property
    def nic_bytes_per_s_per_gpu(self) -> float:
        """Scale-out line rate per GPU (all compute NICs shared evenly), bytes/s."""
        return self.nics * self.nic_gbps * 1e9 / 8 / self.gpus


class NetworkSpec(Record):
    """A scale-out transport: link rate, what NCCL achieves on it, switch radix, latency."""

    name: str
    kind: Literal["infiniband", "roce", "ethernet", "socket"]
    link_gbps: float = Field(gt=0, description="line rate per port, Gb/s")
    achievable_fraction: float = Field(gt=0, le=1, description="NCCL bus bandwidth / line rate")
    switch_radix: int = Field(ge=2, description="ports per switch at this link rate")
    hop_latency_s: float = Field(gt=0, description="per switch hop")
    endpoint_latency_s: float = Field(gt=0, description="software + NIC latency per message")
    switch_power_w: float | None = Field(default=None, gt=0)

    @property
    def link_bytes_per_s(self) -> float:
        return self.link_gbps * 1e9 / 8


class RouterSpec(BaseModel):
    """How the MoE router picks and weighs experts and balances their load, as the model was trained."""

    model_config = RECORD_CONFIG

    score_function: Literal["softmax", "sigmoid"] = "softmax"
    topk_scaling: float | None = Field(default=None, gt=0, description="factor on the routed output")
    groups: int | None = Field(default=None, ge=1, description="expert groups of group-limited routing")
    group_topk: int | None = Field(default=None, ge=1, description="groups each token may use")
    load_balancing: Literal["aux_loss", "seq_aux_loss", "none"] = "aux_loss"
    aux_loss_coeff: float = Field(default=0.0, ge=0)
    expert_bias: bool = Field(default=False, description="auxiliary-loss-free balancing: a per-expert score bias")
    bias_update_rate: float | None = Field(default=None, gt=0, description="the expert bias's update speed")
    capacity_factor: float | None = Field(default=None, gt=0, description="None: dropless (no token dropped)")
    source: str = Field(min_length=3)


class MoESpec(BaseModel):
    """Mixture-of-experts block: routed experts, top-k, shared experts, leading dense layers."""

    model_config = RECORD_CONFIG

    experts: int = Field(ge=1)
    top_k: int = Field(ge=1)
    shared_experts: int = Field(default=0, ge=0)
    expert_ffn_hidden: int = Field(ge=1)
    dense_layers: int = Field(default=0, ge=0, description="leading layers with a dense MLP")
    router: RouterSpec | None = None

    @model_validator(mode="after")
    def _top_k_within_experts(self) -> MoESpec:
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds experts ({self.experts})")
        return self


class MLASpec(BaseModel):
    """DeepSeek multi-head latent attention: low-rank q and kv projections."""

    model_config = RECORD_CONFIG

    q_lora_rank: int = Field(ge=1)
    kv_lora_rank: int = Field(ge=1)
    qk_nope_head_dim: int = Field(ge=1)
    qk_rope_head_dim: int = Field(ge=1)
    v_head_dim: int = Field(ge=1)


class FieldSources(BaseModel):
    """The source of each model value recorded outside the record's own `source` (one per value)."""

    model_config = RECORD_CONFIG

    rope_base: str | None = Field(default=None, min_length=3)
    norm_eps: str | None = Field(default=None, min_length=3)


class ModelSpec(Record):
    """A decoder-only transformer, enough to count parameters, FLOPs and activation bytes."""

    name: str
    layers: int = Field(ge=1)
    hidden: int = Field(ge=1)
    heads: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    head_dim: int | None = Field(default=None, ge=1, description="default hidden // heads")
    ffn_hidden: int | None = Field(default=None, ge=1, description="dense MLP width; null if every layer is MoE")
    gated_mlp: bool
    vocab: int = Field(ge=1)
    tied_embeddings: bool = False
    linear_bias: bool = Field(default=False, description="GPT-2/3 style biases on every linear")
    qkv_bias: bool = Field(default=False, description="bias on q, k, v only (Qwen2)")
    norm: Literal["layernorm", "rmsnorm"] = "rmsnorm"
    qk_norm: bool = False
    learned_positions: int = Field(default=0, ge=0, description="rows of a learned position table (GPT-2/3)")
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    rope_base: float | None = Field(default=None, gt=0, description="RoPE base (theta); None = not recorded")
    norm_eps: float | None = Field(default=None, gt=0, description="epsilon of every norm; None = not recorded")
    #: where each of rope_base and norm_eps comes from (one entry per value given)
    field_sources: FieldSources = Field(default_factory=lambda: FieldSources())

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        for name in ("rope_base", "norm_eps"):
            if getattr(self, name) is not None and getattr(self.field_sources, name) is None:
                raise ValueError(f"{name} needs its source in field_sources")
        if self.learned_positions and self.rope_base is not None:
            raise ValueError("rope_base is for rotary positions, not a learned position table")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.ffn_hidden is None and (self.moe is None or self.moe.dense_layers > 0):
            raise ValueError("ffn_hidden is required unless every layer is MoE")
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) is not divisible by heads ({self.heads}); give head_dim")
        return self

    @property
    def head_dim_(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads
