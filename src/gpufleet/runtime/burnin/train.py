"""The burn-in loop: a small GPT under FSDP2 that checkpoints with CheckpointManager, reports through StepMonitor
and logs one JSON line per step, and that resumes bit for bit after any rank is killed.

Each log line: step, loss (the mean over ranks), step_s (wall seconds), cpu_s (rank 0's process CPU seconds in
the step, every thread: on a host shared with other jobs, the part of the step their load does not stretch), tokens
(the whole group's), lr, restart (torchrun's restart count) and resumed_from (the checkpoint step this process
started from, or null).

What a checkpoint holds, so that the steps after a restart repeat the uninterrupted run exactly: the sharded model
and optimizer state (fp32 master weights, Adam moments and step counts), every rank's RNG state, and the data
position (batches are a pure function of the step, so the next step is the position); the learning rate is a pure
function of the step too.

With --measure-host, the host is measured in rounds between steps (`measure.measure_steps`), outside the steps'
timings, and the RNG state is set aside around each round: a measured run logs the same losses as one that is not.

SIGUSR1 asks the run to save and stop: what the Slurm job `gpufleet launch` writes passes on before its time limit,
then requeues the job, whose next allocation resumes from that checkpoint. The signal only sets a flag; the flag
travels in the step's own loss all-reduce (no extra collective), so every rank learns at the same step that some rank
was signalled, saves that step's checkpoint (blocking) and returns; the process exits 0. SIGTERM keeps its default:
torchrun sends it to stop the rest of a group whose worker died.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from gpufleet.runtime.burnin import data, measure
from gpufleet.runtime.burnin.config import BurninConfig, Identity, identity_from_env
from gpufleet.runtime.burnin.group import default_backend, device_for, join_group
from gpufleet.runtime.burnin.host_catalog import HostMeasurement
from gpufleet.runtime.burnin.model import build_model, loss_fn

LOG = logging.getLogger("gpufleet.burnin")
#: The signal that asks the burn-in to save a checkpoint and stop (what the emitted job.sbatch passes on before
#: Slurm's time limit; emit/slurm.py).
STOP_SIGNAL = signal.SIGUSR1


@dataclass(frozen=True)
class BurninResult:
    """What one process of the run did: the steps it ran, where it resumed, its step times (wall seconds, and its
    process CPU seconds), and on rank 0 of a --measure-host run the host's measurements."""

    rank: int
    world_size: int
    restart: int
    resumed_from: int | None
    first_step: int
    last_step: int
    final_loss: float | None
    step_s: tuple[float, ...]
    cpu_s: tuple[float, ...] = ()
    host: HostMeasurement | None = None
    #: the signal that stopped the run early, after saving a checkpoint at last_step (None: ran to the end)
    stopped_by: str | None = None

    @property
    def median_step_s(self) -> float | None:
        return statistics.median(self.step_s) if self.step_s else None


class StepLog:
    """Rank 0's JSON-lines log; each line goes out in one write(2) on an O_APPEND file, so a kill leaves whole
    lines only."""

    def __init__(self, path: os.PathLike[str] | str, enabled: bool) -> None:
        self.fd: int | None = None
        if enabled:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        if self.fd is not None:
            os.write(self.fd, (json.dumps(record) + "\n").encode())

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _state(model: Any, optimizer: Any, me: Identity, step: int) -> dict[str, Any]:
    """The checkpointed state of this rank (sharded DTensors for model and optimizer)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    rng = {f"rank{me.rank}": torch.get_rng_state()}
    if torch.cuda.is_initialized():
        rng[f"cuda{me.rank}"] = torch.cuda.get_rng_state()
    return {"model": model_state, "optim": optim_state, "rng": rng, "data": {"next_step": step + 1}, "step": step}


def _resume(manager: Any, model: Any, optimizer: Any, me: Identity) -> int | None:
    """Load the newest checkpoint into model, optimizer and RNG; the step it holds, or None for a fresh start."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    found = manager.load_latest(_state(model, optimizer, me, 0))
    if found is None:
        return None
    _, state = found
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    torch.set_rng_state(state["rng"][f"rank{me.rank}"])
    if f"cuda{me.rank}" in state["rng"]:
        torch.cuda.set_rng_state(state["rng"][f"cuda{me.rank}"])
    return int(state["data"]["next_step"]) - 1


class StopRequest:
    """Whether this process got STOP_SIGNAL: a handler that only sets a flag, installed from the main thread for the
    length of a run (the previous handler comes back afterwards)."""

    def __init__(self) -> None:
        self.signal: signal.Signals | None = None

    def _handler(self, signum: int, frame: object) -> None:
        self.signal = signal.Signals(signum)

    @contextmanager
    def installed(self) -> Iterator[StopRequest]:
        if threading.current_thread() is not threading.main_thread():  # signal.signal works only there
            yield self
            return
        previous = signal.signal(STOP_SIGNAL, self._handler)
        try:
            yield self
        finally:
            signal.signal(STOP_SIGNAL, previous)


def _train_step(model: Any, optimizer: Any, config: BurninConfig, me: Identity, step: int, table: torch.Tensor,
                device: torch.device, monitor: Any, stop: StopRequest) -> tuple[float, bool]:
    """One optimizer step; returns the loss averaged over every rank, and whether any rank has been asked to stop
    (the flag rides in the loss all-reduce)."""
    shape = config.shape
    inputs, targets = data.batch(config.seed, step, me.rank, config.micro_batch, shape.seq_len, shape.vocab, table)
    inputs, targets = inputs.to(device), targets.to(device)
    for group in optimizer.param_groups:
        group["lr"] = config.lr_at(step)
    with monitor.compute():
        loss = loss_fn(model(inputs), targets)
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    asked = torch.tensor([0.0 if stop.signal is None else 1.0], device=loss.device)
    summed = torch.cat([loss.detach().float().reshape(1), asked])
    dist.all_reduce(summed)
    return float(summed[0].item()) / me.world_size, bool(summed[1].item() > 0)


def run_burnin(config: BurninConfig) -> BurninResult:
    """Join the group, resume if a checkpoint exists, train to `config.steps`, checkpoint on the way; with
    `config.measure_host`, measure the host in rounds between the steps (`measure.measure_steps`). On STOP_SIGNAL,
    save the step every rank is at and return early (`stopped_by`)."""
    with StopRequest().installed() as stop:  # first: a signal during start-up stops the run after its first step
        return _run(config, stop)


def _run(config: BurninConfig, stop: StopRequest) -> BurninResult:
    from gpufleet.runtime.checkpoint import CheckpointManager
    from gpufleet.runtime.monitor.step_monitor import StepMonitor

    me = identity_from_env()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    backend = config.backend or default_backend()
    join_group(me, backend)
    device = device_for(backend, me)
    log = StepLog(config.log_file, enabled=me.rank == 0)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (me.world_size,))
        model = build_model(config.shape, mesh, config.seed, device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr_at(1), weight_decay=0.1)
        manager = CheckpointManager(config.checkpoint_dir, keep_last=config.keep_last)
        monitor = StepMonitor(plan=config.plan, port=config.metrics_port, rank=me.rank, local_rank=me.local_rank,
                              world_size=me.world_size)
        torch.manual_seed(config.seed + me.rank)  # the per-rank stream the checkpoint carries
        resumed = _resume(manager, model, optimizer, me)
        first = 1 if resumed is None else resumed + 1
        measuring = _Measuring(config, device, mesh, first)
        table = data.successor_table(config.shape.vocab, config.seed)
        tokens = config.micro_batch * config.shape.seq_len
        times: list[float] = []
        cpu_times: list[float] = []
        loss: float | None = None
        last, stopped = config.steps, False
        for step in range(first, config.steps + 1):
            measuring.before(step)
            started, started_cpu = time.perf_counter(), time.process_time()
            with monitor.step(tokens=tokens):
                loss, stopped = _train_step(model, optimizer, config, me, step, table, device, monitor, stop)
            times.append(time.perf_counter() - started)
            cpu_times.append(time.process_time() - started_cpu)
            log.write({"step": step, "loss": loss, "step_s": times[-1], "cpu_s": cpu_times[-1],
                       "tokens": tokens * me.world_size,
                       "lr": config.lr_at(step), "restart": me.restart, "resumed_from": resumed})
            if stopped or step % config.checkpoint_every == 0 or step == config.steps:
                with monitor.checkpoint():
                    manager.save(_state(model, optimizer, me, step), step, blocking=stopped or step == config.steps)
            if stopped:
                last = step
                if me.rank == 0:
                    LOG.warning("burn-in: %s: saved the checkpoint of step %d and stopped (run again to resume "
                                "from it)", STOP_SIGNAL.name, step)
                break
        manager.close()
        return BurninResult(me.rank, me.world_size, me.restart, resumed, first, last, loss, tuple(times),
                            tuple(cpu_times), measuring.result(me),
                            stopped_by=STOP_SIGNAL.name if stopped else None)
    finally:
        log.close()
        if dist.is_initialized():
            dist.destroy_process_group()


class _Measuring:
    """The host measurement rounds of a --measure-host run, before the steps `measure_steps` picks."""

    def __init__(self, config: BurninConfig, device: torch.device, mesh: Any, first: int) -> None:
        self.config, self.device, self.mesh = config, device, mesh
        rounds = config.measure_rounds if config.measure_host is not None else 0
        self.at = set(measure.measure_steps(first, config.steps, rounds))
        self.timer = measure.timer_for(config, device, len(self.at))
        self.rounds: list[list[float]] = []

    def before(self, step: int) -> None:
        if step in self.at:
            first_round = not self.rounds
            self.rounds.append(measure.measure_round(self.config, self.device, self.mesh, self.timer,
                                                     disk=first_round))

    def result(self, me: Identity) -> HostMeasurement | None:
        if me.rank != 0 or not self.rounds:
            return None
        return measure.host_measurement(self.config, self.rounds, me.world_size)
