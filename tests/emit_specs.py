"""LaunchSpecs for the emitter tests, built the way `gpufleet launch` builds them: from the planner's ranked plans."""

from __future__ import annotations

import math
from pathlib import Path

from gpufleet.catalog.registry import Catalog, load_catalog
from gpufleet.emit.spec import LaunchSpec
from gpufleet.planner.plan import PlanRequest, make_plan

#: A 2-GPU H100 host (a judgement record for tests only): 2 nodes x 2 GPUs is a torchrun job this machine can run.
SMALL_NODE_YAML = """\
nodes:
  - id: test-2gpu
    name: 2x H100 test host
    gpu: h100-sxm
    gpus: 2
    nics: 2
    nic_gbps: 400
    default_network: ndr400
    cpu_ram_gib: 256
    max_power_w: 3000
    rack_units: 2
    source: "test fixture: a small host shape so that a real torchrun job fits on a CI machine"
"""


def small_catalog(folder: Path) -> Catalog:
    path = folder / "small-node.yaml"
    path.write_text(SMALL_NODE_YAML)
    return Catalog((path,))


def spec_from_plan(request: PlanRequest, catalog: Catalog | None = None, rank: int = 1,
                   **fields: object) -> LaunchSpec:
    """The LaunchSpec of plan `rank` of `request`: train_iters = ceil(tokens / (global batch x sequence))."""
    result = make_plan(request, catalog or load_catalog())
    plan = result.plans[rank - 1]
    job = result.job
    economics = plan.economics
    return LaunchSpec(
        job=job, cluster=result.cluster, layout=plan.layout, step=plan.candidate.step, options=request.options,
        stack=request.stack, rank=rank, train_iters=math.ceil(job.tokens / (job.global_batch * job.seq_len)),
        checkpoint_interval_s=economics.checkpoint_interval_s if economics else None,
        checkpoint_write_s=economics.checkpoint_write_s if economics else None, **fields)  # type: ignore[arg-type]
