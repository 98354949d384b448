"""`gpufleet bench collectives|gemm|memory|disk|host`: measure what the model assumes, next to what it expects."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.bench_file import (
    CollectiveRow,
    CollectivesBench,
    DiskBench,
    DiskRow,
    GemmBench,
    GemmRow,
    HostBench,
    MemoryBench,
)
from gpufleet.cli.common import CatalogOption, JsonOption, open_catalog
from gpufleet.cli.output import Output
from gpufleet.units import format_bytes

if TYPE_CHECKING:
    pass

COLLECTIVES_HELP = """Time all-reduce, all-gather, reduce-scatter, all-to-all, broadcast and send/recv over a size
sweep; algbw and busbw by nccl-tests' definitions (GB/s = 10^9 bytes/s), next to what gpufleet's fabric model
expects for --node-type/--network (a shortfall below 0.75 of it is flagged). Run under torchrun or srun: NCCL on GPUs,
gloo on CPUs; rank 0 prints.

Examples:

    torchrun --nproc-per-node 8 -m gpufleet bench collectives --node-type dgx-h100 --network ndr400

    torchrun --standalone --nproc-per-node 4 -m gpufleet bench collectives --ops all-reduce --max-bytes 16MiB --json
"""


def _render_collectives(rows: list[dict[str, Any]], ranks: int, backend: str) -> Any:
    def render(console: Console) -> None:
        table = Table(title=f"collectives over {ranks} ranks ({backend}); GB/s = 10^9 B/s", title_justify="left")
        for column in ("collective", "size", "time", "algbw GB/s", "busbw GB/s", "expected busbw", ""):
            table.add_column(column, justify="left" if column in ("collective", "") else "right")
        for row in rows:
            expected = row["expected_busbw_gbps"]
            table.add_row(row["collective"], format_bytes(row["size_bytes"]), f"{row['time_s'] * 1e6:,.1f} µs",
                          f"{row['algbw_gbps']:.3g}", f"{row['busbw_gbps']:.3g}",
                          "-" if expected is None else f"{expected:.3g}",
                          "[red]shortfall[/red]" if row["shortfall"] else "")
        console.print(table)
    return render


def collectives_command(
    ops: str = typer.Option("all", "--ops", help="Comma list of all-reduce, all-gather, reduce-scatter, all-to-all, "
                            "broadcast, send-recv; or all."),
    min_bytes: str = typer.Option("1KiB", "--min-bytes", help="Smallest size (nccl-tests -b)."),
    max_bytes: str = typer.Option("64MiB", "--max-bytes", help="Largest size (nccl-tests -e)."),
    factor: float = typer.Option(4.0, "--factor", help="Size multiplier between steps (nccl-tests -f)."),
    iters: int = typer.Option(20, "--iters", min=1, help="Timed calls per size."),
    warmup: int = typer.Option(5, "--warmup", min=0, help="Untimed calls per size first."),
    node: str | None = typer.Option(None, "--node-type", help="Catalog node type of the ranks, for the expected column "
                                     "(not `--node`: torchrun would take that as its own --node-rank)."),
    network: str | None = typer.Option(None, "--network", help="Catalog network between the nodes."),
    oversubscription: float = typer.Option(1.0, "--oversubscription", min=1.0, help="Leaf down:up ratio."),
    catalog: list[Path] | None = CatalogOption,
    json_out: bool = JsonOption,
) -> None:
    from gpufleet.runtime.bench.busbw import bench_bytes, parse_ops, size_sweep
    from gpufleet.runtime.bench.collectives import (
        CollectivesRequest,
        bench_collectives,
        expected_cluster,
        init_process_group,
    )

    sizes = size_sweep(bench_bytes(min_bytes, "--min-bytes"), bench_bytes(max_bytes, "--max-bytes"), factor)
    chosen = parse_ops(ops)
    dist = init_process_group("bench collectives")
    try:
        ranks = dist.get_world_size()
        cluster = expected_cluster(lambda: open_catalog(catalog), node, network, ranks, oversubscription)
        rows = bench_collectives(dist, CollectivesRequest(chosen, sizes, iters, warmup, cluster))
        if dist.get_rank() == 0:
            data = CollectivesBench(ranks=dist.get_world_size(), backend=dist.get_backend(),
                                    rows=[CollectiveRow(**row.as_json()) for row in rows]).model_dump(mode="json")
            Output(json_mode=json_out).emit(data, _render_collectives(data["rows"], data["ranks"], data["backend"]))
    finally:
        dist.destroy_process_group()


def _peak_flops(catalog_paths: list[Path] | None, gpu: str | None, dtype: str) -> float | None:
    if gpu is None:
        return None
    return open_catalog(catalog_paths).gpu(gpu).peak_flops(dtype)  # type: ignore[arg-type]


def gemm_command(
    model: str = typer.Option(..., "--model", "-m", help="Catalog model whose GEMM shapes to run."),
    tokens: int = typer.Option(4096, "--tokens", min=1, help="Tokens per micro-batch (GEMM M: micro-batch × seq)."),
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree the shapes are sharded by."),
    dtypes: str = typer.Option("bf16", "--dtype", help="Comma list of bf16, fp16, fp32, fp8 (fp8: CUDA 8.9+ or CPU)."),
    gpu: str | None = typer.Option(None, "--gpu", help="Catalog GPU id whose peak the FLOP/s are a fraction of."),
    iters: int = typer.Option(10, "--iters", min=1, help="Timed matmuls per shape."),
    warmup: int = typer.Option(2, "--warmup", min=0, help="Untimed matmuls per shape first."),
    catalog: list[Path] | None = CatalogOption,
    json_out: bool = JsonOption,
) -> None:
    """Achieved FLOP/s of the model's own GEMMs (one layer's qkv, attn-out, MLP, plus the logits) per dtype.

    Examples:

        gpufleet bench gemm --model llama3-8b --tp 2 --dtype bf16,fp16 --gpu h100-sxm

        gpufleet bench gemm --model llama3-8b --tokens 512 --dtype fp32 --json
    """
    from gpufleet.runtime.bench.gemm import bench_gemm, parse_dtypes
    from gpufleet.runtime.bench.shapes import model_gemm_shapes

    names = parse_dtypes(dtypes)
    spec = open_catalog(catalog).model(model)
    peaks = {name: _peak_flops(catalog, gpu, name) for name in names}
    rows = bench_gemm(model_gemm_shapes(spec, tokens, tp), names, iters, warmup)
    data = GemmBench(model=model, tokens=tokens, tp=tp, gpu=gpu,
                     rows=[GemmRow(**row.as_json(peaks[row.dtype])) for row in rows]).model_dump(mode="json")

    def render(console: Console) -> None:
        table = Table(title=f"{model} GEMMs, {tokens} tokens, tp {tp}", title_justify="left")
        for column in ("shape", "M×N×K", "dtype", "time", "TFLOP/s", "of peak", "device"):
            table.add_column(column, justify="right" if column in ("time", "TFLOP/s", "of peak") else "left")
        for row in data["rows"]:
            fraction = row["fraction_of_peak"]
            table.add_row(row["shape"], f"{row['m']}×{row['n']}×{row['k']}", row["dtype"],
                          f"{row['time_s'] * 1e3:,.2f} ms", f"{row['tflops']:.3g}",
                          "-" if fraction is None else f"{fraction:.1%}", row["device"])
        console.print(table)
    Output(json_mode=json_out).emit(data, render)


def memory_command(
    size: str = typer.Option("1GiB", "--size", help="Buffer size copied (2·size bytes move per copy)."),
    iters: int = typer.Option(10, "--iters", min=1, help="Timed copies (the best counts)."),
    gpu: str | None = typer.Option(None, "--gpu", help="Catalog GPU id whose HBM bandwidth it is a fraction of."),
    catalog: list[Path] | None = CatalogOption,
    json_out: bool = JsonOption,
) -> None:
    """Copy bandwidth of the local device's memory (HBM on a GPU, DRAM on a CPU), STREAM Copy's convention.

    Examples:

        gpufleet bench memory --gpu h100-sxm

        gpufleet bench memory --size 256MiB --json
    """
    from gpufleet.runtime.bench.busbw import bench_bytes
    from gpufleet.runtime.bench.memory import bench_memory

    peak = open_catalog(catalog).gpu(gpu).hbm_bytes_per_s if gpu else None
    row = bench_memory(bench_bytes(size, "--size"), iters)
    data = MemoryBench(size_bytes=row.size_bytes, time_s=row.time_s, bandwidth_gbps=row.bytes_per_s / 1e9,
                       peak_gbps=peak / 1e9 if peak else None,
                       fraction_of_peak=row.bytes_per_s / peak if peak else None,
                       device=row.device).model_dump(mode="json")

    def render(console: Console) -> None:
        shown = f" ({data['fraction_of_peak']:.1%} of {gpu}'s HBM)" if peak else ""
        console.print(f"{row.device}: copy {format_bytes(row.size_bytes)} in {row.time_s * 1e3:,.2f} ms: "
                      f"{data['bandwidth_gbps']:,.1f} GB/s{shown}")
    Output(json_mode=json_out).emit(data, render)


def disk_command(
    path: Path = typer.Argument(..., help="A folder on the disk checkpoints go to (a scratch file is written there "
                                "and removed)."),
    sizes: str = typer.Option("256MiB,1GiB", "--sizes", help="Comma list of file sizes (checkpoint shard sizes)."),
    repeats: int = typer.Option(1, "--repeats", min=1, help="Runs per size (the best counts)."),
    json_out: bool = JsonOption,
) -> None:
    """Sequential write with fsync, then read (page cache dropped for the file), at checkpoint-file sizes.

    Examples:

        gpufleet bench disk /checkpoints --sizes 1GiB,4GiB

        gpufleet bench disk /mnt/lustre/ckpt --json
    """
    from gpufleet.runtime.bench.disk import bench_disk, disk_sizes

    sizes_bytes = disk_sizes(sizes)
    rows = bench_disk(path, sizes_bytes, repeats)
    data = DiskBench(path=str(path), rows=[
        DiskRow(size_bytes=row.size_bytes, write_s=row.write_s, write_gbps=row.write_bytes_per_s / 1e9,
                read_s=row.read_s, read_gbps=row.read_bytes_per_s / 1e9) for row in rows]).model_dump(mode="json")

    def render(console: Console) -> None:
        table = Table(title=f"disk at {path} (GB/s = 10^9 B/s; write includes fsync)", title_justify="left")
        for column in ("size", "write", "write GB/s", "read", "read GB/s"):
            table.add_column(column, justify="right")
        for row in data["rows"]:
            table.add_row(format_bytes(row["size_bytes"]), f"{row['write_s']:.3f} s", f"{row['write_gbps']:.3g}",
                          f"{row['read_s']:.3f} s", f"{row['read_gbps']:.3g}")
        console.print(table)
    Output(json_mode=json_out).emit(data, render)


def host_command(
    ops: str = typer.Option("all", "--ops", help="Comma list of index, matmul, elementwise, cast; or all."),
    iters: int = typer.Option(2000, "--iters", min=1, help="Ops launched per timed loop."),
    warmup: int = typer.Option(200, "--warmup", min=0, help="Untimed ops before each loop."),
    repeats: int = typer.Option(5, "--repeats", min=1, help="Timed loops per op (the median counts)."),
    autograd: bool = typer.Option(True, "--autograd/--no-autograd", help="Inputs require grad, so each op records "
                                  "an autograd node as a training forward does."),
    json_out: bool = JsonOption,
) -> None:
    """Host seconds per launched op as eager PyTorch dispatches it here: the MoE step model's host_s_per_kernel.

    Tiny ops of the kinds a MoE layer launches (index/gather, small matmul, elementwise, cast) in a Python loop;
    on a GPU nothing syncs inside the loop, so the host's time is measured, and the device's throughput is shown
    beside it. `gpufleet calibrate --from` writes the figure into a calibration profile.

    Examples:

        gpufleet bench host

        gpufleet bench host --json > host.json; gpufleet calibrate --gpu h100-sxm --from host.json --out h100.yaml
    """
    from gpufleet.runtime.bench.host import bench_host, parse_op_kinds

    result = bench_host(parse_op_kinds(ops), iters, warmup, repeats, autograd)
    data = HostBench.model_validate(result.as_json()).model_dump(mode="json")

    def render(console: Console) -> None:
        table = Table(title=f"host launch cost on {result.device}, median of {repeats} × {iters} ops"
                      + ("" if autograd else ", no autograd"), title_justify="left")
        for column in ("op", "host µs/op", "device-side µs/op", "device ops/s"):
            table.add_column(column, justify="left" if column == "op" else "right")
        for row in result.rows:
            table.add_row(row.op, f"{row.host_s_per_kernel * 1e6:.2f}", f"{row.device_s_per_kernel * 1e6:.2f}",
                          f"{1 / row.device_s_per_kernel:,.0f}")
        console.print(table)
        console.print(f"host_s_per_kernel: {result.host_s_per_kernel * 1e6:.2f} µs (mean over the op kinds)")
    Output(json_mode=json_out).emit(data, render)


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Benchmark collectives, GEMMs, memory, the checkpoint disk and the host's launch cost.",
                        no_args_is_help=True)
    group.command("collectives", help=COLLECTIVES_HELP)(collectives_command)
    group.command("gemm")(gemm_command)
    group.command("memory")(memory_command)
    group.command("disk")(disk_command)
    group.command("host")(host_command)
    app.add_typer(group, name="bench")
