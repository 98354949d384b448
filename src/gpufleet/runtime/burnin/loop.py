"""Closing the loop: the planner's step time for the burn-in's own layout on the host catalog `--measure-host`
wrote, next to the step time the burn-in measured. No torch here (the model half prices; the runtime measured).

What the burn-in runs, as the planner's request: FSDP2 over every rank (dp = ranks, sharded parameters, no
recompute, no TP or PP), eager PyTorch (no fused element-wise kernels), PyTorch's cross-entropy (40 bytes per
logit: perf.compute) and, on a CPU, no overlap of communication with compute (the same cores run gloo and the
GEMMs: a judgement about the host, not a fit). On GPUs NCCL runs on its own SMs and FSDP2 prefetches, so overlap
stays on there.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import InputError
from gpufleet.runtime.burnin.config import MODEL_ID, BurninConfig
from gpufleet.runtime.burnin.host_catalog import HOST_GPU_ID, HOST_NODE_ID

#: Steps left out of the measured median: the first steps pay for allocation and lazy initialisation.
WARMUP_STEPS = 2


@dataclass(frozen=True)
class LoopCheck:
    """The plan's step for the burn-in's layout, the burn-in's measured step (median after warm-up), and the plan's
    parts (exposed seconds by name) that say which term is off when the two differ."""

    predicted_s: float
    measured_s: float
    parts_s: dict[str, float]
    clock: str  # "wall" or "cpu": what both sides were timed with

    @property
    def ratio(self) -> float:
        return self.predicted_s / self.measured_s

    def summary(self) -> str:
        parts = ", ".join(f"{name} {seconds * 1e3:.1f}" for name, seconds in self.parts_s.items() if seconds > 0)
        return (f"plan {self.predicted_s:.4f} s/step, burn-in {self.measured_s:.4f} s/step ({self.clock} clock): "
                f"plan/burn-in {self.ratio:.3f}; plan parts (ms): {parts}")


def predicted_step(catalog_path: Path, config: BurninConfig, ranks: int,
                   on_gpu: bool) -> tuple[float, dict[str, float]]:
    """The planner's step seconds and parts for the burn-in's layout on `catalog_path` (a --measure-host file)."""
    from gpufleet.catalog.registry import Catalog
    from gpufleet.perf.step import StepOptions
    from gpufleet.planner.plan import PlanRequest, make_plan
    from gpufleet.planner.search import SearchSpace

    catalog = Catalog((catalog_path,))
    options = StepOptions(dp_overlap=on_gpu, fused_elementwise=False, loss_bytes_per_logit=40.0)
    space = SearchSpace(micro_batches=(config.micro_batch,), shardings=("fsdp",), recomputes=("none",), vpps=(1,),
                        cps=(1,), max_tp=1, partial_recompute=False, activation_offload=False)
    request = PlanRequest(model=MODEL_ID, tokens=1e9, gpu=HOST_GPU_ID, gpus=ranks, node=HOST_NODE_ID,
                          seq_len=config.shape.seq_len, global_batch=config.micro_batch * ranks, options=options,
                          search_space=space, top=1)
    result = make_plan(request, catalog)
    plans = [c for c in result.search.feasible if (c.layout.tp, c.layout.pp, c.layout.dp) == (1, 1, ranks)]
    if not plans:
        raise InputError(f"the planner finds no FSDP layout over {ranks} ranks for the burn-in model on "
                         f"{catalog_path} (it does not fit the memory the host catalog records)")
    step = plans[0].step
    return step.step_s, {name: part.exposed_s for name, part in step.parts.items()}


def measured_step(step_seconds: Sequence[float]) -> float:
    """The median step after the warm-up steps (all steps when there are no more than that)."""
    if not step_seconds:
        raise InputError("the burn-in logged no steps to compare the plan with")
    kept = step_seconds[WARMUP_STEPS:] or step_seconds
    return statistics.median(kept)


def check_loop(catalog_path: Path, config: BurninConfig, ranks: int, step_seconds: Iterable[float],
               on_gpu: bool = False) -> LoopCheck:
    predicted_s, parts = predicted_step(catalog_path, config, ranks, on_gpu)
    return LoopCheck(predicted_s=predicted_s, measured_s=measured_step(list(step_seconds)), parts_s=parts,
                     clock=config.measure_clock)
