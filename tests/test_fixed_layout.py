"""The planner's step for one given layout (planner/fixed_layout.py): a plain PyTorch FSDP2 job."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.catalog.registry import Catalog
from gpufleet.errors import InfeasibleError
from gpufleet.planner.fixed_layout import eager_fsdp_step


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog()


def test_overlap_hides_fsdp_collectives_and_never_lengthens_the_step(catalog: Catalog) -> None:
    """Same job, overlap on and off: compute is the same; with overlap on, part of comm.dp is hidden."""
    inline = eager_fsdp_step(catalog, "llama3-8b", "h100-sxm", "dgx-h100", 16, 4096, 1, overlap=False)
    hidden = eager_fsdp_step(catalog, "llama3-8b", "h100-sxm", "dgx-h100", 16, 4096, 1, overlap=True)
    assert hidden.step_s <= inline.step_s
    assert hidden.parts["compute.gemm"].exposed_s == pytest.approx(inline.parts["compute.gemm"].exposed_s)
    assert hidden.parts["comm.dp"].exposed_s < inline.parts["comm.dp"].exposed_s


def test_eager_elementwise_costs_more_than_the_planner_default(catalog: Catalog) -> None:
    """A plain PyTorch job runs its norms and activations eagerly: more element-wise time than the planner's
    fused default for the same layout."""
    from gpufleet.planner.plan import PlanRequest, make_plan
    from gpufleet.planner.search import SearchSpace

    eager = eager_fsdp_step(catalog, "llama3-8b", "h100-sxm", "dgx-h100", 16, 4096, 1, overlap=True)
    space = SearchSpace(micro_batches=(1,), shardings=("fsdp",), recomputes=("none",), vpps=(1,), cps=(1,),
                        max_tp=1, partial_recompute=False, activation_offload=False)
    fused = make_plan(PlanRequest(model="llama3-8b", gpu="h100-sxm", gpus=16, node="dgx-h100", seq_len=4096,
                                  global_batch=16, search_space=space), catalog)
    step = next(c.step for c in fused.search.feasible if (c.layout.tp, c.layout.pp) == (1, 1))
    assert eager.parts["compute.elementwise"].exposed_s > step.parts["compute.elementwise"].exposed_s


def test_a_job_that_does_not_fit_says_what_it_needs(catalog: Catalog) -> None:
    """70B on one 80 GiB GPU: the planner's own verdict (how much memory is missing), not an empty answer."""
    with pytest.raises(InfeasibleError, match=r"no layout fits on 1 x h100-sxm .* GiB more than the 80 GiB"):
        eager_fsdp_step(catalog, "llama3-70b", "h100-sxm", "dgx-h100", 1, 4096, 1, overlap=True)



def test_the_burnin_moe_model_is_priced_as_a_plain_fsdp_job_on_its_host_catalog(tmp_path: Path) -> None:
    """The burn-in's MoE model as the host catalog writes it (`moe:` block, every layer MoE, no dense MLP) is priced
    for the burn-in's own layout: FSDP over every rank, ep=1 (no expert parallelism, so no all-to-all), dropless
    routing whose host time counts; its interval is the MoE regime's. More experts at the same top-k: the same
    FLOPs in smaller GEMMs (fewer tokens per expert: no faster), more parameters for FSDP2 to gather (comm.dp) and
    more kernels for the host (host.moe)."""
    from gpufleet.planner.fixed_layout import eager_fsdp_plan
    from gpufleet.runtime.burnin.config import MOE_MODEL_ID, ModelShape
    from gpufleet.runtime.burnin.host_catalog import HOST_GPU_ID, HOST_NODE_ID, HostMeasurement, write_host_catalog

    measured = HostMeasurement(hostname="h", cpu="AMD EPYC 9654", ranks=2, threads_per_rank=1,
                               peak_gemm_flop_per_s=4e11, gemm_shapes=((256, 512, 256, 8, 2e11),),
                               attention_flop_per_s=8e9, elementwise_bytes_per_s=3e9,
                               allgather_busbw_bytes_per_s=2e8, reduce_scatter_busbw_bytes_per_s=1e8,
                               disk_write_bytes_per_s=5e8, disk_read_bytes_per_s=9e8, ram_bytes=32 * 2**30,
                               date="2026-12-01", fsdp_block_comm_s=2e-3, optimizer_s_per_param=4e-9,
                               block_params=ModelShape(experts=4).block_params())
    steps = {}
    for experts in (4, 8):
        shape = ModelShape(layers=2, hidden=256, heads=4, ffn_hidden=512, vocab=1024, seq_len=128, experts=experts,
                           top_k=2)
        path = tmp_path / f"host{experts}.yaml"
        write_host_catalog(path, measured, shape)
        catalog = Catalog((path,))
        assert catalog.check() == []
        model = catalog.model(MOE_MODEL_ID)
        assert model.moe is not None and (model.moe.experts, model.moe.top_k) == (experts, 2)
        assert model.moe.expert_ffn_hidden == 512 and model.ffn_hidden is None and model.moe.dense_layers == 0
        planned = eager_fsdp_plan(catalog, MOE_MODEL_ID, HOST_GPU_ID, HOST_NODE_ID, 2, 128, 2, overlap=False)
        parts = planned.step.parts
        assert planned.step.step_s > 0 and parts["host.moe"].exposed_s > 0 and parts["compute.gemm"].exposed_s > 0
        assert "comm.ep" not in parts or parts["comm.ep"].exposed_s == 0  # ep=1: no all-to-all
        assert planned.interval.regime == "moe" and planned.interval.low < planned.step.step_s < planned.interval.high
        steps[experts] = planned.step
    assert steps[8].parts["compute.gemm"].exposed_s >= steps[4].parts["compute.gemm"].exposed_s
    assert steps[8].parts["comm.dp"].exposed_s > steps[4].parts["comm.dp"].exposed_s
    assert steps[8].parts["host.moe"].exposed_s > steps[4].parts["host.moe"].exposed_s
