"""The residual mechanisms of docs/residuals.md. FSDP2's copy-in/copy-out term (perf/fsdp_overheads.py): bytes per
parameter counted by hand from the copies FSDP2 makes, seconds by hand for Llama 3 8B, invariants, its place in a
step, and its stack setting. The overlap-contention term (perf/overlap_contention.py): by hand, invariants, its place
in a step and where it is absent."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.registry import load_catalog
from gpufleet.catalog.stacks import StackRecord
from gpufleet.errors import InputError
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.parallel.layout import Layout
from gpufleet.perf.fsdp_overheads import fsdp2_copy_bytes_per_param, fsdp2_copy_s
from gpufleet.perf.overlap_contention import COLLECTIVE_PARTS, OVERLAP_COMPUTE_SLOWDOWN, contention_s
from gpufleet.perf.step import StepOptions, estimate_step, stage_parameters
from gpufleet.planner.published_runs import stack_step_options
from gpufleet.workload.job import Job

CATALOG = load_catalog()
H100 = CATALOG.gpu("h100-sxm")
CAL = CATALOG.get("calibrations", "h100-sxm", CalibrationProfile)


def test_bytes_per_parameter_by_hand() -> None:
    # torchtitan: bf16 parameters (2 B), fp32 reduce (4 B). The forward's copy-out reads and writes each element
    # (2 + 2), the backward's re-gather again (2 + 2), the reduce-scatter copy-in reads the bf16 gradient and
    # writes it as fp32 (2 + 4): 14 B.
    assert fsdp2_copy_bytes_per_param(2, 4, regathered_in_backward=True) == 14
    # Not resharded after the forward (torchtitan under pipelining): one copy-out, bf16 reduce: 4 + 2 + 2 = 8 B.
    assert fsdp2_copy_bytes_per_param(2, 2, regathered_in_backward=False) == 8


def test_seconds_by_hand_for_llama3_8b_on_h100() -> None:
    # 8.03e9 unsharded parameters, one micro-batch, 14 B each over 3.35 TB/s x 0.8: 112.4 GB / 2.68 TB/s = 41.9 ms.
    seconds = fsdp2_copy_s(8.03e9, 1, param_bytes=2, reduce_bytes=4, regathered_in_backward=True,
                           hbm_bytes_per_s=3.35e12, hbm_fraction=0.8)
    assert math.isclose(seconds, 8.03e9 * 14 / (3.35e12 * 0.8), rel_tol=1e-12)
    assert math.isclose(seconds, 0.04195, rel_tol=1e-3)


@given(st.floats(0, 1e12), st.integers(0, 64), st.sampled_from([1, 2, 4]), st.booleans())
def test_seconds_grow_with_parameters_and_micro_batches(params: float, m: int, reduce_bytes: int,
                                                        regathered: bool) -> None:
    def s(p: float, mb: int) -> float:
        return fsdp2_copy_s(p, mb, param_bytes=2, reduce_bytes=reduce_bytes, regathered_in_backward=regathered,
                            hbm_bytes_per_s=3.35e12, hbm_fraction=0.8)

    assert 0.0 <= s(params, m) <= s(params * 1.5 + 1, m) <= s(params * 1.5 + 1, m + 1)
    assert math.isclose(s(params, 2 * m), 2 * s(params, m), rel_tol=1e-9, abs_tol=1e-15)  # once per micro-batch
    assert s(0.0, m) == 0.0 and s(params, 0) == 0.0


def _llama8b_step(layout: Layout, options: StepOptions) -> tuple[float, float, dict[str, float]]:
    job = Job(CATALOG.model("llama3-8b"), tokens=1e12, seq_len=8192, global_batch=16)
    cluster = Cluster(H100, CATALOG.node("dgx-h100"), 8, Fabric(CATALOG.network("ndr400")))
    step = estimate_step(job, layout, cluster, CAL, options)
    params = stage_parameters(job, layout, 0)
    return step.step_s, params.dense + params.expert, {name: part.exposed_s for name, part in step.parts.items()}


def test_the_step_adds_the_copies_of_an_fsdp_layout_and_nothing_else() -> None:
    fsdp = Layout(tp=1, pp=1, dp=8, micro_batch=2, sharding="fsdp")
    off_s, params, off_parts = _llama8b_step(fsdp, StepOptions())
    on_s, _, on_parts = _llama8b_step(fsdp, StepOptions(fsdp2_copies=True))
    assert "fsdp.copies" not in off_parts  # off by default
    m = 1  # 16 sequences over dp 8 at micro-batch 2
    expected = m * params * 14 / (H100.hbm_bytes_per_s * CAL.hbm_fraction)  # fp32 gradient reduction (Megatron's)
    assert math.isclose(on_parts["fsdp.copies"], expected, rel_tol=1e-9)
    assert math.isclose(on_s - off_s, expected, rel_tol=1e-9)
    # The mechanism is absent where parameters are not gathered per module: the distributed optimizer.
    zero1 = replace(fsdp, sharding="zero1")
    assert _llama8b_step(zero1, StepOptions(fsdp2_copies=True))[0] == _llama8b_step(zero1, StepOptions())[0]


def test_a_stack_can_state_the_setting() -> None:
    stack = StackRecord.model_validate({"id": "fsdp2-example", "name": "an FSDP2 stack", "source": "test",
                                        "settings": {"fsdp2_copies": {"value": True, "source": "test"}}})
    assert stack_step_options(stack, StepOptions()).fsdp2_copies is True
    assert stack_step_options(CATALOG.stack("megatron-lm"), StepOptions()).fsdp2_copies is False


def test_shipped_fsdp2_stacks_state_the_copies() -> None:
    # torchtitan and NeMo AutoModel shard with fully_shard; Megatron's and llm-foundry's (FSDP1) stacks do not.
    assert CATALOG.stack("torchtitan").value("fsdp2_copies") is True
    assert CATALOG.stack("nemo-automodel").value("fsdp2_copies") is True
    assert CATALOG.stack("llm-foundry").value("fsdp2_copies") is None


def test_contention_by_hand() -> None:
    # 0.3 s of hidden collectives at the measured 18.9 % slowdown: 56.7 ms more compute.
    assert math.isclose(contention_s([0.1, 0.2], OVERLAP_COMPUTE_SLOWDOWN), 0.0567, rel_tol=1e-12)
    assert contention_s([], OVERLAP_COMPUTE_SLOWDOWN) == 0.0
    assert contention_s([0.5], 0.0) == 0.0
    with pytest.raises(InputError, match="slowdown must be >= 0"):
        contention_s([0.1], -0.1)


@given(st.lists(st.floats(0, 100), max_size=4), st.floats(0, 0.4), st.floats(0, 10))
def test_contention_grows_with_hidden_seconds_and_slowdown(hidden: list[float], slowdown: float,
                                                           more: float) -> None:
    base = contention_s(hidden, slowdown)
    assert 0.0 <= base <= contention_s([*hidden, more], slowdown) + 1e-12
    assert base <= contention_s(hidden, slowdown + 0.1) + 1e-12


def test_the_step_adds_the_slowdown_of_its_hidden_collectives() -> None:
    fsdp = Layout(tp=1, pp=1, dp=8, micro_batch=2, sharding="fsdp")
    job = Job(CATALOG.model("llama3-8b"), tokens=1e12, seq_len=8192, global_batch=16)
    cluster = Cluster(H100, CATALOG.node("dgx-h100"), 8, Fabric(CATALOG.network("ndr400")))
    off = estimate_step(job, fsdp, cluster, CAL, StepOptions(overlap_slowdown=0.0))
    on = estimate_step(job, fsdp, cluster, CAL, StepOptions())  # on by default, at the measured slowdown
    assert StepOptions().overlap_slowdown == OVERLAP_COMPUTE_SLOWDOWN
    hidden = sum(off.parts[name].hidden_s for name in COLLECTIVE_PARTS if name in off.parts)
    assert hidden > 0  # FSDP's gathers and reductions hide under the layers' compute
    assert math.isclose(on.step_s - off.step_s, OVERLAP_COMPUTE_SLOWDOWN * hidden, rel_tol=1e-9)
    assert "compute.overlap-contention" not in off.parts
    # One GPU: nothing to communicate, nothing to contend with.
    alone = Layout(tp=1, pp=1, dp=1, micro_batch=2)
    one = Cluster(H100, CATALOG.node("dgx-h100"), 1, Fabric(CATALOG.network("ndr400")))
    small = Job(CATALOG.model("llama3-8b"), tokens=1e12, seq_len=8192, global_batch=2)
    assert (estimate_step(small, alone, one, CAL, StepOptions(overlap_slowdown=0.3)).step_s
            == estimate_step(small, alone, one, CAL, StepOptions()).step_s)
