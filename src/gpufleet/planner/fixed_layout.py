"""The planner's step for one given layout rather than the best of all: a plain PyTorch FSDP2 job, which is what
`gpufleet burnin` runs and what the loop check prices (`burnin --measure-host` ends by comparing it with the
measured step).

A plain PyTorch FSDP2 training loop, as the planner's request: data parallel over every rank with the parameters
fully sharded (`fully_shard`), no TP, PP or CP, no recompute, eager element-wise ops (no fused kernels), PyTorch's
cross-entropy (the bytes per logit the catalog's torchtitan stack states for it). A MoE model keeps every expert
on every rank (`ep=1`, no all-to-all): `fully_shard` shards the experts' weights like any other and each rank
computes every expert on its own tokens, as the burn-in's MoE model does; routing is dropless (the step options'
default), so the host time of the MoE layer's many small kernels counts in full (`host.moe`).
`overlap` says whether FSDP2's collectives run under compute: on GPUs NCCL runs on its own SMs and FSDP2
prefetches, while on a CPU the same cores run gloo and the GEMMs (a judgement about the host, not a fit).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.catalog.registry import Catalog
from gpufleet.errors import InputError
from gpufleet.parallel.layout import Layout
from gpufleet.perf.step import StepEstimate, StepOptions
from gpufleet.planner.intervals import Interval, IntervalTable, step_interval
from gpufleet.planner.plan import PlanRequest, make_plan
from gpufleet.planner.search import SearchSpace
from gpufleet.workload.job import Job

#: the catalog stack whose `loss_bytes_per_logit` is PyTorch's own cross_entropy on upcast logits
PYTORCH_LOSS_STACK = "torchtitan"


def pytorch_loss_bytes_per_logit(catalog: Catalog) -> float:
    """HBM bytes per logit of PyTorch's cross_entropy, as the catalog's torchtitan stack states it (with its
    source)."""
    value = catalog.stack(PYTORCH_LOSS_STACK).value("loss_bytes_per_logit")
    if value is None:
        raise InputError(f"the catalog's {PYTORCH_LOSS_STACK} stack states no loss_bytes_per_logit; a plain PyTorch "
                         "job is priced with it")
    return float(value)


@dataclass(frozen=True)
class FixedLayoutStep:
    """The planner's step for one given layout, with its 80 % interval (planner/intervals.py)."""

    step: StepEstimate
    interval: Interval


def eager_fsdp_plan(catalog: Catalog, model: str, gpu: str, node: str, ranks: int, seq_len: int,
                    micro_batch: int, overlap: bool) -> FixedLayoutStep:
    """`eager_fsdp_step` with the interval `plan` gives the same step (the regime of that layout)."""
    step = eager_fsdp_step(catalog, model, gpu, node, ranks, seq_len, micro_batch, overlap)
    job = Job(model=catalog.model(model), tokens=1e9, seq_len=seq_len, global_batch=micro_batch * ranks)
    layout = Layout(dp=ranks, sharding="fsdp", micro_batch=micro_batch)
    table = IntervalTable.from_record(catalog.interval_table())
    return FixedLayoutStep(step, step_interval(job, layout, ranks, step.step_s, table))


def eager_fsdp_step(catalog: Catalog, model: str, gpu: str, node: str, ranks: int, seq_len: int,
                    micro_batch: int, overlap: bool) -> StepEstimate:
    """The step of `model` trained as a plain PyTorch FSDP2 job on `ranks` GPUs of `node`, `micro_batch`
    sequences of `seq_len` per rank and step (module docstring)."""
    options = StepOptions(dp_overlap=overlap, fused_elementwise=False,
                          loss_bytes_per_logit=pytorch_loss_bytes_per_logit(catalog))
    space = SearchSpace(micro_batches=(micro_batch,), shardings=("fsdp",), recomputes=("none",), vpps=(1,),
                        cps=(1,), max_tp=1, partial_recompute=False, activation_offload=False,
                        expert_parallel=False)
    request = PlanRequest(model=model, tokens=1e9, gpu=gpu, gpus=ranks, node=node, seq_len=seq_len,
                          global_batch=micro_batch * ranks, options=options, search_space=space, top=1)
    result = make_plan(request, catalog)
    steps = [c.step for c in result.search.feasible
             if (c.layout.tp, c.layout.pp, c.layout.dp, c.layout.ep) == (1, 1, ranks, 1)]
    if not steps:
        raise InputError(f"{model} does not fit {ranks} x {gpu} as a plain FSDP job (the memory the catalog records "
                         "for it is too small)")
    return steps[0]
