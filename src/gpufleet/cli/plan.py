"""`gpufleet plan`: every layout that fits, ranked by time-to-train (or cost), with --explain."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn
from rich.table import Table

from gpufleet.catalog.records import Precision
from gpufleet.catalog.registry import Catalog
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
from gpufleet.cli.common import (
    MAX_SWEEP_COUNTS,
    CalibrationOption,
    CatalogOption,
    JsonOption,
    check_gpu_count,
    gpu_for,
    open_catalog,
    with_calibration,
)
from gpufleet.cli.output import EXIT_USAGE, Output
from gpufleet.errors import InputError
from gpufleet.fabric.topology import TOPOLOGY_KINDS, TopologyKind
from gpufleet.parallel.layout import SELECTIVE_POLICIES, expert_parallel_degrees
from gpufleet.parallel.memory import TRAINING_PRECISIONS
from gpufleet.planner.model_terms import ModelTerms, parse_model_terms
from gpufleet.planner.pins import LayoutPins, parse_pins
from gpufleet.planner.plan import (
    Plan,
    PlanRequest,
    PlanResult,
    RankBy,
    default_batch_rule,
    make_plan,
    pipeline_warning,
)
from gpufleet.planner.published_runs import framework_options
from gpufleet.planner.search import SearchSpace
from gpufleet.planner.sites import sites_fields
from gpufleet.planner.stack import stack_search_space
from gpufleet.report.plots import check_output_path, write_series_plot
from gpufleet.report.saved import saved_header
from gpufleet.units import parse_count, parse_duration_s, parse_int_list, parse_ratio

if TYPE_CHECKING:
    from gpufleet.planner.sweep import SweepPoint

GIB = 2**30
DAY_S = 86400.0

# The workload, cluster and framework options of `plan`, defined once: `launch` takes the same ones.
ModelOption = typer.Option("llama3-8b", "--model", "-m", help="Model id (gpufleet catalog list models).")
TokensOption = typer.Option("1T", "--tokens", "-t", help="Training tokens, e.g. 15T, 300B.")
GpuOption = typer.Option(None, "--gpu", "-g", help="GPU id (gpufleet catalog list gpus) [default: the --node's GPU, "
                         "else h100-sxm].")
GpusOption = typer.Option("64", "--gpus", "-n",
                          help="GPU count; a list 64,128 or a range sweeps the scale: 64-1024 doubles "
                          "from 64 (64, 128, … 1024; the top end always included), 64-512:64 steps by 64.")
NodeOption = typer.Option(None, "--node", help="Node id; default: the catalog's node for the GPU.")
FabricOption = typer.Option(None, "--fabric", "--network",
                            help="Scale-out network id (ndr400, roce200, socket …); default: the node's.")
TopologyOption = typer.Option("fat-tree", "--topology", help=f"One of {', '.join(TOPOLOGY_KINDS)}.")
OversubscriptionOption = typer.Option("1:1", "--oversubscription", help="Leaf down:up ratio, e.g. 4:1.")
SeqOption = typer.Option(4096, "--seq", help="Sequence length in tokens.")
GlobalBatchOption = typer.Option(None, "--global-batch",
                                 help="Sequences per step; default ~4M tokens per step, at least one "
                                 "sequence per GPU (so a sweep past 1,024 GPUs at 4K raises it).")
PrecisionOption = typer.Option("bf16", "--precision", help="bf16, fp16 or fp8 (fp8 GEMMs).")
RankByOption = typer.Option("time", "--rank-by", help="time (time-to-train) or cost (cheapest cloud).")
FabricModelOption = typer.Option("analytical", "--fabric-model",
                                 help="analytical (α–β, fast) or sim: re-time the top plans' collectives "
                                 "with the flow-level simulator on the topology graph.")
OverlapTpOption = typer.Option(None, "--overlap-tp/--no-overlap-tp", help="The framework hides "
                               "tensor-parallel communication behind GEMMs (Megatron's --tp-comm-overlap, "
                               "userbuffers) [default: off, or the --stack's].")
DtensorTpOption = typer.Option(None, "--dtensor-tp/--megatron-tp", help="Tensor parallelism as PyTorch "
                               "DTensor runs it (torchtitan without AsyncTP): backward collectives in line "
                               "and, under sequence parallelism, the gathered GEMM inputs kept; or as "
                               "Megatron runs it: the input-gradient reduction under the weight-gradient "
                               "GEMM, only the shard kept [default: Megatron, or the --stack's].")
OverlapEpOption = typer.Option(None, "--overlap-ep/--no-overlap-ep", help="The expert all-to-all "
                               "runs while another micro-batch computes (DualPipe, Megatron-Core's "
                               "EP overlap) [default: off, or the --stack's].")
OverlapDpOption = typer.Option(None, "--overlap-dp/--no-overlap-dp", help="The data-parallel gradient "
                               "reduce-scatter/all-reduce and parameter all-gather run under compute "
                               "(Megatron's --overlap-grad-reduce/--overlap-param-gather, DeepSpeed's "
                               "overlap_comm, FSDP prefetch); --no-overlap-dp: they run after the backward, in "
                               "line [default: on].")
EpDispatchOption = typer.Option(None, "--ep-dispatch", help="all-to-all (one copy per routed expert; "
                                "the default) or dedup (a token is sent once per destination "
                                "node over the network and once per destination GPU inside a node: "
                                "DeepEP, HybridEP).")
SelectivePolicyOption = typer.Option(None, "--selective-policy", help="What selective recompute keeps: "
                                     "attention (Megatron: all but the attention core; the default) or op "
                                     "(torchtitan's op-level checkpointing: every second matmul output).")
EagerOption = typer.Option(False, "--eager", help="Element-wise ops run as eager PyTorch, one kernel each "
                           "with an fp32 RMSNorm (torchtitan without torch.compile) [default: fused kernels, "
                           "as Transformer Engine and torch.compile run them].")
StackOption = typer.Option(None, "--stack", help="Plan for a framework's documented settings (attention "
                           "kernel, overlaps, gradient dtype, recompute policy) and without the features it "
                           "lacks (SP, CP, activation offload): a catalog stack id (`gpufleet catalog list "
                           "stacks`: megatron-core, megatron-bridge, nemo, torchtitan, ...). Explicit flags "
                           "override its settings. Default: Megatron-LM's defaults.")
# The step model's optional terms (planner/model_terms.py), shared with `validate`.
StragglersOption = typer.Option(None, "--stragglers", metavar="SIGMA", help="Wait for the slowest GPU: per-GPU "
                                "speed spreads with relative standard deviation SIGMA (e.g. 0.015 or 1.5%, the "
                                "measured spread; at most 20%) and each step waits for the slowest of the job's "
                                "GPUs (sync.stragglers in --explain; docs/dp-scaling.md) [default: off].")
StragglerScopeOption = typer.Option("job", "--straggler-scope", help="With --stragglers: job (the step waits "
                                    "for the slowest of all GPUs, against a median GPU) or replicas (only what "
                                    "data parallelism adds over one replica of tp*pp*cp GPUs) [default: job].")
OverlapContentionOption = typer.Option(None, "--overlap-contention", metavar="FRACTION|measured", help="Compute "
                                       "that runs under a hidden collective runs FRACTION slower (e.g. 0.1 or "
                                       "10%; `measured`: the measured 18.9 %); compute.overlap-contention in "
                                       "--explain (docs/residuals.md) [default: off, hidden collectives are "
                                       "free].")
Fsdp2CopiesOption = typer.Option(None, "--fsdp2-copies/--no-fsdp2-copies", help="Price FSDP2's all-gather "
                                 "copy-out and reduce-scatter copy-in on the compute stream for fully sharded "
                                 "layouts (fsdp.copies in --explain; docs/residuals.md) [default: the --stack's: "
                                 "on for stacks that run fully_shard, such as torchtitan; else off].")


@dataclass(frozen=True)
class WorkloadOptions:
    """The values of the options above, as given (`plan_request` checks them and builds the PlanRequest)."""

    model: str
    tokens: str
    gpu: str | None
    node: str | None
    fabric: str | None
    topology: str
    oversubscription: str
    seq: int
    global_batch: int | None
    precision: str
    rank_by: str
    fabric_model: str
    overlap_tp: bool | None
    dtensor_tp: bool | None
    overlap_ep: bool | None
    ep_dispatch: str | None
    selective_policy: str | None
    eager: bool
    stack: str | None
    terms: ModelTerms = field(default_factory=ModelTerms)  # --stragglers, --overlap-contention, --fsdp2-copies
    overlap_dp: bool | None = None  # --overlap-dp/--no-overlap-dp (None: not given)
    pins: LayoutPins = field(default_factory=LayoutPins)  # --tp, --pp, ... (planner/pins.py)


def check_workload_options(given: WorkloadOptions) -> None:
    """Refuse an option value that is not one of those allowed, with one line."""
    if given.topology not in TOPOLOGY_KINDS:
        raise InputError(f"--topology {given.topology!r} is not one of {', '.join(TOPOLOGY_KINDS)}")
    if given.rank_by not in ("time", "cost"):
        raise InputError(f"--rank-by must be time or cost, got {given.rank_by!r}")
    if given.precision not in TRAINING_PRECISIONS:
        raise InputError(f"--precision must be one of {', '.join(TRAINING_PRECISIONS)}, got {given.precision!r}")
    if given.seq < 1:
        raise InputError(f"--seq must be a positive number of tokens, got {given.seq}")
    if given.global_batch is not None and given.global_batch < 1:
        raise InputError(f"--global-batch must be a positive number of sequences, got {given.global_batch}")
    if given.fabric_model not in ("analytical", "sim"):
        raise InputError(f"--fabric-model must be analytical or sim, got {given.fabric_model!r}")
    if given.ep_dispatch is not None and given.ep_dispatch not in ("all-to-all", "dedup"):
        raise InputError(f"--ep-dispatch must be all-to-all or dedup, got {given.ep_dispatch!r}")
    if given.selective_policy is not None and given.selective_policy not in SELECTIVE_POLICIES:
        raise InputError(f"--selective-policy must be one of {', '.join(SELECTIVE_POLICIES)}, "
                         f"got {given.selective_policy!r}")


def plan_request(cat: Catalog, given: WorkloadOptions, gpus: int, top: int) -> PlanRequest:
    """The PlanRequest the options describe, for one GPU count (options checked by check_workload_options)."""
    check_workload_options(given)
    return PlanRequest(model=given.model, tokens=parse_count(given.tokens, "--tokens"),
                       gpu=gpu_for(cat, given.node, given.gpu), gpus=gpus, node=given.node, network=given.fabric,
                       topology=cast(TopologyKind, given.topology),
                       oversubscription=parse_ratio(given.oversubscription, "--oversubscription"), seq_len=given.seq,
                       global_batch=given.global_batch, precision=cast(Precision, given.precision),
                       top=top, rank_by=cast(RankBy, given.rank_by),
                       fabric_model=cast(Literal["analytical", "sim"], given.fabric_model), pins=given.pins,
                       **framework_fields(cat, given.stack, given.overlap_tp, given.dtensor_tp, given.overlap_ep,
                                          given.ep_dispatch, given.selective_policy, given.eager, given.terms,
                                          given.overlap_dp))


def framework_fields(cat: Catalog, stack: str | None, overlap_tp: bool | None, dtensor_tp: bool | None,
                     overlap_ep: bool | None, ep_dispatch: str | None, selective_policy: str | None,
                     eager: bool, terms: ModelTerms | None = None, overlap_dp: bool | None = None) -> dict[str, Any]:
    """PlanRequest's framework fields: the catalog stack's documented settings, then explicit flags and the step
    model's optional terms."""
    choice = cat.stack_choice(stack) if stack is not None else None  # unknown: one line naming the nearest
    record = choice.record if choice is not None else None
    options = framework_options(record, overlap_tp=overlap_tp, dtensor_tp=dtensor_tp, overlap_ep=overlap_ep,
                                ep_dispatch=ep_dispatch, selective_policy=selective_policy, eager=eager,
                                overlap_dp=overlap_dp)
    options = (terms or ModelTerms()).apply(options)
    return {"options": options, "attention_kernel": record.value("attention_kernel") if record else None,
            "stack": stack, "stack_record": record.id if record else None, "stack_why": choice.why if choice else None,
            "stack_version_assumed": choice.assumed if choice else False,
            "search_space": stack_search_space(record, SearchSpace()) if record else SearchSpace()}


def plan_with_spinner(out: Output, request: PlanRequest, cat: Catalog) -> PlanResult:
    """One plan; a search that runs past a second (large MoE spaces) shows how many layouts it has tried."""
    started = time.monotonic()
    with out.progress(SpinnerColumn(), TextColumn("{task.description}")) as progress:
        task = progress.add_task("searching layouts", visible=False)

        def tried(count: int) -> None:
            if time.monotonic() - started > 1.0:
                progress.update(task, description=f"searching layouts: {count:,} tried", visible=True)

        return make_plan(request, cat, progress=tried)


def plan_to_dict(plan: Plan, result: PlanResult) -> dict[str, Any]:
    step = plan.candidate.step
    memory = plan.candidate.memory
    data: dict[str, Any] = {
        "rank": plan.rank,
        "layout": {
            "tp": plan.layout.tp, "pp": plan.layout.pp, "dp": plan.layout.dp, "cp": plan.layout.cp,
            "ep": plan.layout.ep,
            "expert_tp": expert_parallel_degrees(plan.layout)[0] if result.job.model.moe is not None else None,
            "vpp": plan.layout.vpp,
            "sequence_parallel": plan.layout.sequence_parallel,
            "sharding": plan.layout.sharding, "micro_batch": plan.layout.micro_batch,
            "recompute": plan.layout.recompute, "recompute_layers": plan.layout.recompute_layers,
            "offload_activation_layers": plan.layout.offload_activation_layers,
            "label": plan.layout.short(),
        },
        "peak_memory_bytes": memory.total_bytes,
        "hbm_bytes": result.cluster.gpu.hbm_bytes,
        "memory": memory.as_dict(),
        "host_memory_bytes": memory.host_bytes,  # pinned CPU memory per GPU (offloaded tensors)
        "step_s": step.step_s,
        "tokens_per_s": step.tokens_per_s,
        "tokens_per_s_per_gpu": step.tokens_per_s_per_gpu,
        "mfu": step.mfu,
        "hfu": step.hfu,
        "train_time_s": plan.train_time_s,
        "time_to_train_s": plan.wall_time_s,
        "parts": {name: {"exposed_s": part.exposed_s, "hidden_s": part.hidden_s, "link": part.link}
                  for name, part in step.parts.items()},
        "micro_batches": step.micro_batches,
        # the 80 % interval of each prediction, in its own unit (planner/intervals.py; docs/validation.md)
        "intervals": {name: interval.as_json() for name, interval in plan.intervals.items()},
        "warnings": [warning] if (warning := pipeline_warning(plan)) else [],
    }
    econ = plan.economics
    if econ is not None:
        data["goodput"] = econ.goodput
        data["cost"] = {
            "offers": [{"name": o.name, "usd": o.usd, "usd_per_gpu_hour": o.usd_per_gpu_hour} for o in econ.offers],
            "skipped_offers": [{"name": o.name, "max_gpus": o.max_gpus, "beyond": o.beyond, "reason": o.reason}
                               for o in econ.skipped_offers],
            "onprem_usd": econ.onprem_usd,
        }
        data["power"] = {"it_power_max_w": econ.it_power_max_w, "facility_power_w": econ.facility_power_w,
                         "racks": econ.racks}
        data["reliability"] = {"interruptions_expected": econ.interruptions_expected,
                               "checkpoint_interval_s": econ.checkpoint_interval_s,
                               "checkpoint_write_s": econ.checkpoint_write_s}
    return data


def result_to_dict(result: PlanResult) -> dict[str, Any]:
    job, cluster = result.job, result.cluster
    return {
        **saved_header(result.request),  # what `gpufleet report PLAN.json` needs to re-run and draw it
        "job": {"model": job.model.id, "tokens": job.tokens, "seq_len": job.seq_len,
                "global_batch": job.global_batch, "precision": job.precision,
                "global_batch_chosen_by": "planner" if result.request.global_batch is None else "user",
                **({"global_batch_rule": default_batch_rule(job.seq_len, cluster.gpus)}
                   if result.request.global_batch is None else {})},
        "cluster": {"gpu": cluster.gpu.id, "gpus": cluster.gpus, "node": cluster.node.id,
                    "network": cluster.fabric.network.id, "topology": cluster.fabric.kind,
                    "oversubscription": cluster.fabric.oversubscription},
        "ranking": {"rank_by": result.request.rank_by, "fabric_model": result.request.fabric_model},
        "search": {"tried": result.search.tried, "feasible": result.search.fit,
                   "infeasible": dict(result.search.infeasible)},
        "framework": framework_to_dict(result.request),
        "plans": [plan_to_dict(p, result) for p in result.plans],
        "economics_unavailable": result.economics_error,
    }


def framework_note(request: PlanRequest) -> str | None:
    """The header line naming framework settings that differ from Megatron-LM's defaults, or None."""
    said = [request.stack_line] if request.stack_line else []
    if not request.options.fused_elementwise:
        said.append("eager element-wise kernels (no torch.compile)")
    if not request.options.dp_overlap:
        said.append("data-parallel communication in line (not overlapped)")
    if request.options.straggler_sigma:
        said.append(f"stragglers sigma {request.options.straggler_sigma:.2%} over the "
                    f"{'replicas' if request.options.straggler_scope == 'replicas' else 'job'}")
    if request.options.overlap_slowdown:
        said.append(f"compute {request.options.overlap_slowdown:.1%} slower under hidden collectives")
    return f"framework: {', '.join(said)} (--json: \"framework\")" if said else None


def framework_to_dict(request: PlanRequest) -> dict[str, Any]:
    """The framework behaviours the plan assumed (`--stack` and the overlap/recompute flags)."""
    options, memory = request.options, request.options.memory
    return {"stack": request.stack, "stack_record": request.stack_record, "stack_resolution": request.stack_why,
            "stack_version_assumed": request.stack_version_assumed, "attention_kernel": request.attention_kernel,
            "tp_comm_overlap": options.tp_comm_overlap, "tp_async_backward": options.tp_async_backward,
            "tp_gathered_inputs": memory.tp_gathered_inputs, "ep_comm_overlap": options.ep_comm_overlap,
            "ep_dispatch": options.ep_dispatch, "fused_elementwise": options.fused_elementwise,
            "dp_overlap": options.dp_overlap,
            "grad_dtype": memory.grad_dtype, "fp32_params": memory.fp32_params,
            "selective_policy": memory.selective_policy, "ep_imbalance": options.ep_imbalance,
            "moe_dropless": options.moe_dropless, "loss_bytes_per_logit": options.loss_bytes_per_logit,
            "straggler_sigma": options.straggler_sigma, "straggler_scope": options.straggler_scope,
            "overlap_slowdown": options.overlap_slowdown, "fsdp2_copies": options.fsdp2_copies,
            "logits_bytes_per_element": memory.logits_bytes_per_element,
            "activation_offload": request.search_space.activation_offload,
            "sequence_parallel": request.search_space.sequence_parallel,
            "context_parallel": request.search_space.cps != (1,)}


def _days(seconds: float) -> str:
    """Hours under a day, days under three years, then years (a 1e30-token job reads 2.3e+10 y, not 20 digits)."""
    years = seconds / (365.25 * DAY_S)
    if years >= 3:
        return f"{years:,.0f} y" if years < 1e6 else f"{years:.2g} y"
    return f"{seconds / DAY_S:.1f} d" if seconds >= DAY_S else f"{seconds / 3600:.1f} h"


def _in_unit_of(seconds: float, shown_s: float) -> str:
    """`seconds` in the unit `_days(shown_s)` uses (h, d or y), three significant figures, without the unit."""
    unit = _days(shown_s).rsplit(" ", 1)[-1]
    per = {"h": 3600.0, "d": DAY_S, "y": 365.25 * DAY_S}[unit]
    return f"{seconds / per:.3g}"


def _money(usd: float) -> str:
    """$12,345 under a million, then $1.23M, $4.56B, then powers of ten."""
    if usd < 1e6:
        return f"${usd:,.0f}"
    for scale, unit in ((1e9, "B"), (1e6, "M")):
        if usd >= scale and usd < scale * 1e3:
            return f"${usd / scale:,.2f}{unit}"
    return f"${usd:.2g}"


def _range(plan: Plan, name: str, spelled: Callable[[float], str]) -> str:
    """` (low–high)`: the 80 % interval of one prediction in a table cell, or nothing when there is none."""
    interval = plan.intervals.get(name)
    return f" ({spelled(interval.low)}–{spelled(interval.high)})" if interval is not None else ""


def render_result(console: Console, result: PlanResult) -> None:
    job, cluster = result.job, result.cluster
    console.print(
        f"[bold]{job.model.name}[/bold], {job.tokens / 1e9:,.0f}B tokens, seq {job.seq_len}, "
        f"batch {job.global_batch} ({job.precision}) on {cluster.gpus} x {cluster.gpu.id} "
        f"({cluster.node.id}, {cluster.fabric.network.id} {cluster.fabric.kind} "
        f"{cluster.fabric.oversubscription:g}:1)"
    )
    console.print(f"MFU and HFU are against {cluster.gpu.id}'s dense {job.precision} peak, "
                  f"{cluster.gpu.peak_flops(job.precision) / 1e12:,.1f} TFLOP/s")
    if result.request.global_batch is None:
        console.print(f"batch: {default_batch_rule(job.seq_len, cluster.gpus)} (--global-batch N to choose)")
    note = framework_note(result.request)
    if note:
        console.print(note)
    sites, wan_gbps, wan_latency_s = result.request.sites, result.request.wan_gbps, result.request.wan_latency_s
    if sites > 1 and wan_gbps is not None and wan_latency_s is not None:
        console.print(f"over {sites} sites of {cluster.gpus // sites} GPUs, joined by {wan_gbps:g} Gb/s at "
                      f"{wan_latency_s * 1e3:g} ms one way (comm.wan in --explain; docs/two-sites.md)")
    reasons = ", ".join(f"{n} {r}" for r, n in result.search.infeasible.most_common())
    console.print(f"layouts tried {result.search.tried}: {result.search.fit} fit; "
                  f"rejected: {reasons or 'none'}")
    table = Table(show_lines=False)
    for column in ("#", "layout", "mem/HBM", "step", "tok/s/GPU", "MFU", "goodput", "train time",
                   "cheapest cloud"):
        table.add_column(column, justify="left" if column in ("layout", "cheapest cloud") else "right",
                         no_wrap=column == "layout" and console.width >= 120)
    for plan in result.plans:
        step = plan.candidate.step
        econ = plan.economics
        cheapest = econ.cheapest_offer if econ else None
        table.add_row(
            str(plan.rank), plan.layout.short(),
            f"{plan.candidate.memory.total_bytes / GIB:.1f}/{cluster.gpu.hbm_bytes / GIB:.0f} GiB",
            f"{step.step_s:.2f} s" + _range(plan, "step_s", lambda v: f"{v:.3g}"),
            f"{step.tokens_per_s_per_gpu:,.0f}" + _range(plan, "tokens_per_s_per_gpu", lambda v: f"{v:,.0f}"),
            f"{step.mfu:.1%}",
            f"{econ.goodput:.1%}" if econ else "-",
            _days(plan.wall_time_s) + _range(plan, "time_to_train_s", functools.partial(_in_unit_of,
                                                                                         shown_s=plan.wall_time_s)),
            f"{_money(cheapest.usd)} {cheapest.name}" if cheapest else "-",
        )
    console.print(table)
    shown = result.plans[0].step_interval if result.plans else None
    if shown is not None:
        console.print(f"(low–high): the 80% interval from the model's own leave-one-source-out error on measured "
                      f"runs of the plan's regime ({shown.regime}: {shown.runs} runs"
                      f"{', widened' if shown.widened else ''}; docs/validation.md)")
    skipped = next((p.economics.skipped_offers for p in result.plans if p.economics is not None), ())
    if skipped:
        from gpufleet.economics.cloud import describe_skipped

        console.print(describe_skipped(list(skipped), cluster.gpus))
    for plan in result.plans:
        warning = pipeline_warning(plan)
        if warning:
            console.print(f"warning: {warning}")


def render_explain(console: Console, plan: Plan, result: PlanResult) -> None:
    step = plan.candidate.step
    console.print(f"[bold]plan #{plan.rank}[/bold]: {plan.layout.short()} — step {step.step_s:.3f} s, "
                  f"{step.micro_batches} micro-batches, MFU {step.mfu:.1%}, HFU {step.hfu:.1%}")
    table = Table(title="step time by part (per GPU on the critical path)", title_justify="left")
    for column in ("part", "exposed", "hidden", "share", "link / bound"):
        table.add_column(column, justify="left" if column in ("part", "link / bound") else "right")
    for name, part in step.parts.items():
        if part.total_s <= 0:
            continue
        table.add_row(name, f"{part.exposed_s * 1e3:,.1f} ms", f"{part.hidden_s * 1e3:,.1f} ms",
                      f"{part.exposed_s / step.step_s:.1%}", part.link)
    console.print(table)
    memory = plan.candidate.memory
    console.print("memory (worst stage " + str(plan.candidate.peak_stage) + "): " + ", ".join(
        f"{kind} {value / GIB:.1f} GiB" for kind, value in memory.as_dict().items())
        + (f"; pinned host memory {memory.host_bytes / GIB:.1f} GiB per GPU" if memory.host_bytes else ""))
    econ = plan.economics
    if econ:
        console.print(f"reliability: {econ.interruptions_per_day:.2f} interruptions/day, checkpoint every "
                      f"{econ.checkpoint_interval_s / 60:.0f} min, goodput {econ.goodput:.1%}; power "
                      f"{econ.it_power_max_w / 1e3:,.0f} kW IT max, {econ.racks} racks")


def sweep_row(point: SweepPoint) -> dict[str, Any]:
    """One GPU count of a sweep as `--json` writes it: its best plan, or why it has none."""
    if point.result is None:
        return {"gpus": point.gpus, "fits": False, "verdict": point.verdict, "reason": point.reason}
    result = point.result
    row = {"gpus": point.gpus, "global_batch": result.job.global_batch, "fits": True,
           **plan_to_dict(point.best, result)}
    if result.economics_error is not None:
        row["economics_unavailable"] = result.economics_error
    return row


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan(
        model: str = ModelOption,
        tokens: str = TokensOption,
        gpu: str = GpuOption,
        gpus: str = GpusOption,
        node: str = NodeOption,
        fabric: str = FabricOption,
        topology: str = TopologyOption,
        oversubscription: str = OversubscriptionOption,
        seq: int = SeqOption,
        global_batch: int = GlobalBatchOption,
        precision: str = PrecisionOption,
        top: int = typer.Option(None, "--top", help="How many plans to show [default: 5; a sweep shows the best "
                                "plan per GPU count]."),
        explain: int = typer.Option(None, "--explain", help="Break plan RANK down part by part (--json always "
                                    "carries every shown plan's parts)."),
        rank_by: str = RankByOption,
        deadline: str = typer.Option(None, "--deadline",
                                     help="e.g. 30d: find the smallest GPU count (of --gpus) that meets it."),
        budget: float = typer.Option(None, "--budget", help="USD: the fastest plan whose cheapest cloud cost fits."),
        html_report: Path = typer.Option(None, "--html", help="Also write a self-contained HTML report to FILE "
                                         "(ranked plans, memory per stage, step time, scaling, cost over time, power, "
                                         "goodput; docs/report.md); works for one count and for a sweep."),
        plot: Path = typer.Option(None, "--plot", help="With a GPU-count sweep: write the best plan's tokens/s per "
                                  "GPU against GPUs to FILE (.png/.svg/.pdf need matplotlib; .html writes a table)."),
        fabric_model: str = FabricModelOption,
        overlap_tp: bool | None = OverlapTpOption,
        dtensor_tp: bool | None = DtensorTpOption,
        overlap_ep: bool | None = OverlapEpOption,
        overlap_dp: bool | None = OverlapDpOption,
        ep_dispatch: str | None = EpDispatchOption,
        selective_policy: str | None = SelectivePolicyOption,
        eager: bool = EagerOption,
        stack: str | None = StackOption,
        tp: str | None = TpOption, pp: str | None = PpOption, vpp: str | None = VppOption,
        cp: str | None = CpOption, ep: str | None = EpOption, etp: str | None = EtpOption,
        micro_batch: str | None = MicroBatchOption, sharding: str | None = ShardingOption,
        recompute: str | None = RecomputeOption,
        stragglers: str | None = StragglersOption,
        straggler_scope: str = StragglerScopeOption,
        overlap_contention: str | None = OverlapContentionOption,
        fsdp2_copies: bool | None = Fsdp2CopiesOption,
        sites: int = typer.Option(None, "--sites", help="Sites the GPUs split over evenly (1-8), joined by "
                                  "--wan-gbps and --wan-latency; data or pipeline parallelism crosses them "
                                  "(docs/two-sites.md)."),
        wan_gbps: float = typer.Option(None, "--wan-gbps", help="With --sites: the link between sites, Gb/s "
                                       "each way (what it delivers)."),
        wan_latency: str = typer.Option(None, "--wan-latency", help="With --sites: the link's one-way latency, "
                                        "e.g. 5ms."),
        catalog: list[Path] = CatalogOption,
        calibration: Path | None = CalibrationOption,
        json: bool = JsonOption,
    ) -> None:
        """Rank every parallel layout that fits in memory by time-to-train.

        Examples:

        * `gpufleet plan` — Llama 3.1 8B, 1T tokens on 64 H100s.
        * `gpufleet plan -m llama3-70b -t 15T -g h100-sxm -n 1024 --explain 1`
        * `gpufleet plan -m llama3-70b -t 2T -n 256-4096 --deadline 30d` — smallest cluster that meets it.
        * `gpufleet plan -m llama3-70b -n 2048 --sites 2 --wan-gbps 200 --wan-latency 5ms --explain 1` — two sites.
        * `gpufleet plan -m llama3-70b -n 256 --stack megatron-bridge --tp 4 --pp 8 --vpp 1-4` — price your own layout
          (pin a field to a value, a list or a range; a pinned field overrides the stack's default).
        * `gpufleet plan -m llama3-70b -n 64 --stack deepspeed` — only what DeepSpeed can run.
        """
        out = Output(json)
        cat = open_catalog(with_calibration(catalog, calibration))
        given = WorkloadOptions(model, tokens, gpu, node, fabric, topology, oversubscription, seq, global_batch,
                                precision, rank_by, fabric_model, overlap_tp, dtensor_tp, overlap_ep, ep_dispatch,
                                selective_policy, eager, stack,
                                parse_model_terms(stragglers, straggler_scope, overlap_contention, fsdp2_copies),
                                overlap_dp, parse_pins(tp, pp, vpp, cp, ep, etp, micro_batch, sharding, recompute))
        check_workload_options(given)
        if budget is not None and budget <= 0:
            raise InputError(f"--budget must be positive, got {budget}")
        counts = parse_int_list(gpus, "--gpus", most=MAX_SWEEP_COUNTS)
        check_gpu_count(max(counts))
        site_fields = sites_fields(sites, wan_gbps, wan_latency, counts, fabric_model)
        deadline_s = parse_duration_s(deadline, "--deadline") if deadline else None
        sweep = len(counts) > 1 or deadline_s is not None
        single_only = {"--top": top, "--explain": explain, "--budget": budget}
        single_given = [flag for flag, value in single_only.items() if value is not None]
        if sweep and single_given:
            verb = "applies" if len(single_given) == 1 else "apply"
            raise InputError(f"{', '.join(single_given)} {verb} to one GPU count; a sweep (--gpus list or range, or "
                             "--deadline) shows the best plan per count — plan one count to use them")
        if not sweep and plot is not None:
            raise InputError("--plot draws a GPU-count sweep: give --gpus a list or a range, e.g. 64,128 or 64-1024")
        if plot is not None:
            check_output_path(plot, "--plot")
        if html_report is not None:
            check_output_path(html_report, "--html", (".html", ".htm"))
        top = 5 if top is None else top
        if top < 1:
            raise InputError(f"--top must be at least 1, got {top}")
        if explain is not None and not 1 <= explain <= top:
            raise InputError(f"--explain RANK must be between 1 and --top ({top})")
        base = replace(plan_request(cat, given, counts[0], top), **site_fields)
        if not sweep:
            result = plan_with_spinner(out, base, cat)
            _emit_single(out, result, explain, budget, top, html_report, cat)
            return
        _emit_sweep(out, cat, base, counts, deadline_s, plot, html_report)

    def _emit_single(out: Output, result: PlanResult, explain: int | None, budget: float | None, top: int,
                     html_report: Path | None = None, cat: Any = None) -> None:
        if result.economics_error is not None:
            if result.request.rank_by == "cost":
                out.check_failed(f"--rank-by cost needs the plans' cost, which cannot be computed: "
                                 f"{result.economics_error}", result_to_dict(result))
            if budget is not None:
                out.check_failed(f"--budget needs the plans' cost, which cannot be computed: "
                                 f"{result.economics_error}", result_to_dict(result))
            out.warn(f"step times stand, but no cost, power or goodput: {result.economics_error}")
        if budget is not None:
            from gpufleet.planner.sweep import within_budget

            within = within_budget(result.plans, budget)
            if not within:
                out.check_failed(f"no plan's cheapest cloud cost fits the ${budget:,.0f} budget; cheapest is "
                                 f"${min((p.cheapest_usd or float('inf')) for p in result.plans):,.0f}",
                                 {**result_to_dict(result), "budget_usd": budget, "plans": []})
            result.plans = within
        if explain is not None and not 1 <= explain <= len(result.plans):
            raise InputError(f"--explain must be between 1 and {len(result.plans)}")
        shown = result.plans[:top]
        data = result_to_dict(result)
        data["plans"] = [plan_to_dict(p, result) for p in shown]
        if html_report is not None:
            from gpufleet.report.plan_figures import plan_figures
            from gpufleet.report.plan_html import write_plan_report

            view = PlanResult(result.request, result.job, result.cluster, result.search, shown, result.economics_error)
            write_plan_report(html_report, plan_figures(view, cat), "Planned by gpufleet plan.")
            data["html"] = str(html_report)

        def render(console: Console) -> None:
            view = PlanResult(result.request, result.job, result.cluster, result.search, shown,
                              result.economics_error)
            render_result(console, view)
            if explain is not None:
                render_explain(console, result.plans[explain - 1], result)

        out.emit(data, render)

    def _emit_sweep(out: Output, cat: Any, base: PlanRequest, counts: list[int], deadline_s: float | None,
                    plot: Path | None, html_report: Path | None = None) -> None:
        from gpufleet.planner.sweep import sweep_counts

        started = time.monotonic()
        with out.progress(*Progress.get_default_columns()) as progress:
            task = progress.add_task("planning", total=len(counts))

            def advance() -> None:
                progress.advance(task)
                progress.update(task, visible=time.monotonic() - started >= 1.0)

            found = sweep_counts(base, counts, cat, deadline_s, advance)
        rows = [sweep_row(point) for point in found.points]
        results = {point.gpus: point.result for point in found.points if point.result is not None}  # for --html
        chosen = (next(row for row in rows if row["gpus"] == found.smallest_meeting_deadline.gpus)
                  if found.smallest_meeting_deadline else None)
        unavailable = [row for row in rows if row.get("economics_unavailable")]
        if unavailable:
            out.warn(f"step times stand, but no cost, power or goodput at "
                     f"{', '.join(str(row['gpus']) for row in unavailable)} GPUs: "
                     f"{unavailable[0]['economics_unavailable']}")
        if not any(row["fits"] for row in rows):
            message = f"no GPU count in the sweep has a plan; at {rows[0]['gpus']} GPUs: {rows[0]['reason']}"
            if all(row["verdict"] == "no legal layout" for row in rows):
                out.fail(message, EXIT_USAGE)  # counts to change, as for one count
            out.check_failed(message, {"framework": framework_to_dict(base), "sweep": rows})
        data: dict[str, Any] = {**saved_header(base), "framework": framework_to_dict(base), "sweep": rows}
        if html_report is not None:
            from gpufleet.report.plan_html import write_plan_report
            from gpufleet.report.saved import sweep_report_figures

            write_plan_report(html_report, sweep_report_figures(results, cat, deadline_s),
                              "Planned by gpufleet plan over a GPU-count sweep; the detail is the count named above.")
            data["html"] = str(html_report)
        if plot is not None:
            fitting = [row for row in rows if row["fits"]]
            label = f"{base.model} on {base.gpu}"
            write_series_plot(plot, {label: [(r["gpus"], r["tokens_per_s_per_gpu"]) for r in fitting]},
                              x_label="GPUs", y_label="tokens/s per GPU (best plan)",
                              title="scaling sweep: per-GPU throughput of the best plan")
            data["plot"] = str(plot)
        if deadline_s is not None:
            data["deadline_s"] = deadline_s
            data["smallest_meeting_deadline"] = chosen["gpus"] if chosen else None
            cheapest = found.cheapest_meeting_deadline
            data["cheapest_meeting_deadline"] = (
                {"gpus": cheapest.gpus, "offer": cheapest.offer.name, "usd": cheapest.offer.usd} if cheapest else None)

        def render(console: Console) -> None:
            gpu_spec = cat.gpu(base.gpu)
            console.print(f"[bold]{cat.model(base.model).name}[/bold], {base.tokens / 1e9:,.0f}B tokens, seq "
                          f"{base.seq_len} ({base.precision}) on {base.gpu}"
                          + (f" ({base.node})" if base.node else "")
                          + f"; MFU against the dense {base.precision} peak, "
                          f"{gpu_spec.peak_flops(base.precision) / 1e12:,.1f} TFLOP/s")
            note = framework_note(base)
            if note:
                console.print(note)
            table = Table(title="scaling sweep (best plan per GPU count)", title_justify="left")
            for column in ("GPUs", "batch", "layout", "step", "tok/s/GPU", "MFU", "time-to-train"):
                table.add_column(column, justify="left" if column == "layout" else "right")
            for row in rows:
                if not row["fits"]:
                    table.add_row(str(row["gpus"]), "", f"[red]{row['verdict']}[/red]", "", "", "", "")
                    continue
                table.add_row(str(row["gpus"]), f"{row['global_batch']:,}", row["layout"]["label"],
                              f"{row['step_s']:.2f} s",
                              f"{row['tokens_per_s_per_gpu']:,.0f}", f"{row['mfu']:.1%}",
                              _days(row["time_to_train_s"]))
            console.print(table)
            if base.global_batch is None and len({row.get("global_batch") for row in rows if row["fits"]}) > 1:
                console.print("batch: ~4M tokens per step, at least one sequence per GPU (set --global-batch to "
                              "compare GPU counts at one batch)")
            if deadline_s is not None:
                if chosen:
                    console.print(f"smallest cluster meeting {_days(deadline_s)}: [bold]{chosen['gpus']} GPUs[/bold]"
                                  f" ({_days(chosen['time_to_train_s'])})")
                cheap = data.get("cheapest_meeting_deadline")
                if cheap:
                    console.print(f"cheapest plan meeting it: [bold]{cheap['gpus']} GPUs[/bold] on {cheap['offer']}, "
                                  f"${cheap['usd']:,.0f}")

        if deadline_s is not None and chosen is None:
            fastest = min((row for row in rows if row["fits"]), key=lambda row: row["time_to_train_s"])
            out.check_failed(f"no GPU count in the sweep meets the deadline of {_days(deadline_s)}; the fastest, "
                             f"{fastest['gpus']} GPUs, takes {_days(fastest['time_to_train_s'])}", data, render)
        out.emit(data, render)
