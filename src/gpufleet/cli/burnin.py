"""`gpufleet burnin`: a small GPT trained with FSDP2 and crash-safe checkpoints, to burn in a cluster."""

from __future__ import annotations

from pathlib import Path

import typer

from gpufleet.cli.common import JsonOption
from gpufleet.cli.output import Output
from gpufleet.errors import InputError

BURNIN_HELP = """Train a small GPT (plain PyTorch, FSDP2 fully_shard over every rank, AdamW) on synthetic data,
checkpointing with CheckpointManager and writing one JSON line per step ({"step", "loss", "restart"}) to
--log-file. It resumes from the newest checkpoint in --checkpoint-dir, and the batches depend only on the seed,
the step and the rank: a group restarted after a lost worker logs the same losses the uninterrupted run logs.
Under torchrun (NCCL on GPUs, gloo on CPUs), under srun, or alone (one process).

Examples:

    torchrun --nproc-per-node 8 --max-restarts 3 -m gpufleet burnin --steps 200 --checkpoint-dir /ckpt/burnin
    --log-file burnin.jsonl

    gpufleet burnin --steps 20 --checkpoint-dir /tmp/burnin --log-file /tmp/burnin.jsonl
"""


def burnin_command(
    steps: int = typer.Option(..., "--steps", min=1, help="Train until this step."),
    checkpoint_dir: Path = typer.Option(..., "--checkpoint-dir", help="Checkpoints (resumed from when present)."),
    log_file: Path = typer.Option(..., "--log-file", help="One JSON line per step, appended (rank 0)."),
    checkpoint_every: int = typer.Option(5, "--checkpoint-every", min=1, help="Steps between checkpoints."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the weights and the data."),
    layers: int = typer.Option(2, "--layers", min=1, help="Transformer blocks."),
    hidden: int = typer.Option(128, "--hidden", min=8, help="Hidden size (a multiple of --heads)."),
    heads: int = typer.Option(4, "--heads", min=1, help="Attention heads."),
    seq_len: int = typer.Option(64, "--seq-len", min=8, help="Tokens per sequence."),
    micro_batch: int = typer.Option(4, "--micro-batch", min=1, help="Sequences per rank per step."),
    json_out: bool = JsonOption,
) -> None:
    if hidden % heads:
        raise InputError(f"--hidden {hidden} must be a multiple of --heads {heads}")
    if log_file.is_dir():
        raise InputError(f"--log-file {log_file} is a folder; give a file name")
    import os

    from gpufleet.runtime.burnin.model import GPTConfig
    from gpufleet.runtime.burnin.run import BurninRequest, run_burnin

    config = GPTConfig(layers=layers, hidden=hidden, heads=heads, seq_len=seq_len, micro_batch=micro_batch)
    result = run_burnin(BurninRequest(steps, checkpoint_dir, log_file, checkpoint_every, seed, config=config))
    if os.environ.get("RANK", "0") != "0":
        return
    data = {"resumed_from": result.resumed_from, "last_step": result.last_step, "last_loss": result.last_loss,
            "step_s": result.step_s}
    Output(json_mode=json_out).emit(data, lambda console: console.print(
        f"burnin: steps {(result.resumed_from or 0) + 1}..{result.last_step}"
        f"{f' (resumed from {result.resumed_from})' if result.resumed_from else ''}, last loss "
        f"{result.last_loss if result.last_loss is not None else '-'}, {result.step_s * 1e3:.1f} ms/step"))


def register(app: typer.Typer) -> None:
    app.command("burnin", help=BURNIN_HELP)(burnin_command)
