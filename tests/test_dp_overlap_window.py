"""The interleaved data-parallel overlap window (perf/dp_scaling.py: interleaved_exposed_s;
StepOptions.dp_overlap_window "chunks"): by hand, against the one-micro-batch window, its bounds, and the
strong-scaling end points it was studied on (docs/dp-scaling.md)."""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.registry import load_catalog
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.parallel.layout import Layout
from gpufleet.perf.comm_cost import overlap
from gpufleet.perf.dp_scaling import interleaved_exposed_s
from gpufleet.perf.step import StepOptions, estimate_step
from gpufleet.planner.published_runs import load_runs
from gpufleet.planner.validate import predict_run
from gpufleet.workload.job import Job

CATALOG = load_catalog()
H100 = CATALOG.gpu("h100-sxm")
CAL = CATALOG.get("calibrations", "h100-sxm", CalibrationProfile)
PUBLIC = Path(__file__).resolve().parent.parent / "src/gpufleet/catalog/runs/dp_scaling_holdout.yaml"


def test_three_chunks_by_hand() -> None:
    # A stage of 12 layers in 3 chunks (4 layers each), 4 micro-batches in the tail's group, a 1.2 s reduction and
    # 0.6 s of backward per micro-batch over the stage: per chunk 0.4 s of reduction and 0.2 s of backward, a group
    # 4 x 0.2 = 0.8 s. Chunk 2 is ready at 0.8 s, its reduction runs to 1.2 s; chunk 1 is ready at 1.6 s, runs to
    # 2.0 s. Chunk 0's last micro-batch starts its backward at 3 x 0.8 - 0.2 = 2.2 s with nothing pending: its own
    # 0.4 s overlaps 0.2 s of backward, 0.2 s exposed (more than its last bucket, 0.4 / 4 = 0.1 s).
    assert math.isclose(interleaved_exposed_s(1.2, 0.6, 12, 3, 4), 0.2, rel_tol=1e-12)
    # The one-micro-batch window: 1.2 - 0.6 = 0.6 s exposed.
    assert math.isclose(overlap(1.2, 0.6, 12)[0], 0.6, rel_tol=1e-12)
    # A 6.0 s reduction cannot hide: chunk 2 runs 0.8 -> 2.8 s, chunk 1 2.8 -> 4.8 s, 2.6 s still pending at 2.2 s;
    # with chunk 0's own 2.0 s less 0.2 s of backward: 4.4 s exposed (the comm ends at 6.8 s, the compute at 2.4 s).
    assert math.isclose(interleaved_exposed_s(6.0, 0.6, 12, 3, 4), 4.4, rel_tol=1e-12)
    assert interleaved_exposed_s(0.0, 0.6, 12, 3, 4) == 0.0


@given(st.floats(1e-6, 100.0), st.floats(0.0, 100.0), st.integers(1, 200), st.integers(1, 64))
def test_one_chunk_is_the_one_micro_batch_window(comm_s: float, window_s: float, granules: int, group: int) -> None:
    assert math.isclose(interleaved_exposed_s(comm_s, window_s, granules, 1, group), overlap(comm_s, window_s,
                                                                                             granules)[0])


@given(st.floats(1e-6, 100.0), st.floats(0.0, 100.0), st.integers(1, 200), st.integers(1, 16), st.integers(1, 64),
       st.floats(1.0, 3.0))
def test_bounds_and_monotone_in_the_collective(comm_s: float, window_s: float, granules: int, vpp: int, group: int,
                                               more: float) -> None:
    exposed = interleaved_exposed_s(comm_s, window_s, granules, vpp, group)
    # never more than the collective; never less than the first chunk's last bucket
    assert comm_s / vpp / max(granules // vpp, 1) - 1e-12 <= exposed <= comm_s + 1e-12
    assert interleaved_exposed_s(comm_s * more, window_s, granules, vpp, group) >= exposed - 1e-12


def _gpt3_step(dp: int, window: str):
    # GPT-3 175B, tp4 pp8 vpp12, 64 micro-batches of 1 per pipeline at every dp (fixed work per replica), BF16
    job = Job(CATALOG.model("gpt3-175b"), tokens=1e12, seq_len=2048, global_batch=64 * dp)
    # plain DDP (sharding none): the optimizer step does not shrink with dp, so only what dp adds moves the step
    layout = Layout(tp=4, pp=8, vpp=12, dp=dp, micro_batch=1, sequence_parallel=True, sharding="none")
    cluster = Cluster(H100, CATALOG.node("dgx-h100"), 32 * dp, Fabric(CATALOG.network("ndr400")))
    return estimate_step(job, layout, cluster, CAL, StepOptions(dp_overlap_window=window))  # type: ignore[arg-type]


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 6), st.sampled_from(["micro-batch", "chunks"]))
def test_tokens_per_gpu_do_not_rise_with_dp_at_fixed_work_per_replica(doublings: int, window: str) -> None:
    small, large = _gpt3_step(2 ** (doublings - 1), window), _gpt3_step(2 ** doublings, window)
    assert large.tokens_per_s_per_gpu <= small.tokens_per_s_per_gpu * (1 + 1e-12)
    assert large.tokens_per_s_per_gpu >= 0.95 * small.tokens_per_s_per_gpu  # a doubling costs under 5 %


def test_chunks_window_hides_more_of_an_interleaved_reduction() -> None:
    chunks, micro = _gpt3_step(16, "chunks"), _gpt3_step(16, "micro-batch")
    assert chunks.parts["comm.dp"].exposed_s < micro.parts["comm.dp"].exposed_s
    assert math.isclose(chunks.parts["comm.dp"].exposed_s + chunks.parts["comm.dp"].hidden_s,
                        micro.parts["comm.dp"].exposed_s + micro.parts["comm.dp"].hidden_s)  # the same collective


def test_strong_scaling_end_points_fall_as_measured_with_the_chunks_window() -> None:
    # Megatron-Core's GPT-3 177B strong scaling (batch 1152; 576 -> 12 micro-batches per pipeline): MFU 47 % -> 42 %,
    # a ratio of 0.894. The one-micro-batch window predicts a steeper fall (the exposed reduction grows with dp while
    # the step shrinks); the chunks window leaves the bubble, which the measured fall matches within 3 points. The
    # overlap contention is off here to isolate the window: on (the default), it charges 18.9 % of the reduction the
    # window hides, and the chunks window's ratio falls to about 0.85 (docs/dp-scaling.md).
    runs = {run.id: run for run in load_runs(PUBLIC)}
    small, large = runs["mcore-h100-strong-177b-96gpu"], runs["mcore-h100-strong-177b-4608gpu"]
    measured = large.target.tokens_per_s_per_gpu / small.target.tokens_per_s_per_gpu
    assert math.isclose(measured, 42 / 47, rel_tol=1e-3)

    def ratio(window: str) -> float:
        options = StepOptions(dp_overlap_window=window, overlap_slowdown=0.0)  # type: ignore[arg-type]
        return ((predict_run(large, CATALOG, options).predicted_tokens_per_s_per_gpu or math.nan)
                / (predict_run(small, CATALOG, options).predicted_tokens_per_s_per_gpu or math.nan))

    assert abs(ratio("chunks") - measured) < 0.03 < abs(ratio("micro-batch") - measured)
