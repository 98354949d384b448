"""`gpufleet memory`: memory per GPU for each pipeline stage of a layout, and whether it fits in HBM."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.catalog.records import NodeSpec, Precision
from gpufleet.cli.common import CalibrationOption, CatalogOption, JsonOption, open_catalog, with_calibration
from gpufleet.cli.output import Output
from gpufleet.errors import InputError
from gpufleet.fabric.topology import node_as_used
from gpufleet.parallel.layout import (
    RECOMPUTES,
    SELECTIVE_POLICIES,
    SHARDINGS,
    Layout,
    Recompute,
    Sharding,
    validate_layout,
)
from gpufleet.parallel.memory import TRAINING_PRECISIONS, MemoryBreakdown, memory_per_stage
from gpufleet.planner.published_runs import framework_options
from gpufleet.planner.search import host_memory_bytes, host_memory_fits, host_ram_usable_fraction

GIB = 2**30
_KINDS = ("weights", "gradients", "optimizer", "activations", "buffers", "overhead")
_HEADERS = ("weights", "grads", "optim", "activ", "buffers", "overhead")


def _choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise InputError(f"{what} {value!r} is not one of {', '.join(allowed)}")
    return value


def _host_per_gpu(stages: list[MemoryBreakdown]) -> float:
    """Pinned host bytes per GPU of the stage that pins the most."""
    return max(breakdown.host_bytes for breakdown in stages)


def _report(stages: list[MemoryBreakdown], hbm_bytes: float, node: NodeSpec, gpus_per_node: int,
            host_fits: bool) -> dict[str, Any]:
    peak_stage = max(range(len(stages)), key=lambda i: stages[i].total_bytes)
    peak_bytes = stages[peak_stage].total_bytes
    return {
        "stages": [
            {"stage": i, "bytes": breakdown.as_dict(), "total_bytes": breakdown.total_bytes,
             "host_bytes": breakdown.host_bytes}
            for i, breakdown in enumerate(stages)
        ],
        "peak_stage": peak_stage,
        "peak_bytes": peak_bytes,
        "hbm_bytes": hbm_bytes,
        "host_bytes_per_node": _host_per_gpu(stages) * gpus_per_node,
        "host_budget_bytes_per_node": host_memory_bytes(node),
        "fits": peak_bytes <= hbm_bytes and host_fits,
    }


def register(app: typer.Typer) -> None:
    @app.command("memory")
    def memory(
        model: str = typer.Option(..., "--model", "-m", help="Model id (`gpufleet catalog list models`)."),
        gpu: str = typer.Option(..., "--gpu", "-g", help="GPU id (`gpufleet catalog list gpus`)."),
        gpus: int = typer.Option(..., "--gpus", "-n", min=1, help="GPUs in the job."),
        tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree."),
        pp: int = typer.Option(1, "--pp", min=1, help="Pipeline-parallel degree."),
        cp: int = typer.Option(1, "--cp", min=1, help="Context-parallel degree."),
        ep: int = typer.Option(
            1, "--ep", min=1, help="Expert-parallel degree (MoE; carved out of dp·cp·tp)."
        ),
        vpp: int = typer.Option(
            1, "--vpp", min=1, help="Virtual stages per pipeline rank (interleaved 1F1B)."
        ),
        dp: int | None = typer.Option(
            None, "--dp", min=1, help="Data-parallel degree [default: GPUs/(tp·pp·cp)]."
        ),
        seq: int = typer.Option(4096, "--seq", min=1, help="Sequence length, tokens."),
        micro_batch: int = typer.Option(1, "--micro-batch", min=1, help="Sequences per micro-batch."),
        global_batch: int | None = typer.Option(
            None,
            "--global-batch",
            min=1,
            help="Sequences per optimizer step [default: dp·micro-batch·pp, enough to fill the pipeline].",
        ),
        recompute: str = typer.Option("none", "--recompute", help=f"One of {', '.join(RECOMPUTES)}."),
        selective_policy: str | None = typer.Option(
            None, "--selective-policy", help="What --recompute selective keeps: attention (Megatron: everything but "
            "the attention core; the default) or op (torchtitan's op-level checkpointing: the block input, the "
            "attention output and every second matmul output)."
        ),
        stack: str | None = typer.Option(
            None, "--stack", help="A framework's documented memory settings (gradient dtype, FSDP2's fp32 "
            "parameters, recompute policy, DTensor TP): a catalog stack id (gpufleet catalog list stacks). Explicit "
            "flags override it."
        ),
        recompute_layers: int | None = typer.Option(
            None, "--recompute-layers", min=1, help="With --recompute full: recompute only this many layers of each "
            "pipeline chunk (virtual stage; Megatron's block method) [default: all]."
        ),
        offload_activations: int | None = typer.Option(
            None, "--offload-activations", min=1, help="Keep this many layers' activations in CPU memory "
            "(Megatron-Core's --cpu-offloading-num-layers; pp 1, no recompute)."
        ),
        expert_tp: int | None = typer.Option(
            None, "--expert-tp", min=1, help="MoE: tensor parallelism inside the experts [default: tp when ep "
            "divides dp·cp, else 1]."
        ),
        dtensor_tp: bool | None = typer.Option(
            None, "--dtensor-tp/--megatron-tp", help="Tensor parallelism as PyTorch DTensor runs it (torchtitan): "
            "under sequence parallelism each column GEMM keeps its all-gathered input; or as Megatron keeps it, the "
            "1/tp shard [default: Megatron, or the --stack's]."
        ),
        sharding: str = typer.Option("none", "--sharding", help=f"One of {', '.join(SHARDINGS)}."),
        hsdp_group: int = typer.Option(8, "--hsdp-group", min=2, help="FSDP shard-group size for hsdp."),
        precision: str = typer.Option(
            "bf16", "--precision", help=f"One of {', '.join(TRAINING_PRECISIONS)}."
        ),
        sequence_parallel: bool = typer.Option(
            True, "--sequence-parallel/--no-sequence-parallel", help="Megatron sequence parallelism (tp > 1)."
        ),
        offload_optimizer: bool = typer.Option(False, "--offload-optimizer", help="Optimizer states on CPU."),
        catalog: list[Path] = CatalogOption,
        calibration: Path | None = CalibrationOption,
        json: bool = JsonOption,
    ) -> None:
        """Memory per GPU for every pipeline stage, and fit / no-fit against the GPU's HBM.

        Exit 0 when the worst stage fits, 1 when it does not, 2 for bad input.

        Example: `gpufleet memory -m llama3-70b -g h100-sxm -n 64 --tp 8 --pp 2 --sharding zero1`
        """
        cat = open_catalog(with_calibration(catalog, calibration))
        spec = cat.model(model)
        gpu_spec = cat.gpu(gpu)
        _choice(recompute, RECOMPUTES, "recompute")
        if selective_policy is not None:
            _choice(selective_policy, SELECTIVE_POLICIES, "selective policy")
        if selective_policy is not None and recompute != "selective":
            raise InputError(f"--selective-policy {selective_policy} applies to --recompute selective, "
                             f"not {recompute}")
        _choice(sharding, SHARDINGS, "sharding")
        _choice(precision, TRAINING_PRECISIONS, "precision")
        gpu_spec.peak_flops(cast(Precision, precision))  # a GPU without that precision: one line, as plan says
        if dp is None:
            if gpus % (tp * pp * cp):
                raise InputError(
                    f"--gpus {gpus} is not divisible by tp·pp·cp = {tp * pp * cp}; give --dp or fix it"
                )
            dp = gpus // (tp * pp * cp)
        layout = Layout(
            tp=tp,
            pp=pp,
            dp=dp,
            cp=cp,
            ep=ep,
            vpp=vpp,
            sequence_parallel=sequence_parallel and tp > 1,
            sharding=cast(Sharding, sharding),
            micro_batch=micro_batch,
            recompute=cast(Recompute, recompute),
            offload_optimizer=offload_optimizer,
            hsdp_group=hsdp_group,
            recompute_layers=recompute_layers,
            offload_activation_layers=offload_activations,
            expert_tp=expert_tp,
        )
        batch = global_batch if global_batch is not None else dp * micro_batch * pp
        validate_layout(layout, spec, gpus, batch, seq)
        record = cat.stack(stack) if stack is not None else None
        if record is not None and record.value("activation_offload") is False and offload_activations:
            raise InputError(f"--offload-activations: {stack} cannot keep activations in CPU memory")
        assumptions = framework_options(record, dtensor_tp=dtensor_tp, selective_policy=selective_policy).memory
        stages = memory_per_stage(spec, layout, seq_len=seq, global_batch=batch, precision=precision,
                                  assumptions=assumptions)
        node = cat.node_for_gpu(gpu_spec.id)
        try:  # as plan places it: a count that does not fill whole nodes spreads evenly over them
            gpus_per_node = min(gpus, node_as_used(node, gpus).gpus)
        except InputError:
            gpus_per_node = min(gpus, node.gpus)
        host_fits = host_memory_fits(_host_per_gpu(stages), node, gpus_per_node)
        data = _report(stages, gpu_spec.hbm_bytes, node, gpus_per_node, host_fits)
        out = Output(json)

        def render(console: Console) -> None:
            table = Table(
                title=f"{spec.id} on {gpus}x {gpu_spec.id}: {layout.short()}, seq {seq}, "
                f"global batch {batch}, {precision} — GiB per GPU",
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
                    f"{node.id} node of {gpus_per_node} GPUs; usable: {data['host_budget_bytes_per_node'] / GIB:,.0f}"
                    f" GiB ({host_ram_usable_fraction():.0%} of its {node.cpu_ram_gib:g} GiB RAM)"
                )

        if not host_fits:
            out.check_failed(
                f"does not fit: the offloaded tensors need {data['host_bytes_per_node'] / GIB:,.0f} GiB of pinned "
                f"memory per {node.id} node but {data['host_budget_bytes_per_node'] / GIB:,.0f} GiB is usable; "
                + ("offload fewer layers or use more GPUs" if layout.offload_activation_layers else
                   "shard the optimizer (--sharding zero1/zero3) or use more GPUs"),
                data, render,
            )
        if data["peak_bytes"] > data["hbm_bytes"]:
            peak = stages[data["peak_stage"]].as_dict()
            largest = max(peak, key=lambda kind: peak[kind])
            out.check_failed(
                f"does not fit: stage {data['peak_stage']} needs {data['peak_bytes'] / GIB:.1f} GiB per GPU "
                f"but {gpu_spec.id} has {data['hbm_bytes'] / GIB:.1f} GiB (largest part: {largest} "
                f"{peak[largest] / GIB:.1f} GiB; try more tp/pp, --sharding, --recompute or a smaller "
                "--micro-batch)",
                data, render,
            )
        out.emit(data, render)
