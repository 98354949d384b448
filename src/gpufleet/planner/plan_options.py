"""The workload, cluster and framework of a plan as `plan` and `launch` take them (the flags' values, or a saved
plan file's), checked here, and the PlanRequest they describe for one GPU count. The Python API builds the same
record and meets the same rules, with the same one-line messages, as the command line."""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import ConfigDict, model_validator

from gpufleet.catalog.records import Precision
from gpufleet.catalog.registry import DEFAULT_GPU, Catalog
from gpufleet.errors import InputError
from gpufleet.fabric.topology import TOPOLOGY_KINDS, TopologyKind
from gpufleet.parallel.layout import SELECTIVE_POLICIES
from gpufleet.parallel.memory import TRAINING_PRECISIONS
from gpufleet.planner.model_terms import ModelTerms
from gpufleet.planner.pins import LayoutPins
from gpufleet.planner.plan import PlanRequest, RankBy
from gpufleet.planner.published_runs import framework_options
from gpufleet.planner.search import SearchSpace
from gpufleet.planner.stack import stack_search_space
from gpufleet.request import Request
from gpufleet.units import parse_count, parse_ratio

EP_DISPATCHES = ("all-to-all", "dedup")


class WorkloadOptions(Request):
    """The options as given (strings where the flag takes units: `tokens` 15T, `oversubscription` 4:1); None: not
    given, the stack's or the model's default. `plan_request` turns them into the PlanRequest of one GPU count."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: str = "llama3-8b"
    tokens: str = "1T"
    gpu: str | None = None  # default: the --node's GPU, else DEFAULT_GPU
    node: str | None = None
    fabric: str | None = None
    topology: str = "fat-tree"
    oversubscription: str = "1:1"
    seq: int = 4096
    global_batch: int | None = None
    precision: str = "bf16"
    rank_by: str = "time"
    fabric_model: str = "analytical"
    overlap_tp: bool | None = None
    dtensor_tp: bool | None = None
    overlap_ep: bool | None = None
    ep_dispatch: str | None = None
    selective_policy: str | None = None
    eager: bool = False
    stack: str | None = None
    terms: ModelTerms = ModelTerms()  # --stragglers, --overlap-contention, --fsdp2-copies
    overlap_dp: bool | None = None  # --overlap-dp/--no-overlap-dp
    pins: LayoutPins = LayoutPins()  # --tp, --pp, ... (planner/pins.py)

    @model_validator(mode="after")
    def _allowed(self) -> WorkloadOptions:
        """Refuse an option value that is not one of those allowed, with one line naming the flag."""
        if self.topology not in TOPOLOGY_KINDS:
            raise InputError(f"--topology {self.topology!r} is not one of {', '.join(TOPOLOGY_KINDS)}")
        if self.rank_by not in ("time", "cost"):
            raise InputError(f"--rank-by must be time or cost, got {self.rank_by!r}")
        if self.precision not in TRAINING_PRECISIONS:
            raise InputError(f"--precision must be one of {', '.join(TRAINING_PRECISIONS)}, got {self.precision!r}")
        if self.seq < 1:
            raise InputError(f"--seq must be a positive number of tokens, got {self.seq}")
        if self.global_batch is not None and self.global_batch < 1:
            raise InputError(f"--global-batch must be a positive number of sequences, got {self.global_batch}")
        if self.fabric_model not in ("analytical", "sim"):
            raise InputError(f"--fabric-model must be analytical or sim, got {self.fabric_model!r}")
        if self.ep_dispatch is not None and self.ep_dispatch not in EP_DISPATCHES:
            raise InputError(f"--ep-dispatch must be all-to-all or dedup, got {self.ep_dispatch!r}")
        if self.selective_policy is not None and self.selective_policy not in SELECTIVE_POLICIES:
            raise InputError(f"--selective-policy must be one of {', '.join(SELECTIVE_POLICIES)}, "
                             f"got {self.selective_policy!r}")
        return self

    def gpu_id(self, cat: Catalog) -> str:
        """--gpu if given, else the GPU that --node holds, else DEFAULT_GPU."""
        return self.gpu or (cat.node(self.node).gpu if self.node else DEFAULT_GPU)

    def plan_request(self, cat: Catalog, gpus: int, top: int) -> PlanRequest:
        """The PlanRequest the options describe, for one GPU count."""
        return PlanRequest(model=self.model, tokens=parse_count(self.tokens, "--tokens"), gpu=self.gpu_id(cat),
                           gpus=gpus, node=self.node, network=self.fabric, topology=cast(TopologyKind, self.topology),
                           oversubscription=parse_ratio(self.oversubscription, "--oversubscription"),
                           seq_len=self.seq, global_batch=self.global_batch,
                           precision=cast(Precision, self.precision), top=top, rank_by=cast(RankBy, self.rank_by),
                           fabric_model=cast(Literal["analytical", "sim"], self.fabric_model), pins=self.pins,
                           **framework_fields(cat, self.stack, self.overlap_tp, self.dtensor_tp, self.overlap_ep,
                                              self.ep_dispatch, self.selective_policy, self.eager, self.terms,
                                              self.overlap_dp))


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
