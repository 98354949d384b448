"""The `plan --json` document: one plan, one count's result, the framework a plan assumed, and a sweep's row per GPU
count. `launch` compares a saved file's framework with `framework_to_dict` of the request it rebuilds from it, and
planfile.py reads these documents back."""

from __future__ import annotations

from typing import Any

from gpufleet.parallel.layout import expert_parallel_degrees
from gpufleet.planfile import PlannedFramework
from gpufleet.planner.plan import Plan, PlanRequest, PlanResult, default_batch_rule, pipeline_warning
from gpufleet.planner.request_file import saved_header
from gpufleet.planner.sweep import SweepPoint


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
            "offers": [{"name": o.name, "pricing": o.pricing, "usd": o.usd, "usd_per_gpu_hour": o.usd_per_gpu_hour}
                       for o in econ.offers],
            # the cheapest offer that holds its nodes (spot is reclaimed at short notice: its price assumes none is)
            "cheapest": econ.cheapest_offer.name if econ.cheapest_offer else None,
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


def framework_to_dict(request: PlanRequest) -> dict[str, Any]:
    """The plan file's `framework` section (`framework_record`) as JSON."""
    return framework_record(request).model_dump(mode="json")


def framework_record(request: PlanRequest) -> PlannedFramework:
    """The framework behaviours the plan assumed (`--stack` and the overlap/recompute flags)."""
    options, memory = request.options, request.options.memory
    return PlannedFramework(**{
            "stack": request.stack, "stack_record": request.stack_record, "stack_resolution": request.stack_why,
            "stack_version_assumed": request.stack_version_assumed, "attention_kernel": request.attention_kernel,
            "tp_comm_overlap": options.tp_comm_overlap, "tp_async_backward": options.tp_async_backward,
            "tp_gathered_inputs": memory.tp_gathered_inputs, "ep_comm_overlap": options.ep_comm_overlap,
            "ep_dispatch": options.ep_dispatch, "ep_routing": options.ep_routing,
            "moe_expert_kernels": options.moe_expert_kernels,
            "fused_elementwise": options.fused_elementwise,
            "dp_overlap": options.dp_overlap,
            "grad_dtype": memory.grad_dtype, "fp32_params": memory.fp32_params,
            "selective_policy": memory.selective_policy, "ep_imbalance": options.resolved_ep_imbalance,
            "moe_dropless": options.moe_dropless, "loss_bytes_per_logit": options.loss_bytes_per_logit,
            "straggler_sigma": options.straggler_sigma, "straggler_scope": options.straggler_scope,
            "overlap_slowdown": options.overlap_slowdown, "fsdp2_copies": options.fsdp2_copies,
            "fp8_amax_sync_sigma": options.resolved_fp8_amax_sync_sigma, "dp_overlap_window": options.dp_overlap_window,
            "fp8_recipe": options.fp8_recipe, "fp8_amax_group": options.fp8_amax_group,
            "pp_p2p_overlap": options.pp_p2p_overlap,
            "logits_bytes_per_element": memory.resolved_logits_bytes_per_element,
            "activation_offload": request.search_space.activation_offload,
            "sequence_parallel": request.search_space.sequence_parallel,
            "context_parallel": request.search_space.cps != (1,)})


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

