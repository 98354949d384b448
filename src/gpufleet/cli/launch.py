"""`gpufleet launch`: write the launch files of a plan (Megatron-LM, torchtitan, DeepSpeed, Slurm, Kubernetes,
NCCL env), or `--check` existing ones against the model."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from gpufleet.cli._layout_flags import (
    CpOption,
    EpOption,
    EtpOption,
    MicroBatchOption,
    PpOption,
    RecomputeOption,
    ShardingOption,
    TpOption,
    VppOption,
)
from gpufleet.cli._plan_output import plan_with_spinner
from gpufleet.cli._workload_flags import (
    DtensorTpOption,
    EagerOption,
    EpDispatchOption,
    FabricModelOption,
    FabricOption,
    GlobalBatchOption,
    GpuOption,
    GpusOption,
    ModelOption,
    NodeOption,
    OverlapDpOption,
    OverlapEpOption,
    OverlapTpOption,
    OversubscriptionOption,
    PrecisionOption,
    RankByOption,
    SelectivePolicyOption,
    SeqOption,
    StackOption,
    TokensOption,
    TopologyOption,
)
from gpufleet.cli.common import CatalogOption, JsonOption, gpu_for, open_catalog
from gpufleet.cli.output import Output
from gpufleet.emit.launch_request import Launched, LaunchRequest, check_launch_files, launch_plan, write_launch
from gpufleet.planner.pins import parse_pins
from gpufleet.planner.plan_options import WorkloadOptions

FilesArgument = typer.Argument(None, help="With --check: the files to check (ds_config.json, a Megatron argument "
                               "list, a torchtitan config module, a PyTorch FSDP keyword dict as JSON or one Python "
                               "dict literal, an sbatch script).")
TargetOption = typer.Option(None, "--target", help="megatron, torchtitan, deepspeed, slurm, k8s, nccl (repeatable), "
                            "or all.")
OutOption = typer.Option(None, "--out", help="Folder to write (new or empty; --force replaces it).")
ForceOption = typer.Option(False, "--force", help="Replace a non-empty --out folder.")
PlanFileOption = typer.Option(None, "--plan", help="A `gpufleet plan --json` file instead of the plan options.")
RankOption = typer.Option(1, "--rank", help="Which of the ranked plans to launch (1 = best).")
CheckOption = typer.Option(False, "--check", help="Check FILES for consistency instead of writing.")
CheckpointDirOption = typer.Option("/checkpoints", "--checkpoint-dir", help="Where the job saves and loads "
                                   "checkpoints (named in the files).")


def launch(
    ctx: typer.Context, files: list[Path] = FilesArgument, target: list[str] = TargetOption, out_dir: Path = OutOption,
    force: bool = ForceOption, plan_file: Path = PlanFileOption, rank: int = RankOption, check: bool = CheckOption,
    checkpoint_dir: str = CheckpointDirOption, model: str = ModelOption, tokens: str = TokensOption,
    gpu: str = GpuOption, gpus: str = GpusOption, node: str = NodeOption, fabric: str = FabricOption,
    topology: str = TopologyOption, oversubscription: str = OversubscriptionOption, seq: int = SeqOption,
    global_batch: int = GlobalBatchOption, precision: str = PrecisionOption, rank_by: str = RankByOption,
    fabric_model: str = FabricModelOption, overlap_tp: bool | None = OverlapTpOption,
    dtensor_tp: bool | None = DtensorTpOption, overlap_ep: bool | None = OverlapEpOption,
    overlap_dp: bool | None = OverlapDpOption, ep_dispatch: str | None = EpDispatchOption,
    selective_policy: str | None = SelectivePolicyOption, eager: bool = EagerOption, stack: str | None = StackOption,
    tp: str | None = TpOption, pp: str | None = PpOption, vpp: str | None = VppOption, cp: str | None = CpOption,
    ep: str | None = EpOption, etp: str | None = EtpOption, micro_batch: str | None = MicroBatchOption,
    sharding: str | None = ShardingOption, recompute: str | None = RecomputeOption,
    catalog: list[Path] = CatalogOption, json: bool = JsonOption,
) -> None:
    """Write the launch files of a plan, atomically, and print the command that starts the job.

    Examples:

    * `gpufleet launch -m llama3-70b -t 15T -n 1024 --target megatron --target slurm --out run/`
    * `gpufleet plan -m llama3-8b -n 64 --json > plan.json` then
      `gpufleet launch --plan plan.json --rank 2 --target all --out run/`
    * `gpufleet launch -m llama3-70b -n 64 --target deepspeed --out D/` — the best plan DeepSpeed can run, and
      what the best plan of any framework would gain
    * `gpufleet launch -m llama3-70b -n 256 --tp 8 --pp 4 --target megatron --out run/` — your own layout
    * `gpufleet launch --check ds_config.json --gpus 2048` — is an existing config consistent?
    * `gpufleet launch --check fsdp_config.py` — FSDP keywords against PyTorch's own signature (the file is
      read, never run)
    """
    out = Output(json)
    cat = open_catalog(catalog)
    pins = parse_pins(tp, pp, vpp, cp, ep, etp, micro_batch, sharding, recompute)
    named = _given_on_the_command_line(ctx)
    request = LaunchRequest(check=check, files=tuple(files or ()), targets=tuple(target or ()), out_dir=out_dir,
                            force=force, plan_file=plan_file, rank=rank, checkpoint_dir=checkpoint_dir, gpus=gpus,
                            plan_flags=tuple(sorted(named & (set(WorkloadOptions.model_fields) | {"gpus"}))))
    if check:
        report = check_launch_files(cat, list(request.files), model if "model" in named else None,
                                    gpu_for(cat, node, gpu), gpus if "gpus" in named else None)
        if report.problems:
            out.check_failed(f"{len(report.problems)} problem(s): " + "; ".join(report.problems), report.as_dict(),
                             report.render)
        out.emit(report.as_dict(), report.render)
        return
    given = WorkloadOptions(
        model=model, tokens=tokens, gpu=gpu, node=node, fabric=fabric, topology=topology,
        oversubscription=oversubscription, seq=seq, global_batch=global_batch, precision=precision, rank_by=rank_by,
        fabric_model=fabric_model, overlap_tp=overlap_tp, dtensor_tp=dtensor_tp, overlap_ep=overlap_ep,
        ep_dispatch=ep_dispatch, selective_policy=selective_policy, eager=eager, stack=stack, overlap_dp=overlap_dp,
        pins=pins)
    planned = launch_plan(request, given, cat)
    launched = write_launch(request, planned, plan_with_spinner(out, planned.request, cat), cat, out.warn)
    _emit(out, request, launched)


def _given_on_the_command_line(ctx: typer.Context) -> set[str]:
    """The parameters the user typed (not defaults)."""
    return {name for name in ctx.params
            if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")}


def _emit(out: Output, request: LaunchRequest, launched: Launched) -> None:
    from gpufleet.emit.build import layout_summary

    spec, out_dir = launched.spec, request.folder
    layout = {**layout_summary(spec), "rank": request.rank, "gpus": spec.cluster.gpus}
    data = {"files": [str(path) for path in launched.written], "layout": layout, "gpus": spec.cluster.gpus,
            "targets": request.resolved_targets, "start": launched.start}

    def render(console: Console) -> None:
        console.print(f"plan #{layout['rank']}: {layout['label']} on {layout['gpus']} GPUs "
                      f"({layout['nodes']} x {layout['gpus_per_node']}), step {layout['step_s']:.2f} s, "
                      f"MFU {layout['mfu']:.1%}")
        for target, files in launched.by_target.items():
            for item in files:
                console.print(f"  {target:<10} {out_dir / item.path}")
        start = launched.start
        console.print(f"start: {start}" if start else "start: (no scheduler or framework file written)")

    out.emit(data, render)


def register(app: typer.Typer) -> None:
    app.command("launch")(launch)
