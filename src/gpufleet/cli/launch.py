"""`gpufleet launch`: write the launch files of a plan (Megatron-LM, torchtitan, DeepSpeed, Slurm, Kubernetes,
NCCL env), or `--check` existing ones against the model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from gpufleet import __version__
from gpufleet.catalog.registry import Catalog
from gpufleet.catalog.stacks import LaunchTarget
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
from gpufleet.cli.common import CatalogOption, JsonOption, check_gpu_count, gpu_for, open_catalog
from gpufleet.cli.output import Output
from gpufleet.cli.plan import (
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
    WorkloadOptions,
    framework_to_dict,
    plan_request,
    plan_with_spinner,
)
from gpufleet.emit.within_target import framework_target, left_out, stack_for_target
from gpufleet.errors import InputError
from gpufleet.input_files import load_json
from gpufleet.planfile import read_plan_file
from gpufleet.planner.model_terms import ModelTerms
from gpufleet.planner.pins import LayoutPins, parse_pins
from gpufleet.planner.plan import PlanRequest, PlanResult, make_plan
from gpufleet.planner.search import SearchSpace
from gpufleet.units import parse_int_list


def _read_json(path: Path, what: str) -> dict[str, Any]:
    data = load_json(path, what)
    if not isinstance(data, dict):
        raise InputError(f"{what} {path} is not a JSON object")
    return data


def _options_from_plan_file(path: Path, data: dict[str, Any], rank: int) -> tuple[WorkloadOptions, int, str]:
    """The options that reproduce a `plan --json` file's request, its GPU count and its plan #rank's layout label."""
    saved = read_plan_file(data, f"--plan {path}")
    if saved.gpufleet_version != __version__:
        raise InputError(f"--plan {path} was written by gpufleet {saved.gpufleet_version}, this is "
                         f"{__version__}: re-run `gpufleet plan --json` with this version")
    if saved.request.get("sites", 1) != 1:
        raise InputError(f"--plan {path} is a plan over {saved.request.get('sites')} sites; launch writes one site's "
                         "files only")
    if saved.job is None or saved.cluster is None:
        raise InputError(f"--plan {path} is a sweep over GPU counts: launch takes a plan of one count")
    if not 1 <= rank <= len(saved.plans or []):
        raise InputError(f"--rank {rank} is beyond the plans in {path}: choose 1-{len(saved.plans or [])}")
    label = saved.plan(rank, f"--plan {path}").layout.label
    job, cluster, framework, ranking = saved.job, saved.cluster, saved.framework, saved.ranking
    try:
        given = WorkloadOptions(
            model=job.model, tokens=repr(float(job.tokens)), gpu=cluster.gpu, node=cluster.node,
            fabric=cluster.network, topology=cluster.topology,
            oversubscription=f"{float(cluster.oversubscription)!r}:1", seq=job.seq_len,
            global_batch=job.global_batch, precision=job.precision,
            rank_by=ranking.get("rank_by", "time"), fabric_model=ranking.get("fabric_model", "analytical"),
            overlap_tp=framework["tp_comm_overlap"], dtensor_tp=not framework["tp_async_backward"],
            overlap_ep=framework["ep_comm_overlap"], ep_dispatch=framework["ep_dispatch"],
            selective_policy=framework["selective_policy"], eager=not framework["fused_elementwise"],
            stack=framework["stack"],
            terms=ModelTerms(float(framework.get("straggler_sigma", 0.0)), framework.get("straggler_scope", "job"),
                             float(framework.get("overlap_slowdown", 0.0)), framework.get("fsdp2_copies")),
            overlap_dp=framework.get("dp_overlap"),
            pins=LayoutPins.from_saved(saved.request.get("pins", {}), f"--plan {path}: request.pins"))
        return given, cluster.gpus, label
    except (KeyError, TypeError, ValueError) as error:
        raise InputError(f"--plan {path} is not a `gpufleet plan --json` file (missing or bad {error})") from error


def _request(cat: Catalog, given: WorkloadOptions, gpus: str, plan_file: Path | None,
             rank: int) -> tuple[PlanRequest, str | None]:
    """The plan request from the options or the plan file, and the layout label the file promises at `rank`."""
    if rank < 1:
        raise InputError(f"--rank must be at least 1, got {rank}")
    if plan_file is None:
        counts = parse_int_list(gpus, "--gpus", most=1)
        check_gpu_count(counts[0])
        return plan_request(cat, given, counts[0], max(rank, 5)), None
    data = _read_json(plan_file, "--plan")
    from_file, count, label = _options_from_plan_file(plan_file, data, rank)
    saved = read_plan_file(data, f"--plan {plan_file}")
    request = plan_request(cat, from_file, count, max(rank, len(saved.plans or [])))
    if framework_to_dict(request) != saved.framework:
        raise InputError(f"--plan {plan_file}: its framework settings are not this version's: re-run "
                         "`gpufleet plan --json`")
    return request, label


def _render(by_target: dict[str, list[Any]], out_dir: Path, start: str | None,
            layout: dict[str, Any]) -> Any:
    def render(console: Console) -> None:
        console.print(f"plan #{layout['rank']}: {layout['label']} on {layout['gpus']} GPUs "
                      f"({layout['nodes']} x {layout['gpus_per_node']}), step {layout['step_s']:.2f} s, "
                      f"MFU {layout['mfu']:.1%}")
        for target, files in by_target.items():
            for item in files:
                console.print(f"  {target:<10} {out_dir / item.path}")
        console.print(f"start: {start}" if start else "start: (no scheduler or framework file written)")
    return render


def _render_targets(out: Output, spec: Any, targets: list[str], explicit: set[str],
                    out_dir: Path) -> dict[str, list[Any]]:
    """Each target's files; a target that cannot express the plan is refused when named, skipped (with a warning)
    when it came from `all`."""
    from gpufleet.emit.registry import emitter
    from gpufleet.emit.spec import TargetCannotExpress

    by_target: dict[str, list[Any]] = {}
    for name in targets:  # frameworks first (registry order): the scheduler files run the first one's command
        try:
            target = emitter(name)
            by_target[name] = target.render(spec)
            entry = getattr(target, "entrypoint", None)
            if callable(entry) and not spec.train_command:
                spec = replace(spec, train_command=entry(spec, str(out_dir.absolute())))
        except TargetCannotExpress as error:
            if name in explicit:
                raise
            out.warn(f"{error} (skipped from --target all)")
    if not by_target:
        raise InputError("no target can express this plan: " + ", ".join(targets))
    return by_target


def _within_target(cat: Catalog, given: WorkloadOptions, named: list[str],
                   plan_file: Path | None) -> tuple[WorkloadOptions, LaunchTarget | None]:
    """With one framework target and no plan file: the options with that target's stack (emit/within_target.py)."""
    target = framework_target(named)
    if target is None or plan_file is not None:
        return given, None
    return replace(given, stack=stack_for_target(cat, target, given.stack)), target


def _note_left_out(out: Output, cat: Catalog, target: LaunchTarget, request: PlanRequest,
                   result: PlanResult) -> None:
    """Warn what the best plan of any framework would have gained, when the target cannot run it."""
    overall = make_plan(replace(request, stack=None, search_space=SearchSpace(), top=1), cat)
    missed = left_out(target, result, overall)
    if missed is not None:
        out.warn(missed.sentence(target))


def register(app: typer.Typer) -> None:
    @app.command("launch")
    def launch(
        ctx: typer.Context,
        files: list[Path] = typer.Argument(None, help="With --check: the files to check (ds_config.json, a "
                                           "Megatron argument list, a torchtitan config module, a PyTorch FSDP "
                                           "keyword dict as JSON or one Python dict literal, an sbatch script)."),
        target: list[str] = typer.Option(None, "--target", help="megatron, torchtitan, deepspeed, slurm, k8s, "
                                         "nccl (repeatable), or all."),
        out_dir: Path = typer.Option(None, "--out", help="Folder to write (new or empty; --force replaces it)."),
        force: bool = typer.Option(False, "--force", help="Replace a non-empty --out folder."),
        plan_file: Path = typer.Option(None, "--plan", help="A `gpufleet plan --json` file instead of the plan "
                                       "options."),
        rank: int = typer.Option(1, "--rank", help="Which of the ranked plans to launch (1 = best)."),
        check: bool = typer.Option(False, "--check", help="Check FILES for consistency instead of writing."),
        checkpoint_dir: str = typer.Option("/checkpoints", "--checkpoint-dir", help="Where the job saves and "
                                           "loads checkpoints (named in the files)."),
        model: str = ModelOption, tokens: str = TokensOption, gpu: str = GpuOption, gpus: str = GpusOption,
        node: str = NodeOption, fabric: str = FabricOption, topology: str = TopologyOption,
        oversubscription: str = OversubscriptionOption, seq: int = SeqOption,
        global_batch: int = GlobalBatchOption, precision: str = PrecisionOption, rank_by: str = RankByOption,
        fabric_model: str = FabricModelOption, overlap_tp: bool | None = OverlapTpOption,
        dtensor_tp: bool | None = DtensorTpOption, overlap_ep: bool | None = OverlapEpOption,
        overlap_dp: bool | None = OverlapDpOption,
        ep_dispatch: str | None = EpDispatchOption, selective_policy: str | None = SelectivePolicyOption,
        eager: bool = EagerOption, stack: str | None = StackOption,
        tp: str | None = TpOption, pp: str | None = PpOption, vpp: str | None = VppOption,
        cp: str | None = CpOption, ep: str | None = EpOption, etp: str | None = EtpOption,
        micro_batch: str | None = MicroBatchOption, sharding: str | None = ShardingOption,
        recompute: str | None = RecomputeOption,
        catalog: list[Path] = CatalogOption,
        json: bool = JsonOption,
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
        from gpufleet.emit.build import launch_spec, layout_summary
        from gpufleet.emit.registry import resolve_targets
        from gpufleet.emit.start import start_command
        from gpufleet.emit.write import check_out_dir, write_files

        out = Output(json)
        cat = open_catalog(catalog)
        given = WorkloadOptions(model, tokens, gpu, node, fabric, topology, oversubscription, seq, global_batch,
                                precision, rank_by, fabric_model, overlap_tp, dtensor_tp, overlap_ep, ep_dispatch,
                                selective_policy, eager, stack, overlap_dp=overlap_dp,
                                pins=parse_pins(tp, pp, vpp, cp, ep, etp, micro_batch, sharding, recompute))
        named = {name for name in ctx.params
                 if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")}
        if check:
            _check(out, cat, files or [], model if "model" in named else None, gpu_for(cat, node, gpu),
                   gpus if "gpus" in named else None)
            return
        if files:
            raise InputError(f"unexpected argument {files[0]}: files are read only with --check")
        targets = resolve_targets(list(target or []))
        if out_dir is None:
            raise InputError("give --out DIR, the folder to write the launch files to")
        check_out_dir(out_dir, force)
        plan_options = named & set(WorkloadOptions.__dataclass_fields__) | named & {"gpus", "tokens"}
        if plan_file is not None and plan_options:
            flags = ", ".join(sorted("--" + name.replace("_", "-") for name in plan_options))
            raise InputError(f"--plan takes the workload and cluster from the file: drop {flags}")
        given, target_only = _within_target(cat, given, list(target or []), plan_file)
        request, promised = _request(cat, given, gpus, plan_file, rank)
        result = plan_with_spinner(out, request, cat)
        if target_only is not None:
            _note_left_out(out, cat, target_only, request, result)
        if result.economics_error is not None:
            out.warn(f"no checkpoint interval from the reliability model ({result.economics_error}); saving every "
                     "1000 steps")
        spec = launch_spec(result, rank, checkpoint_dir=checkpoint_dir)
        if promised is not None and spec.layout.short() != promised:
            raise InputError(f"--plan {plan_file}: plan #{rank} there is {promised}, but this gpufleet plans "
                             f"{spec.layout.short()} for the same request (another version or catalog): re-run "
                             "`gpufleet plan --json`")
        by_target = _render_targets(out, spec, targets, set(target or []) - {"all"}, out_dir)
        written = write_files(out_dir, [item for items in by_target.values() for item in items], force)
        start = start_command(by_target, out_dir, spec)
        layout = {**layout_summary(spec), "rank": rank, "gpus": spec.cluster.gpus}
        data = {"files": [str(path) for path in written], "layout": layout, "gpus": spec.cluster.gpus,
                "targets": targets, "start": start}
        out.emit(data, _render(by_target, out_dir, start, layout))

    def _check(out: Output, cat: Catalog, files: list[Path], model: str | None, gpu: str,
               gpus: str | None) -> None:
        from gpufleet.emit.check import check_files

        if not files:
            raise InputError("--check needs one or more files: a ds_config.json, a Megatron argument list, a "
                             "torchtitan config module, an FSDP keyword dict or an sbatch script")
        count = parse_int_list(gpus, "--gpus", most=1)[0] if gpus is not None else None
        if model is not None:
            cat.model(model)  # an unknown id is one line now
        report = check_files(cat, files, model, gpu, count)
        data = report.as_dict()
        if report.problems:
            out.check_failed(f"{len(report.problems)} problem(s): " + "; ".join(report.problems), data,
                             report.render)
        out.emit(data, report.render)
