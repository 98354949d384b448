"""What one burn-in run trains and how: a frozen, validated request shared by the CLI and the Python API.

The model half never imports torch, so this module does not either; `model_record()` describes the burn-in GPT in
the catalog's `models:` shape, which is how the planner is asked about the very model the burn-in trains.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.errors import InputError

MODEL_ID = "gpufleet-burnin"
#: the catalog id of the burn-in's MoE variant (`--experts N`): a different model, so a separate id
MOE_MODEL_ID = "gpufleet-burnin-moe"
#: Measurement rounds spread over a run (judgement: enough for a median to shrug off one round taken during a
#: neighbour's burst), and the most allowed (more add little to a median and keep training waiting).
DEFAULT_MEASURE_ROUNDS = 8
MAX_MEASURE_ROUNDS = 32


@dataclass(frozen=True)
class ModelShape:
    """A GPT-2-style decoder: learned positions, LayerNorm, plain GELU MLP, no biases, untied output head.

    With `experts` > 0 every block's MLP is a mixture of experts instead: a router (a bias-free linear to one score
    per expert) picks the `top_k` best experts of each token, their softmax over those k weighs the outputs, and each
    expert is a plain GELU MLP of width `ffn_hidden`; dropless (no capacity limit), no load-balancing loss, no shared
    expert. Every rank holds and computes every expert on its own tokens (no expert parallelism: FSDP2 shards the
    experts' weights like any other, `Layout(ep=1)`)."""

    layers: int = 2
    hidden: int = 128
    heads: int = 4
    ffn_hidden: int = 512
    vocab: int = 512
    seq_len: int = 64
    experts: int = 0  # 0: a dense MLP in every block
    top_k: int = 2  # experts per token (with experts > 0)

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} must be a whole number >= 1, got {value!r}")
        if isinstance(self.experts, bool) or not isinstance(self.experts, int) or self.experts < 0:
            raise InputError(f"experts must be a whole number >= 0, got {self.experts!r}")
        if self.hidden % self.heads:
            raise InputError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.experts and self.top_k > self.experts:
            raise InputError(f"top_k ({self.top_k}) must not exceed experts ({self.experts})")

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def model_id(self) -> str:
        return MOE_MODEL_ID if self.moe else MODEL_ID

    def block_params(self) -> int:
        """Parameters of one block: attention (QKV, out), two LayerNorm weights, and the MLP (dense: up and down;
        MoE: the router and every expert's up and down)."""
        mlp = (self.hidden * self.experts + self.experts * 2 * self.hidden * self.ffn_hidden if self.moe
               else 2 * self.hidden * self.ffn_hidden)
        return 4 * self.hidden * self.hidden + 2 * self.hidden + mlp

    def params(self) -> int:
        """Parameters of the whole model: embeddings and positions, blocks, final norm, output head."""
        return (self.vocab + self.seq_len) * self.hidden + self.layers * self.block_params() + self.hidden \
            + self.vocab * self.hidden

    def model_record(self, model_id: str | None = None) -> dict[str, Any]:
        """This model as a catalog `models:` entry (ModelSpec fields; a MoE model with its `moe:` block)."""
        kind = f"MoE GPT ({self.layers}x{self.hidden}, {self.experts} experts, top-{self.top_k})" if self.moe \
            else f"GPT ({self.layers}x{self.hidden})"
        record: dict[str, Any] = {
            "id": model_id or self.model_id, "name": f"gpufleet burn-in {kind}", "layers": self.layers,
            "hidden": self.hidden, "heads": self.heads, "kv_heads": self.heads,
            "ffn_hidden": None if self.moe else self.ffn_hidden, "gated_mlp": False, "vocab": self.vocab,
            "tied_embeddings": False, "linear_bias": False, "norm": "layernorm", "learned_positions": self.seq_len,
            "source": "gpufleet.runtime.burnin.model.BurninGPT (the burn-in job's own model)"}
        if self.moe:
            record["moe"] = {"experts": self.experts, "top_k": self.top_k, "shared_experts": 0,
                             "expert_ffn_hidden": self.ffn_hidden, "dense_layers": 0,
                             "router": {"score_function": "softmax", "load_balancing": "none",
                                        "capacity_factor": None,
                                        "source": "gpufleet.runtime.burnin.model.MoEMLP: softmax over the top-k "
                                                  "router scores, dropless, no auxiliary loss"}}
        return record


@dataclass(frozen=True)
class BurninConfig:
    """One burn-in run. `micro_batch` is sequences per rank per step (global batch = micro_batch x world size)."""

    steps: int
    checkpoint_dir: Path
    log_file: Path
    shape: ModelShape = ModelShape()
    micro_batch: int = 4
    checkpoint_every: int = 5
    keep_last: int = 2
    lr: float = 3e-3
    warmup_steps: int = 10
    seed: int = 1234
    threads: int | None = 1  # torch threads per rank (None: torch's default); 1 keeps CPU runs bit-reproducible
    metrics_port: int | None = None  # StepMonitor serves /metrics on port + local rank when set
    plan: Path | None = None  # a `gpufleet plan --json` file StepMonitor compares the step time with
    backend: str | None = None  # default: nccl when CUDA is available, else gloo
    #: what --measure-host times kernels with: "wall" seconds, or "cpu" seconds of the process (a shared host)
    measure_clock: str = "wall"
    #: where --measure-host writes the host catalog (None: the host is not measured), and the measurement rounds
    #: run between training steps for it
    measure_host: Path | None = None
    measure_rounds: int = DEFAULT_MEASURE_ROUNDS

    def __post_init__(self) -> None:
        for name in ("steps", "micro_batch", "checkpoint_every", "keep_last"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"--{name.replace('_', '-')} must be a whole number >= 1, got {value!r}")
        if self.warmup_steps < 0:
            raise InputError(f"--warmup-steps must be >= 0, got {self.warmup_steps}")
        if not 0 < self.lr < 1:
            raise InputError(f"--lr must be in (0, 1), got {self.lr}")
        if self.threads is not None and self.threads < 1:
            raise InputError(f"--threads must be >= 1, got {self.threads}")
        if isinstance(self.measure_rounds, bool) or not isinstance(self.measure_rounds, int) \
                or not 1 <= self.measure_rounds <= MAX_MEASURE_ROUNDS:
            raise InputError(f"--measure-rounds must be a whole number from 1 to {MAX_MEASURE_ROUNDS}, got "
                             f"{self.measure_rounds!r}")
        if self.measure_clock not in ("wall", "cpu"):
            raise InputError(f"--measure-clock must be wall or cpu, got {self.measure_clock!r}")
        if self.backend not in (None, "gloo", "nccl"):
            raise InputError(f"--backend must be gloo or nccl, got {self.backend!r}")

    def lr_at(self, step: int) -> float:
        """Linear warm-up to `lr`, then constant: a pure function of the step, so a resumed run needs no scheduler
        state."""
        if self.warmup_steps == 0:
            return self.lr
        return self.lr * min(1.0, step / self.warmup_steps)


@dataclass(frozen=True)
class Identity:
    rank: int
    local_rank: int
    world_size: int
    restart: int  # torchrun's TORCHELASTIC_RESTART_COUNT: how many times this group was restarted


def identity_from_env() -> Identity:
    """This worker's place, from torchrun's environment; one line naming the variable when it is missing."""
    missing = [name for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if missing:
        raise InputError(f"{', '.join(missing)} not set: start the burn-in under torchrun, e.g. `torchrun "
                         "--nproc-per-node 2 -m gpufleet burnin --steps 20 --checkpoint-dir ckpt --log-file "
                         "burnin.jsonl`")
    return Identity(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0")), int(os.environ["WORLD_SIZE"]),
                    int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
