"""Layout search: enumerate legal layouts, drop those that do not fit (counting why), estimate the rest."""

from __future__ import annotations

import gc
import heapq
import math
from bisect import insort
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from operator import attrgetter
from typing import Any, NamedTuple

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.records import NodeSpec
from gpufleet.errors import InputError, LayoutError
from gpufleet.fabric.topology import Cluster
from gpufleet.parallel.layout import (
    RECOMPUTES,
    SHARDINGS,
    Layout,
    Recompute,
    Sharding,
    layers_per_chunk,
    max_virtual_stages,
    validate_layout,
)
from gpufleet.parallel.memory import JobMemory, MemoryBreakdown, MemoryParts, degrees_key, memory_parts_total
from gpufleet.perf.step import StepEstimate, StepOptions, estimate_step
from gpufleet.planner.floors import ComputeFloor, StepFloor, rules_out
from gpufleet.planner.pins import pinned_choices
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
    #: the framework spreads a MoE model's experts over ranks (expert parallelism) from its own configuration
    expert_parallel: bool = True
    #: the sharding kinds the framework combines with pipeline parallelism (None: every kind in `shardings`)
    pp_shardings: tuple[Sharding, ...] | None = None

    def __post_init__(self) -> None:
        """Degrees the search can try: each list non-empty, each degree a whole number of at least 1."""
        for name in ("micro_batches", "vpps", "cps", "shardings", "recomputes", "expert_tps"):
            if not getattr(self, name):
                raise InputError(f"search_space.{name} must list at least one value")
        given = [("micro_batches", v) for v in self.micro_batches] + [("vpps", v) for v in self.vpps] + [
            ("cps", v) for v in self.cps] + [("expert_tps", v) for v in self.expert_tps if v is not None] + (
            [("max_tp", self.max_tp)] if self.max_tp is not None else [])
        for name, value in given:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"search_space.{name} must be whole numbers of at least 1, got {value!r}")


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


class ClosestMiss(NamedTuple):
    """A layout that did not fit HBM, and by how many bytes (named fields; unpacks as (layout, over_bytes))."""

    layout: Layout
    over_bytes: float


@dataclass
class SearchResult:
    """Ranked feasible layouts (all, or the fastest `keep` of them) plus the counts of what was tried, how many fit
    and why the rest failed."""

    feasible: list[Candidate]
    tried: int
    infeasible: Counter[str] = field(default_factory=Counter)
    closest_misses: list[ClosestMiss] = field(default_factory=list)  # the five nearest to fitting, nearest first
    #: how many layouts fit, where `feasible` holds only the fastest of them (search's `keep`)
    fit_count: int | None = None

    @property
    def fit(self) -> int:
        """How many layouts fit: all of them, also those `feasible` leaves out."""
        return len(self.feasible) if self.fit_count is None else self.fit_count

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
        return [e for e in pinned_choices(pinned, space.expert_tps) if e is not None
                and tp % e == 0 and (dp_cp * tp) % (ep * e) == 0]
    if tp == 1 or dp_cp % ep:
        return [None]
    return list(dict.fromkeys(e for e in space.expert_tps if e is None or (tp % e == 0 and e != tp)))


#: Layout's fields in order; enumerate_layouts sets the first ten and expert_tp, the rest keep their defaults.
_LAYOUT_FIELDS = tuple(f.name for f in fields(Layout))
_ENUMERATED = ("tp", "pp", "dp", "cp", "ep", "vpp", "sequence_parallel", "sharding", "micro_batch", "recompute")
_DEFAULTS_MIDDLE = tuple(getattr(Layout(), name) for name in _LAYOUT_FIELDS[len(_ENUMERATED):-3])
_DEFAULTS_END = tuple(getattr(Layout(), name) for name in _LAYOUT_FIELDS[-2:])
#: Each field's slot setter. A frozen dataclass's __init__ sets every field through object.__setattr__ (~4 µs for a
#: Layout; a large MoE search builds ~100k): setting the slots directly builds the same object (equal, same hash)
#: in a third of the time. Only while Layout has no __post_init__ and its fields are in the order assumed here.
_SLOT_SETTERS = tuple(getattr(Layout, name).__set__ for name in _LAYOUT_FIELDS)
_FAST_LAYOUTS = (not hasattr(Layout, "__post_init__") and _LAYOUT_FIELDS[:len(_ENUMERATED)] == _ENUMERATED
                 and _LAYOUT_FIELDS[-3] == "expert_tp")


def _new_layout(values: tuple[Any, ...]) -> Layout:
    """Layout(*values), every field given in _LAYOUT_FIELDS' order."""
    if not _FAST_LAYOUTS:
        return Layout(*values)
    layout = object.__new__(Layout)
    for setter, value in zip(_SLOT_SETTERS, values, strict=True):
        setter(layout, value)
    return layout


def enumerate_layouts(job: Job, cluster: Cluster, space: SearchSpace | None = None,
                      fixed: dict[str, Any] | None = None) -> Iterator[Layout]:
    """Every combination of degrees the space allows; `fixed` pins fields (e.g. from a published run)."""
    space = space or SearchSpace()
    fixed = fixed or {}
    model = job.model
    n = cluster.gpus
    max_tp = space.max_tp or cluster.gpus_per_node

    def options(name: str, values: list[Any] | tuple[Any, ...]) -> list[Any]:
        return pinned_choices(fixed.get(name), values)

    tps = options("tp", [t for t in divisors(n) if t <= max_tp and model.heads % t == 0])
    shardings = options("sharding", space.shardings)
    recomputes = options("recompute", space.recomputes)
    for tp in tps:
        # Megatron-Core requires sequence parallelism for MoE with tp > 1
        sps = [False] if tp == 1 else [True] if model.moe is not None else [True, False]
        if not space.sequence_parallel:
            sps = [sp for sp in sps if not sp]
        sps = options("sequence_parallel", sps)
        for cp in options("cp", [c for c in space.cps if job.seq_len % (2 * c) == 0 or c == 1]):
            for pp in options("pp", [p for p in divisors(n // tp) if p <= model.layers]):
                if n % (tp * cp * pp):
                    continue
                dp = n // (tp * cp * pp)
                if dp not in pinned_choices(fixed.get("dp"), [dp]):
                    continue
                if job.global_batch % dp:
                    continue
                per_replica = job.global_batch // dp
                eps = [1]
                if model.moe is not None and space.expert_parallel:
                    eps = [e for e in divisors(model.moe.experts) if (dp * cp * tp) % e == 0]
                experts = [(ep, etp) for ep in options("ep", eps)
                           for etp in _expert_tps(space, fixed, model.moe is not None, tp, ep, dp * cp)]
                vpps = options("vpp", [v for v in space.vpps
                                       if v == 1 or (pp > 1 and pp * v <= max_virtual_stages(model))])
                mbs = {vpp: options("micro_batch", [b for b in space.micro_batches if per_replica % b == 0
                                                    and (vpp == 1 or (per_replica // b) % pp == 0)])
                       for vpp in vpps}
                for ep, expert_tp in experts:
                    for vpp in vpps:
                        for mb in mbs[vpp]:
                            for sharding in shardings:
                                if pp > 1 and space.pp_shardings is not None and sharding not in space.pp_shardings:
                                    continue
                                for recompute in recomputes:
                                    for sp in sps:
                                        yield _new_layout((tp, pp, dp, cp, ep, vpp, sp, sharding, mb, recompute,
                                                           *_DEFAULTS_MIDDLE, expert_tp, *_DEFAULTS_END))


def host_memory_bytes(node: NodeSpec, usable_fraction: float) -> float:
    """CPU memory one node can give its GPUs' offloaded tensors: the `usable_fraction` of its RAM that they may
    pin (the catalog's judgement `host-ram-usable-fraction`: the OS, the data loader's workers and the page cache
    need the rest)."""
    return node.cpu_ram_gib * 2**30 * usable_fraction


def host_memory_fits(host_bytes_per_gpu: float, node: NodeSpec, gpus_per_node: int, usable_fraction: float) -> bool:
    """Whether a node's GPUs' pinned host memory (offloaded activations, ZeRO-Offload state) fits in the
    `usable_fraction` of its RAM."""
    return host_bytes_per_gpu * gpus_per_node <= host_memory_bytes(node, usable_fraction)


class _Fit(NamedTuple):
    """A layout that fits, its step not estimated yet (a tuple: a search holds tens of thousands)."""

    layout: Layout
    peak_stage: int
    parts: MemoryParts  # its peak stage's MemoryBreakdown fields

    def candidate(self, step: StepEstimate) -> Candidate:
        return Candidate(self.layout, self.peak_stage, MemoryBreakdown(*self.parts), step)


@dataclass(frozen=True, slots=True)
class _Capacity:
    """What a GPU's layout must fit in: its HBM, and its node's RAM (host_memory_fits) shared by the node's GPUs."""

    hbm_bytes: float
    host_bytes: float
    gpus_per_node: int

    @classmethod
    def of(cls, cluster: Cluster, host_usable_fraction: float) -> _Capacity:
        return cls(cluster.gpu.hbm_bytes, host_memory_bytes(cluster.node, host_usable_fraction),
                   cluster.gpus_per_node)


#: Shardings and recompute modes that validate_layout accepts without looking at any other field (hsdp also needs
#: its group to divide dp).
_PLAIN_CHOICES = (frozenset(SHARDINGS) - {"hsdp"}, frozenset(RECOMPUTES))


def _validation_error(job: Job, layout: Layout, cluster: Cluster) -> str | None:
    """The constraint validate_layout names for the layout, None when it is valid."""
    try:
        validate_layout(layout, job.model, cluster.gpus, job.global_batch, job.seq_len)
    except LayoutError as error:
        return error.constraint
    return None


def _invalid_constraint(job: Job, layout: Layout, cluster: Cluster,
                        known: dict[tuple[object, ...], str | None] | None = None) -> str | None:
    """The constraint validate_layout names for the layout, None when it is valid. With `known` (one job and
    cluster's answers by degrees_key), a layout whose sharding and recompute mode need no other field
    (_PLAIN_CHOICES) and that has no block recompute or activation offload shares the answer of every layout with
    its degrees: validate_layout's other checks read only those."""
    if (known is None or layout.sharding not in _PLAIN_CHOICES[0] or layout.recompute not in _PLAIN_CHOICES[1]
            or layout.recompute_layers is not None or layout.offload_activation_layers is not None):
        return _validation_error(job, layout, cluster)
    key = degrees_key(layout)
    if key not in known:
        known[key] = _validation_error(job, layout, cluster)
    return known[key]


def _memory_verdict(job: Job, layout: Layout, cluster: Cluster, memory: JobMemory, capacity: _Capacity,
                    known: dict[tuple[object, ...], str | None] | None = None) -> _Fit | Infeasible:
    """_Fit, or why not (with the bytes over HBM) when the layout is invalid or does not fit (`known`: see
    _invalid_constraint)."""
    constraint = _invalid_constraint(job, layout, cluster, known)
    if constraint is not None:
        return Infeasible(f"invalid: {constraint}")
    stage, parts = memory.peak_parts(layout)
    return _capacity_verdict(layout, stage, parts, capacity)


def _capacity_verdict(layout: Layout, stage: int, parts: MemoryParts, capacity: _Capacity) -> _Fit | Infeasible:
    """_Fit when the peak stage's `parts` fit the GPU's HBM and its node's RAM, else why not."""
    total = memory_parts_total(parts)
    if total > capacity.hbm_bytes:
        return Infeasible("memory", total - capacity.hbm_bytes)
    if parts[6] * capacity.gpus_per_node > capacity.host_bytes:  # host_memory_fits of the host bytes
        return Infeasible("host memory")
    return _Fit(layout, stage, parts)


def _estimated(fit: _Fit | Infeasible, step: Callable[[Layout], StepEstimate]) -> Candidate | Infeasible:
    if isinstance(fit, _Fit):
        return fit.candidate(step(fit.layout))
    return fit


def _job_memory(job: Job, options: StepOptions) -> JobMemory:
    return JobMemory(job.model, seq_len=job.seq_len, global_batch=job.global_batch, precision=job.precision,
                     assumptions=options.memory)


def evaluate(job: Job, layout: Layout, cluster: Cluster, calibration: CalibrationProfile,
             options: StepOptions | None = None) -> Candidate | Infeasible:
    """A Candidate, or why not (with the bytes over HBM) when the layout is invalid or does not fit."""
    options = options or StepOptions()
    step_options = options
    capacity = _Capacity.of(cluster, options.judged.host_ram_usable_fraction)
    return _estimated(_memory_verdict(job, layout, cluster, _job_memory(job, options), capacity),
                      lambda fitting: estimate_step(job, fitting, cluster, calibration, step_options))


class _Estimator:
    """What one search knows about its job: the memory model, the step model and its two floors (planner.floors)."""

    def __init__(self, job: Job, cluster: Cluster, calibration: CalibrationProfile, options: StepOptions) -> None:
        self.job = job
        self.cluster = cluster
        self.calibration = calibration
        self.options = options
        self.memory = _job_memory(job, options)
        self.capacity = _Capacity.of(cluster, options.judged.host_ram_usable_fraction)
        self.floor = StepFloor(job, cluster, calibration, options)
        self.compute_floor = ComputeFloor(job, cluster, calibration, options)
        self.validity: dict[tuple[object, ...], str | None] = {}  # _invalid_constraint's answers by degrees_key

    def step(self, layout: Layout) -> StepEstimate:
        return estimate_step(self.job, layout, self.cluster, self.calibration, self.options)

    def evaluate(self, layout: Layout) -> Candidate | Infeasible:
        return _estimated(_memory_verdict(self.job, layout, self.cluster, self.memory, self.capacity, self.validity),
                          self.step)


def _fewest_layers(estimator: _Estimator, variant: Callable[[int], Layout],
                   most: int) -> Candidate | Infeasible | None:
    """`variant(k)` for the smallest k in 1..most that fits. Memory falls as k grows (block recompute keeps only
    the inputs of k more layers, offload moves k more layers to the host), so bisect on the memory model alone and
    estimate the step once. None when even `most` does not fit HBM; Infeasible when the smallest k that
    does is refused for another reason (its offloaded tensors do not fit in the node's RAM)."""
    job, cluster = estimator.job, estimator.cluster

    def fits(count: int) -> bool:
        layout = variant(count)
        try:
            validate_layout(layout, job.model, cluster.gpus, job.global_batch, job.seq_len)
        except LayoutError:
            return False
        return memory_parts_total(estimator.memory.peak_parts(layout)[1]) <= estimator.capacity.hbm_bytes

    if most < 1 or not fits(most):
        return None
    low, high = 1, most  # high fits
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return estimator.evaluate(variant(high))


def _cheaper_variants(estimator: _Estimator, full: Layout, offload: bool = True) -> list[Candidate | Infeasible]:
    """Cheaper ways than recomputing every layer for a layout that fits only that way: block recompute of the
    fewest layers per pipeline chunk (Megatron's --recompute-num-layers) and, with pp = 1 on a GPU whose host link
    is known, CPU offloading of the fewest layers' activations (--cpu-offloading-num-layers)."""
    found: list[Candidate | Infeasible] = []
    job = estimator.job
    chunk = layers_per_chunk(job.model.layers, full)
    block = _fewest_layers(estimator, lambda k: full.with_(recompute_layers=k), chunk - 1)
    if block is not None:
        found.append(block)
    if offload and full.pp == 1 and estimator.cluster.gpu.host_link_gbytes_per_s is not None:
        plain = _without_recompute(full)
        offloaded = _fewest_layers(estimator, lambda k: plain.with_(offload_activation_layers=k), job.model.layers - 1)
        if offloaded is not None:
            found.append(offloaded)
    return found


#: A layout's field values in _LAYOUT_FIELDS' order (a tuple built in C), and where recompute's two fields sit.
_field_values = attrgetter(*_LAYOUT_FIELDS)
_RECOMPUTE_AT, _RECOMPUTE_LAYERS_AT = _LAYOUT_FIELDS.index("recompute"), _LAYOUT_FIELDS.index("recompute_layers")


def _without_recompute(layout: Layout) -> Layout:
    """layout.with_(recompute="none", recompute_layers=None), built as _new_layout builds layouts."""
    values = list(_field_values(layout))
    values[_RECOMPUTE_AT], values[_RECOMPUTE_LAYERS_AT] = "none", None
    return _new_layout(tuple(values))


#: Every field of a layout but its recompute choice: equal for a layout and its `_without_recompute` twin (a tuple
#: built in C, where `_without_recompute` builds a whole Layout).
_twin_key = attrgetter(*(f.name for f in fields(Layout) if f.name not in ("recompute", "recompute_layers")))


#: Block-recompute and offload variants are only built where they could rank among this many of the fastest plans.
CHEAPER_VARIANT_RANKS = 10


def _add_cheaper_variants(estimator: _Estimator, ranked: _Ranking, full_only: list[Layout],
                          reasons: Counter[str], offload: bool = True) -> int:
    """Add to `ranked` the block-recompute and offload variants of the `full_only` layouts (they fit only with every
    layer recomputed) that could rank among the fastest plans; return how many were tried (a refused one is counted
    in `reasons`). The floor on any variant's step is its layout's step without recompute (a variant adds recompute
    or host copies to it), and a floor on that is its compute without the recomputed forward (a step is never
    shorter than its average stage's compute), which orders the candidates and stops the pass without estimating
    most of them; the step floor (planner.floors) of the layout without recompute skips most of the rest."""
    order = sorted((estimator.compute_floor(layout), index) for index, layout in enumerate(full_only))
    added = 0
    for compute_floor_s, index in order:
        threshold = ranked.nth_fastest_s(CHEAPER_VARIANT_RANKS)
        if compute_floor_s >= threshold:
            break
        plain = _without_recompute(full_only[index])
        if rules_out(estimator.floor(plain), threshold) or estimator.step(plain).step_s >= threshold:
            continue
        for variant in _cheaper_variants(estimator, full_only[index], offload):
            added += 1
            if isinstance(variant, Candidate):
                ranked.add(variant)
            else:
                reasons[variant.reason] += 1
    return added


class _Ranking:
    """The fitting layouts whose step is estimated, and the steps' order (fastest first; equal steps in the order
    the layouts were found, as a stable sort of every estimate would put them)."""

    def __init__(self) -> None:
        self._found: list[tuple[float, int, Candidate]] = []
        self._steps: list[float] = []  # sorted
        self.fit = 0  # every fitting layout, estimated or not

    def add(self, candidate: Candidate, position: int | None = None) -> None:
        """An estimated candidate; `position` (its place among the fitting layouts found) defaults to last."""
        self._found.append((candidate.step.step_s, self.fit if position is None else position, candidate))
        insort(self._steps, candidate.step.step_s)
        if position is None:
            self.fit += 1

    def nth_fastest_s(self, n: int) -> float:
        """The n-th fastest step estimated so far; infinite while fewer than n are."""
        return self._steps[n - 1] if len(self._steps) >= n else math.inf

    def ranked(self, keep: int | None) -> list[Candidate]:
        self._found.sort(key=lambda item: (item[0], item[1]))
        return [candidate for _, _, candidate in self._found[:keep]]


@dataclass
class _Screened:
    """Every enumerated layout's memory verdict: those that fit (step not yet estimated), the counts of the rest."""

    fits: list[_Fit] = field(default_factory=list)
    tried: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    #: the CLOSEST_MISSES nearest misses so far as (-over bytes, -order found, layout): a max-heap whose top is the
    #: farthest of them (of equal bytes, the latest found), what a nearer miss replaces
    nearest: list[tuple[float, int, Layout]] = field(default_factory=list)
    full_only: list[Layout] = field(default_factory=list)  # fit only with full recompute


#: SearchResult.closest_misses holds this many of the misses nearest to fitting.
CLOSEST_MISSES = 5


def _note_miss(nearest: list[tuple[float, int, Layout]], layout: Layout, over_bytes: float, order: int) -> None:
    """Keep `layout` among the CLOSEST_MISSES nearest misses (_Screened.nearest) when it is nearer than the farthest
    of them; `order` (increasing) breaks ties as a stable sort of every miss by its bytes would."""
    if len(nearest) < CLOSEST_MISSES:
        heapq.heappush(nearest, (-over_bytes, -order, layout))
    elif (-over_bytes, -order) > nearest[0][:2]:
        heapq.heapreplace(nearest, (-over_bytes, -order, layout))


def _closest_misses(nearest: list[tuple[float, int, Layout]]) -> list[ClosestMiss]:
    """_Screened.nearest, nearest first."""
    return [ClosestMiss(layout, -negative_bytes) for negative_bytes, _, layout in sorted(nearest, reverse=True)]


def _file(screened: _Screened, layout: Layout, stage: int, parts: MemoryParts, capacity: _Capacity,
          unfit_without_recompute: set[tuple[object, ...]] | None) -> None:
    """Record a valid layout's memory verdict (_capacity_verdict's, without building an Infeasible per miss) in
    `screened`; with `unfit_without_recompute` (cheaper variants wanted), also note the layouts that fit only with
    full recompute."""
    total = memory_parts_total(parts)
    if total > capacity.hbm_bytes:
        screened.reasons["memory"] += 1
        nearest = screened.nearest
        over_bytes = total - capacity.hbm_bytes
        if len(nearest) < CLOSEST_MISSES or over_bytes < -nearest[0][0]:  # else _note_miss would not keep it
            _note_miss(nearest, layout, over_bytes, screened.tried)
        if unfit_without_recompute is not None and layout.recompute == "none":
            unfit_without_recompute.add(_twin_key(layout))
    elif parts[6] * capacity.gpus_per_node > capacity.host_bytes:  # host_memory_fits of the host bytes
        screened.reasons["host memory"] += 1
    else:
        screened.fits.append(_Fit(layout, stage, parts))
        if (unfit_without_recompute is not None and layout.recompute == "full"
                and _twin_key(layout) in unfit_without_recompute):
            screened.full_only.append(layout)


def _screen(estimator: _Estimator, layouts: Iterator[Layout], try_cheaper: bool,
            progress: Callable[[int], None] | None) -> _Screened:
    """Validate every layout and check its memory (the counts of a search are exact: every layout is checked).

    Consecutive layouts that differ only in sharding and recompute mode (the innermost choices of
    enumerate_layouts) share their validity and their memory model's per-degrees numbers: looked up once for them."""
    screened = _Screened()
    unfit_without_recompute: set[tuple[object, ...]] = set()  # no-recompute layouts that did not fit (_twin_key)
    job, cluster, memory, capacity = estimator.job, estimator.cluster, estimator.memory, estimator.capacity
    last_key: tuple[object, ...] | None = None
    shared = memory.by_degrees(Layout(), degrees_key(Layout()))
    unknown = "?"  # the plain layouts of these degrees are not validated yet
    plain_constraint: str | None = unknown
    peak_parts = memory.peak_parts_by_degrees
    for layout in layouts:
        screened.tried += 1
        key = degrees_key(layout)
        if key != last_key:
            last_key, shared = key, memory.by_degrees(layout, key)
            plain_constraint = estimator.validity.get(key, unknown)
        if (layout.sharding in _PLAIN_CHOICES[0] and layout.recompute in _PLAIN_CHOICES[1]
                and layout.recompute_layers is None and layout.offload_activation_layers is None):
            if plain_constraint is unknown:
                plain_constraint = _invalid_constraint(job, layout, cluster, estimator.validity)
            constraint = plain_constraint
        else:
            constraint = _validation_error(job, layout, cluster)
        if constraint is not None:
            screened.reasons[f"invalid: {constraint}"] += 1
        else:
            stage, parts = peak_parts(shared, layout)
            _file(screened, layout, stage, parts, capacity, unfit_without_recompute if try_cheaper else None)
        if progress is not None and screened.tried % 256 == 0:
            progress(screened.tried)
    return screened


def _rank_fits(estimator: _Estimator, fits: list[_Fit], keep: int | None) -> _Ranking:
    """Estimate the steps of the fitting layouts, all of them (`keep` None) or, fastest floor first, until the floor
    of the next one (planner.floors) rules it out of the `keep` fastest: every layout that ranks among those is
    estimated, so the first `keep` of the ranking are the exhaustive ranking's first `keep`."""
    ranking = _Ranking()
    ranking.fit = len(fits)
    if keep is None:
        for position, fit in enumerate(fits):
            ranking.add(fit.candidate(estimator.step(fit.layout)), position)
        return ranking
    floors = sorted((estimator.floor(fit.layout), position) for position, fit in enumerate(fits))
    for floor_s, position in floors:
        if rules_out(floor_s, ranking.nth_fastest_s(keep)):
            break
        fit = fits[position]
        ranking.add(fit.candidate(estimator.step(fit.layout)), position)
    return ranking


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, back as it was after. A search allocates some hundred
    thousand long-lived objects (layouts, fits, misses) and no reference cycles: every collection the
    allocations trigger would traverse all of them and free nothing (it cost about half of a large MoE search's
    memory screen). Whatever the block frees is still freed at once by reference counting."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        # the block's survivors join the oldest generation untraversed (freeze, then unfreeze, moves every tracked
        # object there and zeroes the youngest's count): re-enabled, the collector would first traverse all of them
        # as young objects (~0.2 s after a large MoE search), to find no cycle; a full collection still sees them.
        # Not where the caller keeps objects frozen itself: unfreeze would release those too.
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        if enabled:
            gc.enable()


def search(job: Job, cluster: Cluster, calibration: CalibrationProfile, *, space: SearchSpace | None = None,
           fixed: dict[str, Any] | None = None, options: StepOptions | None = None,
           progress: Callable[[int], None] | None = None, keep: int | None = None) -> SearchResult:
    """Check every enumerated layout's memory; rank the feasible ones by step time (fastest first).

    `keep`: return only the `keep` fastest feasible layouts, the same ones in the same order as the first `keep` of
    the full ranking, estimating the step of only the layouts that a floor on their step (planner.floors) cannot
    rule out. The counts (tried, fit, infeasible by reason) are those of the full search either way."""
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
    estimator = _Estimator(job, cluster, calibration, options)
    with _collector_paused():
        screened = _screen(estimator, enumerate_layouts(job, cluster, space, fixed), try_cheaper, progress)
        # the cheaper-variant pass needs the exact CHEAPER_VARIANT_RANKS fastest
        ranking = _rank_fits(estimator, screened.fits, None if keep is None else max(keep, CHEAPER_VARIANT_RANKS))
        tried = screened.tried + _add_cheaper_variants(estimator, ranking, screened.full_only, screened.reasons,
                                                       space.activation_offload)
    return SearchResult(ranking.ranked(keep), tried, screened.reasons, _closest_misses(screened.nearest),
                        fit_count=ranking.fit)
