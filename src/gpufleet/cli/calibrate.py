"""`gpufleet calibrate`: run the benches (or read their --json output) and write a calibration profile."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from gpufleet.cli.common import CatalogOption, JsonOption, open_catalog
from gpufleet.cli.output import Output

CALIBRATE_HELP = """Write a calibration profile (the catalog's `calibrations:` schema: GEMM fraction and shape curve,
HBM fraction, measured collectives, checkpoint write bandwidth, host seconds per launched kernel) from `gpufleet
bench gemm`, `bench memory`, `bench collectives`, `bench disk` and `bench host` results, with host, date and
gpufleet version; `plan`, `memory` and `validate` read it with `--calibration FILE`. Fields the benches do not
measure are kept from the built-in profile of --gpu. Without --from, runs the GEMM (needs --model), memory and host
benches here.

Examples:

    gpufleet calibrate --gpu h100-sxm --model llama3-70b --tp 8 --out h100.yaml

    gpufleet bench gemm --model llama3-8b --json > gemm.json; gpufleet bench memory --json > mem.json
    gpufleet calibrate --gpu h100-sxm --from gemm.json --from mem.json --out h100.yaml

    torchrun --nproc-per-node 8 -m gpufleet bench collectives --json > coll.json
    gpufleet bench disk /checkpoints --json > disk.json
    gpufleet calibrate --gpu h100-sxm --from gemm.json --from coll.json --from disk.json --out h100.yaml

    gpufleet bench host --json > host.json
    gpufleet calibrate --gpu h100-sxm --from host.json --out h100.yaml

    gpufleet plan --model llama3-70b --tokens 15T --gpu h100-sxm --gpus 1024 --calibration h100.yaml
"""


def calibrate_command(
    gpu: str = typer.Option(..., "--gpu", "-g", help="Catalog GPU id the profile calibrates (its peaks are the "
                            "reference)."),
    out: Path = typer.Option(..., "--out", "-o", help="Profile file to write (YAML)."),
    sources: list[Path] | None = typer.Option(None, "--from", help="A `bench ... --json` output (repeatable)."),
    model: str | None = typer.Option(None, "--model", "-m", help="Without --from: the model whose GEMMs to run."),
    tokens: int = typer.Option(4096, "--tokens", min=1, help="Without --from: tokens per micro-batch (GEMM M)."),
    tp: int = typer.Option(1, "--tp", min=1, help="Without --from: tensor-parallel degree of the shapes."),
    dtype: str = typer.Option("bf16", "--dtype", help="Without --from: GEMM dtype (bf16, fp16)."),
    catalog: list[Path] | None = CatalogOption,
    json_out: bool = JsonOption,
) -> None:
    from gpufleet.runtime.bench.calibrate_request import CalibrateRequest, calibrate

    request = CalibrateRequest(gpu=gpu, out=out, sources=tuple(sources or ()), model=model, tokens=tokens, tp=tp,
                               dtype=dtype)
    done = calibrate(request, open_catalog(catalog))
    data, profile = done.data, done.profile

    def render(console: Console) -> None:
        table = Table(title=f"calibration for {gpu} written to {out}", title_justify="left")
        for column in ("field", "built-in", "measured"):
            table.add_column(column)
        for name in ("gemm_fraction_16bit", "gemm_fraction_fp8", "gemm_half_dim", "hbm_fraction",
                     "checkpoint_write_gbytes_per_s", "host_s_per_kernel"):
            before, after = data["built_in"].get(name), data["profile"].get(name)
            table.add_row(name, "-" if before is None else f"{before:.4g}", "-" if after is None else f"{after:.4g}")
        console.print(table)
        console.print(profile.note or "")
    Output(json_mode=json_out).emit(data, render)


def register(app: typer.Typer) -> None:
    app.command("calibrate", help=CALIBRATE_HELP)(calibrate_command)
