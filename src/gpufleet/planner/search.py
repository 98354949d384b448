"""Layout search: enumerate legal layouts, drop those that do not fit (counting why), estimate the rest."""

from __future__ import annotations

import math
from bisect import insort
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.records import NodeSpec
from gpufleet.errors import LayoutError
from gpufleet.fabric.topology import Cluster
from gpufleet.parallel.layout import (
    RECOMPUTES,
    Layout,
    Recompute,
    Sharding,
    layers_per_chunk,
    max_virtual_stages,
    validate_layout,
)
from gpufleet.parallel.memory import MemoryBreakdown, peak_stage_memory
from gpufleet.perf.step import StepEstimate, StepOptions, estimate_step
from gpufleet.workload.job import Job


@dataclass(frozen=True)
class SearchSpace:
    """Which values of each free degree the search tries (judgement: the values frameworks use)."""

    micro_batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    shardings: tuple[Sharding, ...] = ("none", "zero1", "zero3")
    recomputes: tuple[Recompute, ...] = RECOMPUTES
    vpps: tuple[int, ...] = (1, 2, 4)
    cps: tuple[int, ...] = (1, 2, 4, 8, 16)
    max_tp: int | None = None  # default: the scale-up domain (TP across nodes is never faster)
    #: MoE models with tp > 1: Megatron-Core's default expert TP (None: etp = tp when ep divides dp·cp) and whole
    #: experts (1, "MoE parallel folding", what Megatron-Bridge's MoE presets use)
    expert_tps: tuple[int | None, ...] = (None, 1)
    #: where a layout fits only with full recompute, also try recomputing just enough of each rank's layers
    #: (Megatron's block recompute, --recompute-num-layers) and, at pp = 1, offloading just enough layers'
    #: activations to CPU memory (--cpu-offloading-num-layers)
    partial_recompute: bool = True
    #: the framework can keep activations in CPU memory (Megatron-Core's --cpu-offloading; not PyTorch FSDP2 stacks)
    activation_offload: bool = True
    #: the framework has sequence parallelism (Megatron since 2022); without it MoE layers cannot use tp > 1
    sequence_parallel: bool = True


@dataclass(frozen=True, slots=True)
class Candidate:
    """A layout that fits, with its memory and step estimate."""

    layout: Layout
    peak_stage: int
    memory: MemoryBreakdown
    step: StepEstimate


@dataclass(frozen=True, slots=True)
class Infeasible:
    """Why a layout was refused: "memory" (with the bytes over HBM), "host memory" or "invalid: <constraint>"."""

    reason: str
    over_bytes: float = 0.0


@dataclass
class SearchResult:
    """Ranked feasible layouts plus the counts of what was tried and why the rest failed."""

    feasible: list[Candidate]
    tried: int
    infeasible: Counter[str] = field(default_factory=Counter)
    closest_misses: list[tuple[Layout, float]] = field(default_factory=list)  # (layout, bytes over HBM)

    @property
    def best(self) -> Candidate | None:
        return self.feasible[0] if self.feasible else None


def divisors(n: int) -> list[int]:
    """The divisors of n in increasing order (trial division up to √n)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _expert_tps(space: SearchSpace, fixed: dict[str, Any], moe: bool, tp: int, ep: int,
                dp_cp: int) -> list[int | None]:
    """Expert tensor-parallel degrees worth trying: only MoE layouts with tp > 1 have a choice, and whole experts
    (1) is tried only where the default would split them (ep divides dp·cp). A pinned degree that cannot divide
    the ranks yields nothing (validate_layout names the constraint when a layout is given whole)."""
    if not moe:
        return [None]
    pinned = fixed.get("expert_tp")
    if pinned is not None:
        return [pinned] if tp % pinned == 0 and (dp_cp * tp) % (ep * pinned) == 0 else []
    if tp == 1 or dp_cp % ep:
        return [None]
    return list(dict.fromkeys(e for e in space.expert_tps if e is None or (tp % e == 0 and e != tp)))


def enumerate_layouts(job: Job, cluster: Cluster, space: SearchSpace | None = None,
                      fixed: dict[str, Any] | None = None) -> Iterator[Layout]:
    """Every combination of degrees the space allows; `fixed` pins fields (e.g. from a published run)."""
    space = space or SearchSpace()
    fixed = fixed or {}
    model = job.model
    n = cluster.gpus
    max_tp = space.max_tp or cluster.gpus_per_node

    def options(name: str, values: list[Any] | tuple[Any, ...]) -> list[Any]:
        return [fixed[name]] if fixed.get(name) is not None else list(values)

    tps = options("tp", [t for t in divisors(n) if t <= max_tp and model.heads % t == 0])
    for tp in tps:
        for cp in options("cp", [c for c in space.cps if job.seq_len % (2 * c) == 0 or c == 1]):
            for pp in options("pp", [p for p in divisors(n // tp) if p <= model.layers]):
                if n % (tp * cp * pp):
                    continue
                dp = n // (tp * cp * pp)
                if fixed.get("dp") is not None and fixed["dp"] != dp:
                    continue
                if job.global_batch % dp:
                    continue
                per_replica = job.global_batch // dp
                eps = [1]
                if model.moe is not None:
                    eps = [e for e in divisors(model.moe.experts) if (dp * cp * tp) % e == 0]
                experts = [(ep, etp) for ep in options("ep", eps)
                           for etp in _expert_tps(space, fixed, model.moe is not None, tp, ep, dp * cp)]
                for ep, expert_tp in experts:
                    vpps = [v for v in space.vpps if v == 1 or (pp > 1 and pp * v <= max_virtual_stages(model))]
                    for vpp in options("vpp", vpps):
                        mbs = [b for b in space.micro_batches if per_replica % b == 0
                               and (vpp == 1 or (per_replica // b) % pp == 0)]
                        for mb in options("micro_batch", mbs):
                            for sharding in options("sharding", space.shardings):
                                for recompute in options("recompute", space.recomputes):
                                    # Megatron-Core requires sequence parallelism for MoE with tp > 1
                                    sps = [False] if tp == 1 else [True] if model.moe is not None else [True, False]
                                    if not space.sequence_parallel:
                                        sps = [sp for sp in sps if not sp]
                                    for sp in options("sequence_parallel", sps):
                                        yield Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp,
                                                     sequence_parallel=sp, sharding=sharding,
                                                     micro_batch=mb, recompute=recompute, expert_tp=expert_tp)


#: Share of a node's RAM that offloaded activations and optimizer state may pin (judgement: the OS, the data
#: loader's workers and the page cache need the rest).
HOST_RAM_USABLE_FRACTION = 0.8


def host_memory_bytes(node: NodeSpec) -> float:
    """CPU memory one node can give its GPUs' offloaded tensors."""
    return node.cpu_ram_gib * 2**30 * HOST_RAM_USABLE_FRACTION


def host_memory_fits(host_bytes_per_gpu: float, node: NodeSpec, gpus_per_node: int) -> bool:
    """Whether a node's GPUs' pinned host memory (offloaded activations, ZeRO-Offload state) fits in its RAM."""
    return host_bytes_per_gpu * gpus_per_node <= host_memory_bytes(node)


def evaluate(job: Job, layout: Layout, cluster: Cluster, calibration: CalibrationProfile,
             options: StepOptions | None = None) -> Candidate | Infeasible:
    """A Candidate, or why not (with the bytes over HBM) when the layout is invalid or does not fit."""
    try:
        validate_layout(layout, job.model, cluster.gpus, job.global_batch, job.seq_len)
    except LayoutError as error:
        return Infeasible(f"invalid: {error.constraint}")
    assumptions = (options or StepOptions()).memory
    stage, memory = peak_stage_memory(job.model, layout, seq_len=job.seq_len, global_batch=job.global_batch,
                                      precision=job.precision, assumptions=assumptions)
    if memory.total_bytes > cluster.gpu.hbm_bytes:
        return Infeasible("memory", memory.total_bytes - cluster.gpu.hbm_bytes)
    if not host_memory_fits(memory.host_bytes, cluster.node, cluster.gpus_per_node):
        return Infeasible("host memory")
    return Candidate(layout, stage, memory, estimate_step(job, layout, cluster, calibration, options))


def _fewest_layers(job: Job, cluster: Cluster, calibration: CalibrationProfile, options: StepOptions,
                   variant: Callable[[int], Layout],
                   most: int) -> Candidate | Infeasible | None:
    """`variant(k)` for the smallest k in 1..most that fits. Memory falls as k grows (block recompute keeps only
    the inputs of k more layers, offload moves k more layers to the host), so bisect on the memory model alone and
    estimate the step once. None when even `most` does not fit HBM; Infeasible when the smallest k that
    does is refused for another reason (its offloaded tensors do not fit in the node's RAM)."""
    cap = cluster.gpu.hbm_bytes

    def fits(count: int) -> bool:
        layout = variant(count)
        try:
            validate_layout(layout, job.model, cluster.gpus, job.global_batch, job.seq_len)
        except LayoutError:
            return False
        _, memory = peak_stage_memory(job.model, layout, seq_len=job.seq_len, global_batch=job.global_batch,
                                      precision=job.precision, assumptions=options.memory)
        return memory.total_bytes <= cap

    if most < 1 or not fits(most):
        return None
    low, high = 1, most  # high fits
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return evaluate(job, variant(high), cluster, calibration, options)


def _cheaper_variants(job: Job, full: Candidate, cluster: Cluster, calibration: CalibrationProfile,
                      options: StepOptions, offload: bool = True) -> list[Candidate | Infeasible]:
    """Cheaper ways than recomputing every layer for a layout that fits only that way: block recompute of the
    fewest layers per pipeline chunk (Megatron's --recompute-num-layers) and, with pp = 1 on a GPU whose host link
    is known, CPU offloading of the fewest layers' activations (--cpu-offloading-num-layers)."""
    found: list[Candidate | Infeasible] = []
    chunk = layers_per_chunk(job.model.layers, full.layout)
    block = _fewest_layers(job, cluster, calibration, options,
                           lambda k: full.layout.with_(recompute_layers=k), chunk - 1)
    if block is not None:
        found.append(block)
    if offload and full.layout.pp == 1 and cluster.gpu.host_link_gbytes_per_s is not None:
        plain = _without_recompute(full.layout)
        offloaded = _fewest_layers(job, cluster, calibration, options,
                                   lambda k: plain.with_(offload_activation_layers=k), job.model.layers - 1)
        if offloaded is not None:
            found.append(offloaded)
    return found


def _without_recompute(layout: Layout) -> Layout:
    return layout.with_(recompute="none", recompute_layers=None)


#: Block-recompute and offload variants are only built where they could rank among this many of the fastest plans.
CHEAPER_VARIANT_RANKS = 10


def _add_cheaper_variants(job: Job, feasible: list[Candidate], full_only: list[Candidate], cluster: Cluster,
                          calibration: CalibrationProfile, options: StepOptions, reasons: Counter[str],
                          offload: bool = True) -> int:
    """Append the block-recompute and offload variants of the `full_only` candidates (they fit only with every layer
    recomputed) that could rank among the fastest plans; return how many were tried (a refused one is counted in
    `reasons`). The floor on any variant's
    step is its layout's step without recompute (a variant adds recompute or host copies to it), and a floor on
    that is its compute without the recomputed forward (a step is never shorter than its average stage's compute),
    which orders the candidates and stops the pass without estimating most of them."""
    compute_parts = ("compute.gemm", "compute.attention", "compute.elementwise", "compute.logits+loss")
    order = sorted((sum(full.step.parts[name].exposed_s for name in compute_parts), index)
                   for index, full in enumerate(full_only))
    ranked = sorted(c.step.step_s for c in feasible)
    added = 0
    for compute_floor_s, index in order:
        threshold = ranked[CHEAPER_VARIANT_RANKS - 1] if len(ranked) >= CHEAPER_VARIANT_RANKS else math.inf
        if compute_floor_s >= threshold:
            break
        full = full_only[index]
        if estimate_step(job, _without_recompute(full.layout), cluster, calibration, options).step_s >= threshold:
            continue
        for variant in _cheaper_variants(job, full, cluster, calibration, options, offload):
            added += 1
            if isinstance(variant, Candidate):
                feasible.append(variant)
                insort(ranked, variant.step.step_s)
            else:
                reasons[variant.reason] += 1
    return added


def search(job: Job, cluster: Cluster, calibration: CalibrationProfile, *, space: SearchSpace | None = None,
           fixed: dict[str, Any] | None = None, options: StepOptions | None = None,
           progress: Callable[[int], None] | None = None) -> SearchResult:
    """Evaluate every enumerated layout; rank the feasible ones by step time (fastest first)."""
    options = options or StepOptions()
    space = space or SearchSpace()
    useful = tuple(r for r in space.recomputes if r != "selective")
    if (calibration.attention_kernel != "materialized" and options.memory.flash_attention and useful
            and options.memory.selective_policy == "attention"):
        # Megatron's selective recompute re-runs the attention core to drop its score matrix; a fused kernel never
        # stores one, so the same memory costs more time: never a better plan. (torchtitan's op-level policy does
        # drop memory, so it stays.)
        space = replace(space, recomputes=useful)
    try_cheaper = space.partial_recompute and (fixed or {}).get("recompute") is None
    feasible: list[Candidate] = []
    reasons: Counter[str] = Counter()
    misses: list[tuple[Layout, float]] = []
    unfit_without_recompute: set[Layout] = set()  # no-recompute layouts that did not fit
    full_only: list[Candidate] = []  # full-recompute candidates whose no-recompute twin did not fit
    tried = 0
    for layout in enumerate_layouts(job, cluster, space, fixed):
        tried += 1
        outcome = evaluate(job, layout, cluster, calibration, options)
        if isinstance(outcome, Candidate):
            feasible.append(outcome)
            if try_cheaper and layout.recompute == "full" and _without_recompute(layout) in unfit_without_recompute:
                full_only.append(outcome)
        else:
            reasons[outcome.reason] += 1
            if outcome.reason == "memory":
                misses.append((layout, outcome.over_bytes))
                if try_cheaper and layout.recompute == "none":
                    unfit_without_recompute.add(layout)
        if progress is not None and tried % 256 == 0:
            progress(tried)
    tried += _add_cheaper_variants(job, feasible, full_only, cluster, calibration, options, reasons,
                                   space.activation_offload)
    feasible.sort(key=lambda c: c.step.step_s)
    misses.sort(key=lambda item: item[1])
    return SearchResult(feasible, tried, reasons, misses[:5])
