"""The few measurements that describe a host to the planner, taken under torchrun with every rank busy at once (so
each rank sees the share of cores, caches and memory it will have while training), at the burn-in model's own sizes:

* GEMMs in bf16: a large square GEMM sets the peak; the model's forward GEMM shapes fit the shape curve's half
  dimension (gpufleet's compute model: efficiency = Π d/(d + d½));
* causal scaled-dot-product attention, forward + backward, as a fraction of that peak (FLOPs counted the way the
  compute model counts them: 2.5x forward for the backward);
* the element-wise kernels the compute model prices by bytes (LayerNorm, GELU, residual add): bytes / time;
* the collectives FSDP2 runs (all-gather of a block's bf16 parameters, reduce-scatter of its fp32 gradients):
  bus bandwidth by nccl-tests' definition (bus bytes / time, latency included at these sizes);
* the same collectives as FSDP2 runs them: one block under `fully_shard` (its two all-gathers, reduce-scatter, the
  copies into and out of the communication buffers, the hooks) over a single token, less the same block without
  FSDP over a single token (its compute, next to nothing at one token);
* the optimizer (AdamW, as the burn-in builds it) over the FSDP2-sharded model's own parameters: seconds per local
  parameter, per-tensor dispatch on the sharded (DTensor) parameters included;
* disk at the checkpoint folder: sequential write with fsync, then read, of one checkpoint's size (first round).

The measurements run in rounds between the burn-in's own training steps (`measure_steps`: one before the first step,
the rest spread over the run), in the training's process group, with the RNG state set aside so that training is
unchanged. A round's figure is the slowest rank's mean over repetitions (collectives every block make every rank
wait for the slowest, and a step's time is a sum of kernel times, delays included); the host's figure is the median
over rounds, as the burn-in's step is the median over steps. Other jobs on a shared host then weigh on both sides
alike: one round measured during a neighbour's burst moves the median as little as one slow step moves the
burn-in's (`scripts/burnin_loop.py --load 4 --bursty` shows the difference).
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpufleet.runtime.burnin.config import BurninConfig
from gpufleet.runtime.burnin.host_catalog import HostMeasurement

#: Each timed kernel runs until this much time has passed over all rounds (and at least MIN_REPEATS times a round),
#: after two warm-up runs (judgement: long enough that a busy neighbour's share of the cores shows in the mean as it
#: does in a step).
MIN_MEASURE_S = 0.25
MIN_REPEATS = 3
#: Collectives run a fixed count instead (every rank must call each one equally often), shared out over the rounds
#: too (at least MIN_REPEATS a round).
COLLECTIVE_REPEATS = 10
#: The square GEMM that sets the peak (judgement: large enough to leave the shape curve's knee on any CPU or GPU).
PEAK_GEMM_DIM = 2048


#: The clocks a measurement can read: wall time (what a dedicated machine's step takes) or this process's CPU
#: time (user + system, every thread): on a host shared with other jobs the latter leaves their load out.
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def _no_sync() -> None:
    return None


@dataclass(frozen=True)
class Timer:
    """How one round times its kernels: the clock, the device sync around each timing, the wall time each kernel
    runs for and the count each collective runs (MIN_MEASURE_S and COLLECTIVE_REPEATS shared out over the rounds,
    so that more rounds take little longer in all)."""

    clock: str = "wall"
    sync: Callable[[], None] = _no_sync
    min_measure_s: float = MIN_MEASURE_S
    collective_repeats: int = COLLECTIVE_REPEATS

    def mean_s(self, run: Callable[[], Any], repeats: int | None = None) -> float:
        """Mean seconds of `run()` (after two warm-up calls) over at least MIN_REPEATS calls and `min_measure_s`
        of wall time, or exactly `repeats` calls: the mean, not the median, since a step's time is the sum of its
        kernels' times, delays included."""
        read = CLOCKS[self.clock]
        for _ in range(2):
            run()
        self.sync()
        done, started, started_wall = 0, read(), time.perf_counter()
        while (done < repeats if repeats is not None
               else done < MIN_REPEATS or time.perf_counter() - started_wall < self.min_measure_s):
            run()
            done += 1
            self.sync()
        return (read() - started) / done


def timer_for(config: BurninConfig, device: torch.device, rounds: int = 1) -> Timer:
    sync = torch.cuda.synchronize if device.type == "cuda" else _no_sync
    rounds = max(1, rounds)
    return Timer(clock=config.measure_clock, sync=sync, min_measure_s=MIN_MEASURE_S / rounds,
                 collective_repeats=max(MIN_REPEATS, math.ceil(COLLECTIVE_REPEATS / rounds)))


def measure_steps(first: int, last: int, rounds: int) -> tuple[int, ...]:
    """The steps before which a measurement round runs: the first step, then the rest spread evenly over the steps
    `first`..`last` (fewer rounds than asked when there are fewer steps; none when there are no steps)."""
    steps = last - first + 1
    if steps < 1 or rounds < 1:
        return ()
    return tuple(sorted({first + (k * steps) // rounds for k in range(rounds)}))


def model_gemm_shapes(config: BurninConfig) -> list[tuple[int, int, int, int]]:
    """(m, n, k, count per step) of every GEMM one rank runs in a step: each forward GEMM (QKV, attention out, MLP
    up and down per block; the output head once) and its two backward GEMMs (input gradient m x k x n, weight
    gradient n x k x m... as (n, k, m)). A MoE block's MLP is each expert's up and down over the tokens routed to it,
    taken as balanced (tokens x top_k / experts, rounded up: what the planner assumes) and counted once per expert;
    its router (tokens x experts x hidden) is left out, as the planner prices it apart from the shape curve."""
    s = config.shape
    tokens = config.micro_batch * s.seq_len
    if s.moe:
        routed = -(-tokens * s.top_k // s.experts)
        mlp = [(routed, s.ffn_hidden, s.hidden, s.layers * s.experts),
               (routed, s.hidden, s.ffn_hidden, s.layers * s.experts)]
    else:
        mlp = [(tokens, s.ffn_hidden, s.hidden, s.layers), (tokens, s.hidden, s.ffn_hidden, s.layers)]
    forward = [(tokens, 3 * s.hidden, s.hidden, s.layers), (tokens, s.hidden, s.hidden, s.layers), *mlp,
               (tokens, s.vocab, s.hidden, 1)]
    return [shape for m, n, k, count in forward for shape in ((m, n, k, count), (m, k, n, count), (n, k, m, count))]


def gemm_flop_per_s(m: int, n: int, k: int, device: torch.device, timer: Timer) -> float:
    a = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    b = torch.randn(k, n, dtype=torch.bfloat16, device=device)
    return 2 * m * n * k / timer.mean_s(lambda: a @ b)


def attention_flop_per_s(config: BurninConfig, device: torch.device, timer: Timer) -> float:
    """Causal SDPA forward + backward at the model's shape; FLOPs as gpufleet's compute model counts them
    (causal forward: 2·s·heads·2·head_dim / 2 per token, backward 2.5x the forward)."""
    s = config.shape
    head_dim = s.hidden // s.heads
    q, k, v = (torch.randn(config.micro_batch, s.heads, s.seq_len, head_dim, dtype=torch.bfloat16, device=device,
                           requires_grad=True) for _ in range(3))
    grad = torch.randn_like(q)

    def run() -> None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)

    tokens = config.micro_batch * s.seq_len
    forward_flops = tokens * 2 * s.seq_len * s.heads * 2 * head_dim / 2
    return forward_flops * (1 + 2.5) / timer.mean_s(run)


def elementwise_bytes_per_s(config: BurninConfig, device: torch.device, timer: Timer) -> float:
    """The bandwidth with which gpufleet's compute model reproduces the time of one block's element-wise kernels,
    forward and backward: the model charges 12 passes over the hidden width (norms, residual adds) and 2 over the
    MLP width (activation) forward, in bf16, and twice that backward; measured here are the kernels the block
    runs for them (two LayerNorms, GELU, two residual adds), forward and backward through autograd. In a MoE block
    the activation runs over every routed copy of a token (top_k of them): an MLP width of top_k x ffn_hidden, as
    the compute model counts it."""
    s = config.shape
    tokens = config.micro_batch * s.seq_len
    width = s.top_k * s.ffn_hidden if s.moe else s.ffn_hidden
    x = torch.randn(tokens, s.hidden, dtype=torch.bfloat16, device=device, requires_grad=True)
    wide = torch.randn(tokens, width, dtype=torch.bfloat16, device=device, requires_grad=True)
    weight = torch.ones(s.hidden, dtype=torch.bfloat16, device=device, requires_grad=True)

    def run() -> None:
        first = F.layer_norm(x, (s.hidden,), weight) + x
        second = F.layer_norm(first, (s.hidden,), weight) + first
        (second.sum() + F.gelu(wide).sum()).backward()

    forward_bytes = 2 * tokens * (12 * s.hidden + 2 * width)
    return 3 * forward_bytes / timer.mean_s(run)


def block_parameters(config: BurninConfig, world: int) -> int:
    """Parameters of one block, padded to a multiple of the `world` ranks (as the collectives move them)."""
    return math.ceil(config.shape.block_params() / world) * world


def collective_busbw(config: BurninConfig, device: torch.device, timer: Timer) -> tuple[float, float]:
    """(all-gather, reduce-scatter) bus bandwidth at one block's parameter count: bf16 gather, fp32 reduce."""
    world = dist.get_world_size()
    shard = block_parameters(config, world) // world
    local = torch.randn(shard, dtype=torch.bfloat16, device=device)
    gathered = torch.empty(shard * world, dtype=torch.bfloat16, device=device)
    grads = torch.randn(shard * world, dtype=torch.float32, device=device)
    reduced = torch.empty(shard, dtype=torch.float32, device=device)
    factor = (world - 1) / world  # nccl-tests' bus factor for both
    from gpufleet.runtime.bench.collectives import tensor_collectives

    all_gather, reduce_scatter = tensor_collectives(dist)
    gather_s = timer.mean_s(lambda: all_gather(gathered, local), timer.collective_repeats)
    reduce_s = timer.mean_s(lambda: reduce_scatter(reduced, grads), timer.collective_repeats)
    return gathered.numel() * 2 * factor / gather_s, grads.numel() * 4 * factor / reduce_s


def fsdp_block_comm_s(config: BurninConfig, device: torch.device, mesh: Any, timer: Timer) -> float:
    """Seconds per micro-batch that FSDP2's handling of one block adds (all-gather before forward and again before
    backward, reduce-scatter after it, with their buffer copies and hooks): one block under `fully_shard` (inside a
    parameterless root, so that it reshards after forward as the burn-in's blocks do) run forward and backward over
    one token, less the same block unsharded in bf16 over one token. Both run a fixed count (every rank must
    all-gather equally often)."""
    from torch import nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from gpufleet.runtime.burnin.model import Block

    s = config.shape
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    sharded = nn.Sequential(Block(s).to(device))
    fully_shard(sharded[0], mesh=mesh, mp_policy=policy)
    fully_shard(sharded, mesh=mesh, mp_policy=policy)
    plain = Block(s).to(device=device, dtype=torch.bfloat16)

    def one_token(module: nn.Module, dtype: torch.dtype) -> Callable[[], None]:
        x = torch.randn(1, 1, s.hidden, dtype=dtype, device=device, requires_grad=True)

        def run() -> None:
            module(x).float().sum().backward()
            module.zero_grad(set_to_none=True)
        return run

    with_fsdp = timer.mean_s(one_token(sharded, torch.float32), timer.collective_repeats)
    without = timer.mean_s(one_token(plain, torch.bfloat16), timer.collective_repeats)
    return max(with_fsdp - without, 0.0)


def optimizer_s_per_param(config: BurninConfig, device: torch.device, mesh: Any, timer: Timer) -> float:
    """Seconds per local parameter of one AdamW step (the optimizer the burn-in builds) over the FSDP2-sharded burn-in
    model. Each timed step follows a forward and backward over one token (untimed), as in training, where the step
    finds the gradients FSDP2 just reduce-scattered (measured: back-to-back steps alone ran 1.2-2x slower per step on
    the CI machine); the mean over the timer's fixed count of steps (the backward's collectives need one)."""
    from gpufleet.runtime.burnin.model import build_model, loss_fn

    model = build_model(config.shape, mesh, config.seed, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr_at(1), weight_decay=0.1)
    token = torch.zeros(1, 1, dtype=torch.long, device=device)
    read = CLOCKS[timer.clock]
    local = sum(param.to_local().numel() if hasattr(param, "to_local") else param.numel()
                for param in model.parameters())
    spent = 0.0
    for repeat in range(2 + timer.collective_repeats):  # two warm-up steps first
        loss_fn(model(token), token).backward()
        timer.sync()
        started = read()
        optimizer.step()
        timer.sync()
        spent += read() - started if repeat >= 2 else 0.0
        optimizer.zero_grad(set_to_none=True)
    return spent / timer.collective_repeats / local


def disk_bytes_per_s(folder: Path, size_bytes: int) -> tuple[float, float]:
    """Sequential write (with fsync) then read of one file of `size_bytes` in `folder` (deleted after)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f".gpufleet-disk-probe-{os.getpid()}"
    block = os.urandom(1 << 20)
    try:
        started = time.perf_counter()
        with open(path, "wb") as handle:
            for _ in range(max(1, size_bytes >> 20)):
                handle.write(block)
            handle.flush()
            os.fsync(handle.fileno())
        write_s = time.perf_counter() - started
        written = path.stat().st_size
        with open(path, "rb") as handle:
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # read the disk, not the page cache
            started = time.perf_counter()
            while handle.read(1 << 22):
                pass
        read_s = time.perf_counter() - started
    finally:
        path.unlink(missing_ok=True)
    return written / write_s, written / read_s


def checkpoint_bytes(config: BurninConfig) -> int:
    """One checkpoint of the burn-in model: fp32 weights and Adam's two fp32 moments."""
    return 12 * config.shape.params()


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _local_figures(config: BurninConfig, device: torch.device, mesh: Any, timer: Timer, disk: bool) -> list[float]:
    """This rank's figures for one round, each as a rate (so that the slowest rank's is the smallest; seconds
    inverted, 0 s as infinity), in the order `host_measurement` reads them; the disk's as NaN (not measured) when
    `disk` is false."""
    peak = gemm_flop_per_s(PEAK_GEMM_DIM, PEAK_GEMM_DIM, PEAK_GEMM_DIM, device, timer)
    shapes = [gemm_flop_per_s(m, n, k, device, timer) for m, n, k, _ in model_gemm_shapes(config)]
    attention = attention_flop_per_s(config, device, timer)
    elementwise = elementwise_bytes_per_s(config, device, timer)
    gather, reduce = collective_busbw(config, device, timer)
    fsdp_s = fsdp_block_comm_s(config, device, mesh, timer)
    optimizer_s = optimizer_s_per_param(config, device, mesh, timer)
    write, read = (disk_bytes_per_s(Path(config.checkpoint_dir), checkpoint_bytes(config) // dist.get_world_size())
                   if disk else (math.nan, math.nan))
    return [peak, *shapes, attention, elementwise, gather, reduce, 1 / fsdp_s if fsdp_s > 0 else math.inf,
            1 / optimizer_s, write, read]


def measure_round(config: BurninConfig, device: torch.device, mesh: Any, timer: Timer,
                  disk: bool = True) -> list[float]:
    """One round on every rank at once, inside the training's process group (every rank must call it at the same
    step): the slowest rank's figure for each, on every rank. The RNG state is set aside around it (the kernels'
    random inputs and the measured model's initialisation must not change what training draws) and what it
    allocated is freed. `disk`: also write and read one checkpoint's share at the checkpoint folder (the first
    round only: the disk prices the checkpoint, not the step, so pairing it with the steps buys nothing, and each
    probe writes a checkpoint's worth)."""
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        mine = torch.tensor(_local_figures(config, device, mesh, timer, disk), dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)  # on the device: NCCL gathers device tensors only
    slowest: list[float] = torch.stack(every).min(dim=0).values.cpu().tolist()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return slowest


def host_measurement(config: BurninConfig, rounds: Sequence[Sequence[float]], ranks: int) -> HostMeasurement:
    """The host's figures: each the median over the rounds that measured it (NaN: not in that round) of the slowest
    rank's (module docstring)."""
    figures = [statistics.median([value for value in values if not math.isnan(value)] or [math.nan])
               for values in zip(*rounds, strict=True)]
    shapes = model_gemm_shapes(config)
    rates = figures[1:1 + len(shapes)]
    peak = max(figures[0], *rates)
    attention, elementwise, gather, reduce, fsdp_rate, optimizer_rate, write, read = figures[1 + len(shapes):]
    import socket

    return HostMeasurement(
        hostname=socket.gethostname(), cpu=_cpu_name(), ranks=ranks, threads_per_rank=torch.get_num_threads(),
        peak_gemm_flop_per_s=peak,
        gemm_shapes=tuple((m, n, k, count, rate) for (m, n, k, count), rate in zip(shapes, rates, strict=True)),
        attention_flop_per_s=attention, elementwise_bytes_per_s=elementwise, allgather_busbw_bytes_per_s=gather,
        reduce_scatter_busbw_bytes_per_s=reduce, disk_write_bytes_per_s=write, disk_read_bytes_per_s=read,
        fsdp_block_comm_s=1 / fsdp_rate if math.isfinite(fsdp_rate) else 0.0, optimizer_s_per_param=1 / optimizer_rate,
        block_params=block_parameters(config, ranks),
        ram_bytes=float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
        date=time.strftime("%Y-%m-%d", time.gmtime()), clock=config.measure_clock, rounds=len(rounds))
