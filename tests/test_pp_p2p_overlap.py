"""An interleaved pipeline's stage-boundary sends overlapped with the next chunk's compute (perf/pipeline.py,
StepOptions.pp_p2p_overlap): Megatron-LM's `overlap_p2p_comm`, NeMo 2's and Megatron-Bridge's comm-overlap configs."""

from __future__ import annotations

import math

import pytest

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.registry import load_catalog
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.parallel.layout import Layout
from gpufleet.perf.overlap_contention import OVERLAP_COMPUTE_SLOWDOWN
from gpufleet.perf.pipeline import P2P_COVER_SHARE
from gpufleet.perf.step import StepOptions, estimate_step
from gpufleet.planner.published_runs import stack_step_options
from gpufleet.workload.job import Job

CATALOG = load_catalog()
H100 = CATALOG.gpu("h100-sxm")
CAL = CATALOG.get("calibrations", "h100-sxm", CalibrationProfile).model_copy(
    update={"in_training_fraction": 0.87, "cudnn_attention_fraction": 0.6, "host_s_per_kernel": 10e-6})
LLAMA70 = CATALOG.model("llama3-70b")
#: Llama 3 70B on 64 H100s, tp4 pp8 vpp5 (Megatron-Bridge's H100 recipe): every pipeline boundary crosses nodes
JOB = Job(LLAMA70, tokens=1e12, seq_len=8192, global_batch=128)
INTERLEAVED = Layout(tp=4, pp=8, vpp=5, dp=2, micro_batch=1, sequence_parallel=True, sharding="zero1")


def _cluster() -> Cluster:
    return Cluster(H100, CATALOG.node("dgx-h100"), 64, Fabric(CATALOG.network("ndr400")))


def _step(layout: Layout, overlap: bool, slowdown: float = OVERLAP_COMPUTE_SLOWDOWN):  # type: ignore[no-untyped-def]
    options = StepOptions(pp_p2p_overlap=overlap, overlap_slowdown=slowdown)
    return estimate_step(JOB, layout, _cluster(), CAL, options)


def test_an_overlapped_send_hides_behind_the_next_chunks_forward_by_hand() -> None:
    # The micro-batch's 2 x vpp = 10 send-recvs per stage cost the same seconds either way; in line, all of them are
    # exposed; overlapped, a send of about a millisecond (a 1 x 8192 x 8192 bf16 activation / tp 4 = 32 MiB over one
    # 400 Gb/s NIC: 0.7 ms) hides behind a chunk's forward (2 of 80 layers: tens of ms), so none is.
    inline, overlapped = _step(INTERLEAVED, False), _step(INTERLEAVED, True)
    m = inline.micro_batches
    assert m == 64
    total_s = inline.parts["comm.pp"].exposed_s
    assert inline.parts["comm.pp"].hidden_s == 0.0
    hop_s = total_s / (m * 2 * 5)
    assert 32 * 2**20 / 50e9 < hop_s < 2e-3  # at most the NIC's 50 GB/s, plus latency
    assert math.isclose(overlapped.parts["comm.pp"].exposed_s + overlapped.parts["comm.pp"].hidden_s, total_s,
                        rel_tol=1e-9)
    # the cover: a mean stage's compute per micro-batch over vpp chunks, a third of it forward
    stage_compute_s = (inline.parts["compute.gemm"].exposed_s + inline.parts["compute.attention"].exposed_s
                       + inline.parts["compute.elementwise"].exposed_s) / m
    assert hop_s < stage_compute_s / 5 * P2P_COVER_SHARE
    assert overlapped.parts["comm.pp"].exposed_s == 0.0
    assert overlapped.parts["comm.pp"].link.endswith(", overlapped")


def test_the_step_gains_the_sends_and_pays_their_contention() -> None:
    # With no contention, the step shortens by the sends' exposed seconds plus the bubble's share of them:
    # (pp - 1) / vpp mean stages, each a micro-batch's 10 sends longer. With contention, the hidden seconds stretch
    # the compute under them by the measured 18.9 %.
    inline, overlapped = _step(INTERLEAVED, False, 0.0), _step(INTERLEAVED, True, 0.0)
    per_mb_s = inline.parts["comm.pp"].exposed_s / inline.micro_batches
    expected_s = inline.parts["comm.pp"].exposed_s + (8 - 1) / 5 * per_mb_s
    assert math.isclose(inline.step_s - overlapped.step_s, expected_s, rel_tol=1e-6)
    contended = _step(INTERLEAVED, True)
    plain = _step(INTERLEAVED, True, 0.0)
    assert math.isclose(contended.parts["compute.overlap-contention"].exposed_s
                        - _step(INTERLEAVED, False).parts["compute.overlap-contention"].exposed_s,
                        OVERLAP_COMPUTE_SLOWDOWN * plain.parts["comm.pp"].hidden_s, rel_tol=1e-6)


def test_without_interleaving_the_sends_stay_in_line() -> None:
    # Megatron-LM's validate_args turns overlap_p2p_comm off without a virtual pipeline; so does the model.
    flat = Layout(tp=4, pp=8, vpp=1, dp=2, micro_batch=1, sequence_parallel=True, sharding="zero1")
    assert _step(flat, True).step_s == _step(flat, False).step_s
    assert _step(flat, True).parts["comm.pp"].hidden_s == 0.0


@pytest.mark.parametrize(("stack", "overlapped"), [("megatron-lm", True), ("megatron-core", True), ("nemo", True),
                                                   ("megatron-lm-2021", False), ("megatron-lm-2022", False)])
def test_the_2021_and_2022_megatron_stacks_send_in_line(stack: str, overlapped: bool) -> None:
    # The overlap came to Megatron-LM on 2023-05-31 and became its default on 2023-10-12 (stacks.yaml sources).
    assert stack_step_options(CATALOG.stack(stack), StepOptions()).pp_p2p_overlap is overlapped
