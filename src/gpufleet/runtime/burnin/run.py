"""The burn-in training loop: FSDP2 (`fully_shard`) over every rank, AdamW, CheckpointManager, one JSON log line per
step. Deterministic: the batches are a function of (seed, step, rank) and the checkpoint holds the whole model
and optimizer state, so a run restarted from its last checkpoint logs, step for step, the losses the
uninterrupted run logs (bit for bit on CPU, where gloo's reductions run in a fixed order).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.runtime.burnin.model import GPT, GPTConfig, batch, loss_of

#: Tries and pause between them when joining the process group. A group restarted by torchrun can find the
#: rendezvous store not yet listening (connection refused right after a restart on 127.0.0.1); joining is retried
#: rather than failing the restart. Judgement: 10 tries, 1 s apart, well inside torchrun's own timeouts.
JOIN_TRIES = 10
JOIN_PAUSE_S = 1.0
#: How long a rank waits for the others at the store (judgement: torchrun's default rendezvous timeout order).
JOIN_TIMEOUT_S = 300


@dataclass(frozen=True)
class BurninRequest:
    steps: int
    checkpoint_dir: Path
    log_file: Path
    checkpoint_every: int = 5
    seed: int = 0
    lr: float = 3e-3
    config: GPTConfig = field(default_factory=GPTConfig)


@dataclass(frozen=True)
class BurninResult:
    resumed_from: int | None
    last_step: int
    last_loss: float | None
    step_s: float  # mean wall time of one training step (checkpoint saves excluded), this run


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _store(rank: int, world_size: int) -> Any:
    """The rendezvous store, its keys prefixed by torchrun's restart count.

    torchrun keeps one store for the whole job (its agent hosts it on MASTER_PORT) and a restarted group would
    read the gloo addresses the previous, killed group published under the same keys: its ranks then connect to
    ports nobody listens on any more ("Connection refused" on 127.0.0.1, then a hang). A prefix per restart keeps
    every incarnation to its own keys.
    """
    from datetime import timedelta

    from torch.distributed import PrefixStore, TCPStore

    agent_hosts_it = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                     is_master=not agent_hosts_it and rank == 0, timeout=timedelta(seconds=JOIN_TIMEOUT_S))
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return PrefixStore(f"gpufleet-burnin/restart-{restart}", store)


def join_process_group() -> Any:
    """The default group from torchrun's environment (alone: a one-rank group on 127.0.0.1), with retries."""
    import torch
    import torch.distributed as dist

    from gpufleet.runtime.bench.collectives import from_slurm

    os.environ.update(from_slurm(os.environ))  # under srun (with MASTER_ADDR exported): Slurm's task numbers
    if "RANK" not in os.environ:  # started alone: a group of one
        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": str(_free_port())})
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    for attempt in range(JOIN_TRIES):
        try:
            dist.init_process_group(backend, store=_store(rank, world_size), rank=rank, world_size=world_size)
            return dist
        except (RuntimeError, ConnectionError) as error:  # DistNetworkError is a RuntimeError
            if attempt == JOIN_TRIES - 1:
                raise
            print(f"burnin: joining the process group failed ({error}); retrying", flush=True)
            time.sleep(JOIN_PAUSE_S)
    raise AssertionError("unreachable")


def _build(request: BurninRequest, dist: Any, device: Any) -> tuple[Any, Any]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(request.seed)  # every rank builds the same initial weights, then keeps its shard
    model = GPT(request.config).to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=request.lr, foreach=False)
    return model, optimizer


def _state(model: Any, optimizer: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def _resume(manager: Any, model: Any, optimizer: Any) -> int | None:
    """Load the newest checkpoint into model and optimizer; its step, or None when there is none (every rank takes
    part: `load_latest` decides on rank 0 and broadcasts)."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    # the optimizer has no state before its first step: take one with zero gradients and lr 0 so that the state
    # exists for the checkpoint to be loaded into (the load replaces every value, the step count too)
    rates = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    for parameter in model.parameters():
        parameter.grad = parameter.detach().new_zeros(parameter.shape)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for group, rate in zip(optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    found = manager.load_latest(template=_state(model, optimizer))
    if found is None:
        optimizer.state.clear()  # a fresh run starts from an empty optimizer, as if the step above never ran
        return None
    step, state = found
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(step)


def _log(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()


def _train_step(request: BurninRequest, dist: Any, model: Any, optimizer: Any, step: int, device: Any) -> float:
    import torch

    tokens = batch(request.config, request.seed, step, dist.get_rank(), device)
    loss = loss_of(model, tokens, request.config.vocab)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    mean = loss.detach().to(torch.float64).reshape(1)
    dist.all_reduce(mean)
    return float(mean.item()) / dist.get_world_size()


def run_burnin(request: BurninRequest) -> BurninResult:
    """Train `request.steps` steps (resuming from the newest checkpoint), logging each step on rank 0."""
    import torch

    from gpufleet.runtime.checkpoint import CheckpointManager

    dist = join_process_group()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    try:
        model, optimizer = _build(request, dist, device)
        manager = CheckpointManager(request.checkpoint_dir, keep_last=2)
        resumed = _resume(manager, model, optimizer)
        loss, spent_s, trained = None, 0.0, 0
        for step in range((resumed or 0) + 1, request.steps + 1):
            start = time.perf_counter()
            loss = _train_step(request, dist, model, optimizer, step, device)
            spent_s, trained = spent_s + time.perf_counter() - start, trained + 1
            if dist.get_rank() == 0:
                _log(request.log_file, {"step": step, "loss": loss, "restart": attempt})
            if step % request.checkpoint_every == 0 or step == request.steps:
                manager.save(_state(model, optimizer), step)
        manager.close()
        return BurninResult(resumed, request.steps, loss, spent_s / trained if trained else 0.0)
    finally:
        dist.destroy_process_group()
