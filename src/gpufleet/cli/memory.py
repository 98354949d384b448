"""`gpufleet memory`: memory per GPU for each pipeline stage of a layout, and whether it fits in HBM."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.cli.common import CalibrationOption, CatalogOption, JsonOption, open_catalog, with_calibration
from gpufleet.cli.output import Output
from gpufleet.parallel.layout import RECOMPUTES, SHARDINGS
from gpufleet.parallel.memory import TRAINING_PRECISIONS
from gpufleet.parallel.memory_request import MemoryRequest
from gpufleet.planner.memory_report import MemoryReport, memory_report

GIB = 2**30
_KINDS = ("weights", "gradients", "optimizer", "activations", "buffers", "overhead")
_HEADERS = ("weights", "grads", "optim", "activ", "buffers", "overhead")

Model = Annotated[str, typer.Option("--model", "-m", help="Model id (`gpufleet catalog list models`).")]
Gpu = Annotated[str, typer.Option("--gpu", "-g", help="GPU id (`gpufleet catalog list gpus`).")]
Gpus = Annotated[int, typer.Option("--gpus", "-n", min=1, help="GPUs in the job.")]
Tp = Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel degree.")]
Pp = Annotated[int, typer.Option("--pp", min=1, help="Pipeline-parallel degree.")]
Cp = Annotated[int, typer.Option("--cp", min=1, help="Context-parallel degree.")]
Ep = Annotated[int, typer.Option("--ep", min=1, help="Expert-parallel degree (MoE; carved out of dp·cp·tp).")]
Vpp = Annotated[int, typer.Option("--vpp", min=1, help="Virtual stages per pipeline rank (interleaved 1F1B).")]
Dp = Annotated[int | None, typer.Option(
    "--dp", min=1, help="Data-parallel degree [default: GPUs/(tp·pp·cp)].")]
Seq = Annotated[int, typer.Option("--seq", min=1, help="Sequence length, tokens.")]
MicroBatch = Annotated[int, typer.Option("--micro-batch", min=1, help="Sequences per micro-batch.")]
GlobalBatch = Annotated[int | None, typer.Option(
    "--global-batch", min=1,
    help="Sequences per optimizer step [default: dp·micro-batch·pp, enough to fill the pipeline].")]
RecomputeFlag = Annotated[str, typer.Option("--recompute", help=f"One of {', '.join(RECOMPUTES)}.")]
SelectivePolicyFlag = Annotated[str | None, typer.Option(
    "--selective-policy", help="What --recompute selective keeps: attention (Megatron: everything but "
    "the attention core; the default) or op (torchtitan's op-level checkpointing: the block input, the "
    "attention output and every second matmul output).")]
StackFlag = Annotated[str | None, typer.Option(
    "--stack", help="A framework's documented memory settings (gradient dtype, FSDP2's fp32 "
    "parameters, recompute policy, DTensor TP): a catalog stack id (gpufleet catalog list stacks). Explicit "
    "flags override it.")]
RecomputeLayers = Annotated[int | None, typer.Option(
    "--recompute-layers", min=1, help="With --recompute full: recompute only this many layers of each "
    "pipeline chunk (virtual stage; Megatron's block method) [default: all].")]
OffloadActivations = Annotated[int | None, typer.Option(
    "--offload-activations", min=1, help="Keep this many layers' activations in CPU memory "
    "(Megatron-Core's --cpu-offloading-num-layers; pp 1, no recompute).")]
ExpertTp = Annotated[int | None, typer.Option(
    "--expert-tp", min=1, help="MoE: tensor parallelism inside the experts [default: tp when ep "
    "divides dp·cp, else 1].")]
DtensorTp = Annotated[bool | None, typer.Option(
    "--dtensor-tp/--megatron-tp", help="Tensor parallelism as PyTorch DTensor runs it (torchtitan): "
    "under sequence parallelism each column GEMM keeps its all-gathered input; or as Megatron keeps it, the "
    "1/tp shard [default: Megatron, or the --stack's].")]
ShardingFlag = Annotated[str, typer.Option("--sharding", help=f"One of {', '.join(SHARDINGS)}.")]
HsdpGroup = Annotated[int, typer.Option("--hsdp-group", min=2, help="FSDP shard-group size for hsdp.")]
PrecisionFlag = Annotated[str, typer.Option("--precision", help=f"One of {', '.join(TRAINING_PRECISIONS)}.")]
SequenceParallel = Annotated[bool, typer.Option(
    "--sequence-parallel/--no-sequence-parallel", help="Megatron sequence parallelism (tp > 1).")]
OffloadOptimizer = Annotated[bool, typer.Option("--offload-optimizer", help="Optimizer states on CPU.")]


def memory(
    model: Model, gpu: Gpu, gpus: Gpus, tp: Tp = 1, pp: Pp = 1, cp: Cp = 1, ep: Ep = 1, vpp: Vpp = 1, dp: Dp = None,
    seq: Seq = 4096, micro_batch: MicroBatch = 1, global_batch: GlobalBatch = None, recompute: RecomputeFlag = "none",
    selective_policy: SelectivePolicyFlag = None, stack: StackFlag = None, recompute_layers: RecomputeLayers = None,
    offload_activations: OffloadActivations = None, expert_tp: ExpertTp = None, dtensor_tp: DtensorTp = None,
    sharding: ShardingFlag = "none", hsdp_group: HsdpGroup = 8, precision: PrecisionFlag = "bf16",
    sequence_parallel: SequenceParallel = True, offload_optimizer: OffloadOptimizer = False,
    catalog: list[Path] = CatalogOption, calibration: Path | None = CalibrationOption, json: bool = JsonOption,
) -> None:
    """Memory per GPU for every pipeline stage, and fit / no-fit against the GPU's HBM.

    Exit 0 when the worst stage fits, 1 when it does not, 2 for bad input.

    Example: `gpufleet memory -m llama3-70b -g h100-sxm -n 64 --tp 8 --pp 2 --sharding zero1`
    """
    cat = open_catalog(with_calibration(catalog, calibration))
    request = MemoryRequest(
        model=model, gpu=gpu, gpus=gpus, tp=tp, pp=pp, cp=cp, ep=ep, vpp=vpp, dp=dp, seq=seq, micro_batch=micro_batch,
        global_batch=global_batch, recompute=recompute, selective_policy=selective_policy, stack=stack,
        recompute_layers=recompute_layers, offload_activations=offload_activations, expert_tp=expert_tp,
        dtensor_tp=dtensor_tp, sharding=sharding, hsdp_group=hsdp_group, precision=precision,
        sequence_parallel=sequence_parallel, offload_optimizer=offload_optimizer,
    )
    report = memory_report(request, cat)
    out = Output(json)
    for problem in report.problems():
        out.check_failed(problem, report.data, lambda console: _render(console, report))
    out.emit(report.data, lambda console: _render(console, report))


def _render(console: Console, report: MemoryReport) -> None:
    data, request = report.data, report.request
    table = Table(
        title=f"{report.model.id} on {request.gpus}x {report.gpu.id}: {report.layout.short()}, seq {request.seq}, "
        f"global batch {request.batch}, {request.precision} — GiB per GPU",
        title_justify="left",
    )
    table.add_column("stage", justify="right")
    for header in _HEADERS:
        table.add_column(header, justify="right")
    table.add_column("total", justify="right", style="bold")
    for row in data["stages"]:
        cells = [f"{row['bytes'][kind] / GIB:.2f}" for kind in _KINDS]
        table.add_row(str(row["stage"]), *cells, f"{row['total_bytes'] / GIB:.2f}")
    console.print(table)
    headroom = (data["hbm_bytes"] - data["peak_bytes"]) / GIB
    verdict = "[green]fits[/green]" if data["peak_bytes"] <= data["hbm_bytes"] else "[red]does not fit[/red]"
    console.print(
        f"peak: stage {data['peak_stage']} needs {data['peak_bytes'] / GIB:.2f} GiB of "
        f"{data['hbm_bytes'] / GIB:.2f} GiB HBM — {verdict}, headroom {headroom:+.2f} GiB"
    )
    if data["host_bytes_per_node"]:
        console.print(
            f"pinned host memory (offloaded tensors): {data['host_bytes_per_node'] / GIB:,.1f} GiB per "
            f"{report.node.id} node of {report.gpus_per_node} GPUs; usable: "
            f"{data['host_budget_bytes_per_node'] / GIB:,.0f} GiB ({report.host_usable_fraction:.0%} of its "
            f"{report.node.cpu_ram_gib:g} GiB RAM)"
        )


def register(app: typer.Typer) -> None:
    app.command("memory")(memory)
