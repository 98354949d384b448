"""The planner's step for one given layout (planner/fixed_layout.py): a plain PyTorch FSDP2 job."""

from __future__ import annotations

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

