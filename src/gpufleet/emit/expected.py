"""Memory per GPU, step time and MFU of a layout read from launch files, through gpufleet's model."""

from __future__ import annotations

from typing import Any, cast

from gpufleet.catalog.records import Precision
from gpufleet.catalog.registry import Catalog
from gpufleet.errors import InfeasibleError
from gpufleet.parallel.layout import Layout, Recompute, Sharding, validate_layout
from gpufleet.parallel.memory import peak_stage_memory
from gpufleet.perf.step import estimate_step
from gpufleet.planner.intervals import IntervalTable, step_interval
from gpufleet.planner.plan import PlanRequest, build_cluster, build_job
from gpufleet.planner.published_runs import framework_options, stack_calibration


def expected_step(catalog: Catalog, model_id: str, gpu_id: str, gpus: int, degrees: dict[str, int], dp: int,
                  stated: dict[str, Any], stack_id: str | None = None) -> dict[str, Any]:
    """Estimate the files' layout with the settings of their framework's stack (`stack_id`, as `plan --stack`
    prices it; None: gpufleet's defaults); InfeasibleError when it does not fit in HBM, LayoutError when it is
    illegal."""
    micro = int(stated["micro_batch"] or 1)
    request = PlanRequest(model=model_id, gpu=gpu_id, gpus=gpus, seq_len=int(stated["seq_len"] or 4096),
                          global_batch=stated["global_batch"],
                          precision=cast(Precision, stated["precision"] or "bf16"))
    job, cluster = build_job(request, catalog), build_cluster(request, catalog)
    recompute = {"selective": "selective", "full": "full"}.get(str(stated["recompute"]), "none")
    layout = Layout(tp=degrees.get("tp", 1), pp=degrees.get("pp", 1), dp=dp, cp=degrees.get("cp", 1),
                    ep=degrees.get("ep", 1), vpp=degrees.get("vpp", 1), micro_batch=micro,
                    sharding=cast(Sharding, stated["sharding"] or "none"), recompute=cast(Recompute, recompute),
                    sequence_parallel=degrees.get("tp", 1) > 1)
    validate_layout(layout, job.model, gpus, job.global_batch, job.seq_len)
    stack = catalog.stack(stack_id) if stack_id is not None else None
    options = framework_options(stack).with_judgements(catalog.judgements())
    _, memory = peak_stage_memory(job.model, layout, seq_len=job.seq_len, global_batch=job.global_batch,
                                  precision=job.precision, assumptions=options.memory)
    if memory.total_bytes > cluster.gpu.hbm_bytes:
        raise InfeasibleError(f"needs {memory.total_bytes / 2**30:.1f} GiB per GPU, more than the "
                              f"{cluster.gpu.hbm_bytes / 2**30:.0f} GiB of a {cluster.gpu.id}")
    calibration = stack_calibration(catalog.calibration(cluster.gpu.id),
                                    stack.value("attention_kernel") if stack is not None else None)
    step = estimate_step(job, layout, cluster, calibration, options)
    interval = step_interval(job, layout, gpus, step.step_s, IntervalTable.from_record(catalog.interval_table()))
    return {"model": model_id, "gpu": cluster.gpu.id, "gpus": gpus, "layout": layout.short(), "stack": stack_id,
            "peak_memory_bytes": memory.total_bytes, "hbm_bytes": cluster.gpu.hbm_bytes, "step_s": step.step_s,
            "mfu": step.mfu, "tokens_per_s": step.tokens_per_s, "micro_batches": step.micro_batches,
            "bubble_fraction": step.bubble_fraction, "step_interval": interval.as_json(),
            "parts_s": {name: part.exposed_s for name, part in step.parts.items() if part.total_s > 0}}
