"""`launch_spec`: one ranked plan of a PlanResult turned into the LaunchSpec every target renders."""

from __future__ import annotations

import math

from gpufleet.emit.spec import LaunchSpec
from gpufleet.errors import InputError
from gpufleet.planner.plan import PlanResult


def launch_spec(result: PlanResult, rank: int = 1, *, checkpoint_dir: str = "/checkpoints",
                job_name: str = "gpufleet") -> LaunchSpec:
    """The plan ranked `rank` (1 = best) with what its launch files need: train iterations from the tokens, the
    reliability model's checkpoint interval and write time (None where the plan has no economics)."""
    found = len(result.plans)
    if not 1 <= rank <= found:
        raise InputError(f"--rank {rank} is beyond the plans found: choose 1-{found}")
    plan = result.plans[rank - 1]
    job, layout = result.job, plan.layout
    per_step = layout.micro_batch * layout.dp
    if job.global_batch % per_step:
        raise InputError(f"global batch {job.global_batch} is not a whole number of micro-batches "
                         f"({layout.micro_batch}) per data-parallel rank ({layout.dp})")
    return LaunchSpec(
        job=job, cluster=result.cluster, layout=layout, step=plan.candidate.step, options=result.request.options,
        stack=result.request.stack, rank=rank, train_iters=math.ceil(job.tokens / job.tokens_per_step),
        checkpoint_interval_s=plan.economics.checkpoint_interval_s if plan.economics else None,
        checkpoint_write_s=plan.economics.checkpoint_write_s if plan.economics else None,
        checkpoint_dir=checkpoint_dir, job_name=job_name)


def layout_summary(spec: LaunchSpec) -> dict[str, object]:
    """The layout as `launch --json` reports it (the degrees, batch arithmetic and memory choices)."""
    layout = spec.layout
    return {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "cp": layout.cp, "ep": layout.ep,
            "vpp": layout.vpp, "expert_tp": layout.expert_tp, "sequence_parallel": layout.sequence_parallel,
            "micro_batch": layout.micro_batch, "gradient_accumulation": spec.gradient_accumulation,
            "global_batch": spec.job.global_batch, "sharding": layout.sharding, "recompute": layout.recompute,
            "recompute_layers": layout.recompute_layers, "offload_optimizer": layout.offload_optimizer,
            "offload_activation_layers": layout.offload_activation_layers, "precision": spec.job.precision,
            "seq_len": spec.job.seq_len, "train_iters": spec.train_iters,
            "checkpoint_interval_steps": spec.checkpoint_interval_steps, "nodes": spec.nodes,
            "gpus_per_node": spec.gpus_per_node, "step_s": spec.step.step_s, "mfu": spec.step.mfu,
            "label": layout.short()}
