"""`gpufleet burnin`: the burn-in job (a small GPT under FSDP2 that checkpoints, reports metrics and survives a
killed worker), run under torchrun; with --measure-host, the host measurements that price it in the planner."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from gpufleet.cli.common import JsonOption
from gpufleet.cli.output import Output
from gpufleet.extras import require_extra
from gpufleet.runtime.burnin.config import DEFAULT_MEASURE_ROUNDS, MAX_MEASURE_ROUNDS

if TYPE_CHECKING:
    from gpufleet.runtime.burnin.config import BurninConfig
    from gpufleet.runtime.burnin.train import BurninResult

HELP = """Train the burn-in GPT under torchrun: FSDP2, CheckpointManager, StepMonitor, one JSON line per step.

A killed worker is survivable: torchrun (--max-restarts) restarts the group, which resumes from the newest checkpoint
and repeats the uninterrupted run's losses exactly (on CPU).

Examples:

    torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 --max-restarts 3 \\
        -m gpufleet burnin --steps 50 --checkpoint-dir ckpt --log-file burnin.jsonl

    torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 \\
        -m gpufleet burnin --measure-host host.yaml --steps 24   # ends: plan vs measured step

    torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 \\
        -m gpufleet burnin --experts 4 --top-k 2 --measure-host host.yaml --steps 24   # the same for a MoE model

With --measure-host the host is measured in rounds between the training steps (--measure-rounds), the catalog file
is written at the end, and the planner's step time for the burn-in's own layout on it is printed next to the
measured one: the loop plan -> run -> measure -> plan again, on your own machine.

gloo on CPU, NCCL on GPUs (--backend to choose). Flags are spelled so that none is a prefix of a torchrun option.
"""


Steps = Annotated[int, typer.Option("--steps", help="Train to this step (a resumed run continues to it).")]
CheckpointDir = Annotated[Path, typer.Option("--checkpoint-dir", help="Checkpoint folder.")]
LogFile = Annotated[Path, typer.Option("--log-file", help="JSON lines, one per step (rank 0 appends).")]
CheckpointEvery = Annotated[int, typer.Option("--checkpoint-every", help="Save every N steps (and at the end).")]
KeepLast = Annotated[int, typer.Option("--keep-last", help="Checkpoints kept.")]
MicroBatch = Annotated[int, typer.Option("--micro-batch", help="Sequences per rank per step.")]
Layers = Annotated[int, typer.Option("--layers", help="Transformer blocks.")]
Hidden = Annotated[int, typer.Option("--hidden", help="Model width.")]
Heads = Annotated[int, typer.Option("--heads", help="Attention heads.")]
FfnHidden = Annotated[int, typer.Option("--ffn-hidden", help="MLP width.")]
Vocab = Annotated[int, typer.Option("--vocab", help="Vocabulary size.")]
SeqLen = Annotated[int, typer.Option("--seq-len", help="Tokens per sequence.")]
Experts = Annotated[int, typer.Option(
    "--experts", help="Routed experts per block (0: a dense MLP). With N > 0 every block's MLP is a mixture of N "
    "GELU experts of width --ffn-hidden, every rank computing every expert (no expert parallelism).")]
TopK = Annotated[int, typer.Option("--top-k", help="Experts per token (with --experts).")]
Lr = Annotated[float, typer.Option("--lr", help="Peak learning rate (AdamW).")]
WarmupSteps = Annotated[int, typer.Option("--warmup-steps", help="Linear warm-up steps.")]
Seed = Annotated[int, typer.Option("--seed", help="Seed of weights and data.")]
Threads = Annotated[int, typer.Option("--threads", help="torch threads per rank (0: torch's default).")]
Backend = Annotated[str | None, typer.Option("--backend", help="gloo or nccl (default: nccl with CUDA, else gloo).")]
MetricsPort = Annotated[int | None, typer.Option(
    "--metrics-port", help="Serve StepMonitor's metrics on this port + local rank.")]
PlanFile = Annotated[Path | None, typer.Option(
    "--plan", help="A `gpufleet plan --json` file to compare step times with.")]
MeasureHost = Annotated[Path | None, typer.Option(
    "--measure-host", help="Measure this host (GEMMs at the model's shapes, attention, "
    "element-wise kernels, the collectives as FSDP2 runs them, the optimizer, "
    "disk at --checkpoint-dir) between the training steps, write a catalog "
    "YAML file for it at the end, and compare the plan's step with the run's.")]
MeasureRounds = Annotated[int, typer.Option(
    "--measure-rounds", help="Measurement rounds spread over the run (each figure is the median "
    "over rounds, as the step is the median over steps; more rounds take no "
    f"longer in all). 1 to {MAX_MEASURE_ROUNDS}.")]
MeasureClock = Annotated[str, typer.Option(
    "--measure-clock", help="What --measure-host times with: wall seconds, or cpu seconds of "
    "each process (on a host other jobs share; compare with the log's cpu_s).")]


def burnin(
    steps: Steps = 20, checkpoint_dir: CheckpointDir = Path("burnin-ckpt"), log_file: LogFile = Path("burnin.jsonl"),
    checkpoint_every: CheckpointEvery = 5, keep_last: KeepLast = 2, micro_batch: MicroBatch = 4, layers: Layers = 2,
    hidden: Hidden = 128, heads: Heads = 4, ffn_hidden: FfnHidden = 512, vocab: Vocab = 512, seq_len: SeqLen = 64,
    experts: Experts = 0, top_k: TopK = 2, lr: Lr = 3e-3, warmup_steps: WarmupSteps = 10, seed: Seed = 1234,
    threads: Threads = 1, backend: Backend = None,
    metrics_port: MetricsPort = None, plan: PlanFile = None, measure_host: MeasureHost = None,
    measure_rounds: MeasureRounds = DEFAULT_MEASURE_ROUNDS, measure_clock: MeasureClock = "wall",
    json_output: bool = JsonOption,
) -> None:
    from gpufleet.runtime.burnin.config import BurninConfig, ModelShape, identity_from_env

    out = Output(json_mode=json_output)
    shape = ModelShape(layers=layers, hidden=hidden, heads=heads, ffn_hidden=ffn_hidden, vocab=vocab,
                       seq_len=seq_len, experts=experts, top_k=top_k)
    config = BurninConfig(steps=steps, checkpoint_dir=checkpoint_dir, log_file=log_file, shape=shape,
                          micro_batch=micro_batch, checkpoint_every=checkpoint_every, keep_last=keep_last, lr=lr,
                          warmup_steps=warmup_steps, seed=seed, threads=threads or None,
                          metrics_port=metrics_port, plan=plan, backend=backend,
                          measure_clock=measure_clock, measure_host=measure_host, measure_rounds=measure_rounds)
    require_extra("torch", "`gpufleet burnin`")  # before saying how to launch: torchrun comes with torch
    identity_from_env()  # outside torchrun: say how to launch, before torch is imported
    from gpufleet.runtime.burnin.train import run_burnin

    result = run_burnin(config)
    if result.rank != 0:
        return
    host = _write_host(out, config, result)
    data = {"rank": result.rank, "world_size": result.world_size, "restart": result.restart,
            "resumed_from": result.resumed_from, "first_step": result.first_step, "last_step": result.last_step,
            "final_loss": result.final_loss, "median_step_s": result.median_step_s, "host": host}
    out.emit(data, lambda console: _render(console, config, result))


def _render(console: Console, config: BurninConfig, result: BurninResult) -> None:
    where = "a fresh start" if result.resumed_from is None else f"checkpoint step {result.resumed_from}"
    median = "-" if result.median_step_s is None else f"{result.median_step_s:.4f} s"
    loss = "-" if result.final_loss is None else f"{result.final_loss:.4f}"
    console.print(f"burn-in: {result.world_size} ranks, steps {result.first_step}-{result.last_step} from "
                  f"{where}; final loss {loss}; median step {median}; log {config.log_file}")


def register(app: typer.Typer) -> None:
    app.command("burnin", help=HELP)(burnin)


def _write_host(out: Output, config: BurninConfig, result: BurninResult) -> dict[str, object] | None:
    """Rank 0 of a --measure-host run: write the host catalog, price the burn-in's layout on it against the measured
    step; the figures for --json (None when the host was not measured)."""
    from gpufleet.catalog.registry import Catalog
    from gpufleet.planner.fixed_layout import eager_fsdp_plan
    from gpufleet.runtime.burnin.group import default_backend
    from gpufleet.runtime.burnin.host_catalog import HOST_GPU_ID, HOST_NODE_ID, write_host_catalog
    from gpufleet.runtime.burnin.loop import LoopCheck, measured_step

    if result.host is None or config.measure_host is None:
        return None
    write_host_catalog(config.measure_host, result.host, config.shape)
    on_gpu = (config.backend or default_backend()) == "nccl"
    planned = eager_fsdp_plan(Catalog((config.measure_host,)), config.shape.model_id, HOST_GPU_ID, HOST_NODE_ID,
                              result.world_size, config.shape.seq_len, config.micro_batch, overlap=on_gpu)
    step = planned.step
    check = LoopCheck(predicted_s=step.step_s, parts_s={name: part.exposed_s for name, part in step.parts.items()},
                      measured_s=measured_step(result.cpu_s if config.measure_clock == "cpu" else result.step_s),
                      clock=config.measure_clock, interval_s=(planned.interval.low, planned.interval.high))
    if not out.json_mode:
        out.console.print(result.host.summary() + f"\nwrote {config.measure_host}\n" + check.summary())
    return {"catalog": str(config.measure_host), "measured": result.host.as_dict(),
            "loop": {"predicted_step_s": check.predicted_s, "measured_step_s": check.measured_s,
                     "ratio": check.ratio, "clock": check.clock, "parts_s": dict(check.parts_s),
                     "interval": planned.interval.as_json()}}
