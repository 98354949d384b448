"""`gpufleet launch` as a request: which targets to write where, for which plan (the workload options, or a saved
`plan --json` file and a rank), or which files to `--check`. The CLI parses flags into a LaunchRequest, plans, and
calls `write_launch` (cli/launch.py); the rules between the flags and the plan file live here, so the Python API
refuses what the CLI refuses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import model_validator

from gpufleet import __version__
from gpufleet.catalog.registry import Catalog
from gpufleet.catalog.stacks import Fp8Recipe, LaunchTarget
from gpufleet.emit.spec import EmittedFile, LaunchSpec
from gpufleet.errors import InputError
from gpufleet.input_files import load_json
from gpufleet.planfile import read_plan_file
from gpufleet.planner.model_terms import DpOverlapWindow, ModelTerms, StragglerScope
from gpufleet.planner.pins import LayoutPins
from gpufleet.planner.plan import PlanRequest, PlanResult
from gpufleet.planner.plan_json import framework_record
from gpufleet.planner.plan_options import WorkloadOptions
from gpufleet.request import Request, check_gpu_count
from gpufleet.units import parse_int_list

if TYPE_CHECKING:
    from gpufleet.emit.check import CheckReport

#: How many plans a launch from the options ranks (at least its --rank).
LAUNCH_TOP = 5


class LaunchRequest(Request):
    """What `gpufleet launch` was asked. `plan_flags`: the workload and cluster options given on the command line
    (WorkloadOptions field names, or gpus), which a plan file replaces."""

    check: bool = False
    files: tuple[Path, ...] = ()
    targets: tuple[str, ...] = ()
    out_dir: Path | None = None
    force: bool = False
    plan_file: Path | None = None
    rank: int = 1
    checkpoint_dir: str = "/checkpoints"
    gpus: str = "64"
    plan_flags: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> LaunchRequest:
        from gpufleet.emit.registry import resolve_targets
        from gpufleet.emit.write import check_out_dir

        if self.check:
            if not self.files:
                raise InputError("--check needs one or more files: a ds_config.json, a Megatron argument list, a "
                                 "torchtitan config module, an FSDP keyword dict or an sbatch script")
            return self
        if self.files:
            raise InputError(f"unexpected argument {self.files[0]}: files are read only with --check")
        resolve_targets(list(self.targets))  # an unknown target is one line now, before anything is planned
        check_out_dir(self.folder, self.force)
        if self.plan_file is not None and self.plan_flags:
            flags = ", ".join(sorted("--" + name.replace("_", "-") for name in self.plan_flags))
            raise InputError(f"--plan takes the workload and cluster from the file: drop {flags}")
        if self.rank < 1:
            raise InputError(f"--rank must be at least 1, got {self.rank}")
        return self

    @property
    def folder(self) -> Path:
        """--out (a launch that writes needs one)."""
        if self.out_dir is None:
            raise InputError("give --out DIR, the folder to write the launch files to")
        return self.out_dir

    @property
    def resolved_targets(self) -> list[str]:
        from gpufleet.emit.registry import resolve_targets

        return resolve_targets(list(self.targets))


@dataclass(frozen=True)
class LaunchPlan:
    """The plan request a launch searches, the layout label the plan file promises at --rank (None without a file),
    and the one framework target that narrowed the search (None when none did)."""

    request: PlanRequest
    promised: str | None = None
    target_only: LaunchTarget | None = None


def launch_plan(launch: LaunchRequest, given: WorkloadOptions, cat: Catalog) -> LaunchPlan:
    """The plan request from the options (within the one framework target named, if any) or from the plan file."""
    from gpufleet.emit.within_target import check_launchable, framework_target, stack_for_target

    target = framework_target(list(launch.targets))
    if launch.plan_file is None:
        if target is not None:
            given = given.model_copy(update={"stack": stack_for_target(cat, target, given.stack)})
        elif given.stack is not None:
            check_launchable(cat, given.stack)
        counts = parse_int_list(launch.gpus, "--gpus", most=1)
        check_gpu_count(counts[0])
        return LaunchPlan(given.plan_request(cat, counts[0], max(launch.rank, LAUNCH_TOP)), None, target)
    path = launch.plan_file
    data = load_json(path, "--plan")
    if not isinstance(data, dict):
        raise InputError(f"--plan {path} is not a JSON object")
    from_file, count, label = _options_from_plan_file(path, data, launch.rank)
    if from_file.stack is not None:
        check_launchable(cat, from_file.stack)
    saved = read_plan_file(data, f"--plan {path}")
    request = from_file.plan_request(cat, count, max(launch.rank, len(saved.plans or [])))
    if framework_record(request) != saved.framework:
        raise InputError(f"--plan {path}: its framework settings are not this version's: re-run "
                         "`gpufleet plan --json`")
    return LaunchPlan(request, label)


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
            overlap_tp=framework.tp_comm_overlap, dtensor_tp=not framework.tp_async_backward,
            overlap_ep=framework.ep_comm_overlap, ep_dispatch=framework.ep_dispatch,
            selective_policy=framework.selective_policy, eager=not framework.fused_elementwise,
            stack=framework.stack,
            terms=ModelTerms(framework.straggler_sigma, cast(StragglerScope, framework.straggler_scope),
                             framework.overlap_slowdown, framework.fsdp2_copies, framework.fp8_amax_sync_sigma,
                             cast(DpOverlapWindow, framework.dp_overlap_window),
                             cast(Fp8Recipe, framework.fp8_recipe), framework.pp_p2p_overlap),
            overlap_dp=framework.dp_overlap,
            pins=LayoutPins.from_saved(saved.request.get("pins", {}), f"--plan {path}: request.pins"))
        return given, cluster.gpus, label
    except (KeyError, TypeError, ValueError) as error:
        raise InputError(f"--plan {path} is not a `gpufleet plan --json` file (missing or bad {error})") from error


@dataclass(frozen=True)
class Launched:
    """What a launch wrote: the spec of the plan, each target's files, the paths written and the start command."""

    spec: LaunchSpec
    by_target: dict[str, list[EmittedFile]]
    written: list[Path]
    start: str | None


def write_launch(launch: LaunchRequest, planned: LaunchPlan, result: PlanResult, cat: Catalog,
                 warn: Callable[[str], None]) -> Launched:
    """Write the launch files of plan #rank of `result` (the search of `planned.request`); `warn` hears what the
    target left out, a checkpoint interval that could not be computed, and targets skipped from `all`."""
    from gpufleet.emit.build import launch_spec
    from gpufleet.emit.start import start_command
    from gpufleet.emit.write import write_files

    if planned.target_only is not None:
        note = left_out_note(cat, planned.target_only, planned.request, result)
        if note is not None:
            warn(note)
    if result.economics_error is not None:
        warn(f"no checkpoint interval from the reliability model ({result.economics_error}); saving every 1000 steps")
    spec = launch_spec(result, launch.rank, checkpoint_dir=launch.checkpoint_dir)
    if planned.promised is not None and spec.layout.short() != planned.promised:
        raise InputError(f"--plan {launch.plan_file}: plan #{launch.rank} there is {planned.promised}, but this "
                         f"gpufleet plans {spec.layout.short()} for the same request (another version or catalog): "
                         "re-run `gpufleet plan --json`")
    folder = launch.folder
    by_target = render_targets(spec, launch.resolved_targets, set(launch.targets) - {"all"}, folder, warn)
    written = write_files(folder, [item for items in by_target.values() for item in items], launch.force)
    return Launched(spec, by_target, written, start_command(by_target, folder, spec))


def left_out_note(cat: Catalog, target: LaunchTarget, request: PlanRequest, result: PlanResult) -> str | None:
    """What the best plan of any framework would have gained, when the target cannot run it; else None."""
    from gpufleet.emit.within_target import left_out
    from gpufleet.planner.plan import make_plan
    from gpufleet.planner.search import SearchSpace

    overall = make_plan(replace(request, stack=None, search_space=SearchSpace(), top=1), cat)
    missed = left_out(target, result, overall)
    return missed.sentence(target) if missed is not None else None


def render_targets(spec: LaunchSpec, targets: list[str], explicit: set[str], out_dir: Path,
                   warn: Callable[[str], None]) -> dict[str, list[EmittedFile]]:
    """Each target's files; a target that cannot express the plan is refused when named, skipped (with a warning)
    when it came from `all`."""
    from gpufleet.emit.registry import emitter
    from gpufleet.emit.spec import TargetCannotExpress

    by_target: dict[str, list[EmittedFile]] = {}
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
            warn(f"{error} (skipped from --target all)")
    if not by_target:
        raise InputError("no target can express this plan: " + ", ".join(targets))
    return by_target


def check_launch_files(cat: Catalog, files: list[Path], model: str | None, gpu: str,
                       gpus: str | None) -> CheckReport:
    """`launch --check`: the files checked together, against `model` (a catalog id) when given."""
    from gpufleet.emit.check import check_files

    count = parse_int_list(gpus, "--gpus", most=1)[0] if gpus is not None else None
    if model is not None:
        cat.model(model)  # an unknown id is one line now
    return check_files(cat, files, model, gpu, count)
