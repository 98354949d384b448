"""What `gpufleet memory` asks, as one typed request: the CLI builds it from its flags, the Python API takes it.

It owns the rules and defaults the command applies before any catalog is read: the choices each field allows,
which flags go together, the data-parallel degree that fills the GPUs, and the global batch that fills the
pipeline. `planner.memory_report.memory_report` answers it.
"""

from __future__ import annotations

from typing import cast

from pydantic import Field, model_validator

from gpufleet.errors import InputError
from gpufleet.parallel.layout import RECOMPUTES, SELECTIVE_POLICIES, SHARDINGS, Layout, Recompute, Sharding
from gpufleet.parallel.memory import TRAINING_PRECISIONS
from gpufleet.request import Request


def _choice(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise InputError(f"{what} {value!r} is not one of {', '.join(allowed)}")


class MemoryRequest(Request):
    """One layout of one model on one GPU: memory per pipeline stage, and whether it fits."""

    model: str
    gpu: str
    gpus: int = Field(ge=1)
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    cp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    vpp: int = Field(1, ge=1)
    #: None: GPUs / (tp·pp·cp), which must divide
    dp: int | None = Field(None, ge=1)
    seq: int = Field(4096, ge=1)
    micro_batch: int = Field(1, ge=1)
    #: None: dp·micro_batch·pp, enough to fill the pipeline
    global_batch: int | None = Field(None, ge=1)
    recompute: str = "none"
    selective_policy: str | None = None
    stack: str | None = None
    recompute_layers: int | None = Field(None, ge=1)
    offload_activations: int | None = Field(None, ge=1)
    expert_tp: int | None = Field(None, ge=1)
    dtensor_tp: bool | None = None
    sharding: str = "none"
    hsdp_group: int = Field(8, ge=2)
    precision: str = "bf16"
    sequence_parallel: bool = True
    offload_optimizer: bool = False

    @model_validator(mode="after")
    def _check(self) -> MemoryRequest:
        _choice(self.recompute, RECOMPUTES, "recompute")
        if self.selective_policy is not None:
            _choice(self.selective_policy, SELECTIVE_POLICIES, "selective policy")
            if self.recompute != "selective":
                raise InputError(f"--selective-policy {self.selective_policy} applies to --recompute selective, "
                                 f"not {self.recompute}")
        _choice(self.sharding, SHARDINGS, "sharding")
        _choice(self.precision, TRAINING_PRECISIONS, "precision")
        if self.dp is None and self.gpus % (self.tp * self.pp * self.cp):
            raise InputError(f"--gpus {self.gpus} is not divisible by tp·pp·cp = {self.tp * self.pp * self.cp}; "
                             "give --dp or fix it")
        return self

    @property
    def data_parallel(self) -> int:
        """--dp, or the degree that fills the GPUs."""
        return self.dp if self.dp is not None else self.gpus // (self.tp * self.pp * self.cp)

    @property
    def batch(self) -> int:
        """--global-batch, or dp·micro_batch·pp (enough to fill the pipeline)."""
        return self.global_batch if self.global_batch is not None else self.data_parallel * self.micro_batch * self.pp

    def layout(self) -> Layout:
        """The layout asked for (not yet checked against the model: `validate_layout` does that)."""
        return Layout(
            tp=self.tp, pp=self.pp, dp=self.data_parallel, cp=self.cp, ep=self.ep, vpp=self.vpp,
            sequence_parallel=self.sequence_parallel and self.tp > 1, sharding=cast(Sharding, self.sharding),
            micro_batch=self.micro_batch, recompute=cast(Recompute, self.recompute),
            offload_optimizer=self.offload_optimizer, hsdp_group=self.hsdp_group,
            recompute_layers=self.recompute_layers, offload_activation_layers=self.offload_activations,
            expert_tp=self.expert_tp,
        )
