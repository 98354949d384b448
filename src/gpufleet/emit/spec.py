"""What every launch-file writer reads (`LaunchSpec`) and what it returns (`EmittedFile`).

One small protocol for every target (STYLE.md habit 7): an emitter is a module-level object with a `name`
and `render(spec) -> list[EmittedFile]`. A target that cannot express the plan raises `TargetCannotExpress`
(an InputError) naming what it lacks and which target can.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpufleet.errors import InputError
from gpufleet.fabric.topology import Cluster
from gpufleet.parallel.layout import Layout
from gpufleet.perf.step import StepEstimate, StepOptions
from gpufleet.workload.job import Job


@dataclass(frozen=True)
class LaunchSpec:
    """One chosen plan, with everything a launch file needs and nothing a writer must recompute.

    `checkpoint_interval_s` is the reliability model's interval (None where the plan had no economics);
    `train_iters` is the number of optimizer steps the tokens imply; `step_s` and `mfu` the plan's prediction.
    """

    job: Job
    cluster: Cluster
    layout: Layout
    step: StepEstimate
    options: StepOptions
    stack: str | None
    rank: int
    train_iters: int
    checkpoint_interval_s: float | None
    #: where the job saves and loads checkpoints (a path the emitted files name; written to by the job, not here)
    checkpoint_dir: str = "/checkpoints"
    job_name: str = "gpufleet"
    #: the training entry point and its arguments, one word each, that the scheduler targets (slurm, k8s) start
    #: under torchrun, e.g. ("pretrain_gpt.py", "--tensor-model-parallel-size", "8"): `launch` fills it from the
    #: first framework target it writes; empty: the arguments given at submit time (`sbatch job.sbatch train.py ...`)
    train_command: tuple[str, ...] = ()
    #: seconds one checkpoint save takes (the reliability model's write time; None without economics): how long
    #: before its time limit a Slurm job is told to save
    checkpoint_write_s: float | None = None
    #: how the scheduler targets name hosts: prefix + 1-based number (node1, node2, ...), as in topology.conf
    host_prefix: str = "node"

    @property
    def nodes(self) -> int:
        return self.cluster.num_nodes

    @property
    def gpus_per_node(self) -> int:
        return self.cluster.gpus_per_node

    @property
    def gradient_accumulation(self) -> int:
        """Micro-batches per step per data-parallel rank: global = micro × accumulation × dp, exactly."""
        return self.job.global_batch // (self.layout.micro_batch * self.layout.dp)

    @property
    def checkpoint_interval_steps(self) -> int:
        """Steps between saves from the reliability model's interval (at least 1; 1000 without one)."""
        if self.checkpoint_interval_s is None:
            return 1000
        return max(1, round(self.checkpoint_interval_s / self.step.step_s))


@dataclass(frozen=True)
class EmittedFile:
    """One file a target writes: a path relative to the output folder, its text, and whether it is executable."""

    path: str
    text: str
    executable: bool = False


class Emitter(Protocol):
    """A launch target: `name` as `--target` spells it, and a pure `render`."""

    name: str

    def render(self, spec: LaunchSpec) -> list[EmittedFile]: ...


class TargetCannotExpress(InputError):
    """The target has no way to run this plan (e.g. context parallelism in a framework without it)."""

    def __init__(self, target: str, lacks: str, alternatives: list[str]) -> None:
        self.target, self.lacks, self.alternatives = target, lacks, alternatives
        instead = f"; use --target {' or '.join(alternatives)}" if alternatives else ""
        super().__init__(f"--target {target} cannot express this plan: it has no {lacks}{instead}")
