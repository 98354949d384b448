"""Layout search: legality, counts, memory pruning and ranking."""

from __future__ import annotations

import pytest

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.registry import load_catalog
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.parallel.layout import Layout, validate_layout
from gpufleet.parallel.memory import peak_stage_memory
from gpufleet.perf.step import estimate_step
from gpufleet.planner.search import Candidate, Infeasible, SearchSpace, enumerate_layouts, evaluate, search
from gpufleet.workload.job import Job

CATALOG = load_catalog()
H100 = CATALOG.gpu("h100-sxm")
CAL = CATALOG.get("calibrations", "h100-sxm", CalibrationProfile)


def cluster(gpus: int) -> Cluster:
    return Cluster(H100, CATALOG.node("dgx-h100"), gpus, Fabric(CATALOG.network("ndr400")))


def test_counts_add_up_and_ranking_is_by_step_time() -> None:
    job = Job(CATALOG.model("llama3-70b"), tokens=1e12, seq_len=4096, global_batch=256)
    result = search(job, cluster(64), CAL)
    assert result.tried == len(result.feasible) + sum(result.infeasible.values())
    assert result.feasible, "a 70B model fits on 64 H100s in some layout"
    times = [c.step.step_s for c in result.feasible]
    assert times == sorted(times)
    for candidate in result.feasible:
        assert candidate.memory.total_bytes <= H100.hbm_bytes
        validate_layout(candidate.layout, job.model, 64, 256, 4096)
    # A 70B model's weights, gradients and Adam states (16 bytes/param = 1.1 TB) cannot sit unsharded on one GPU.
    assert result.infeasible["memory"] > 0
    assert all(not (c.layout.tp == 1 and c.layout.pp == 1 and c.layout.sharding == "none") for c in result.feasible)


def test_generator_never_yields_an_impossible_degree_product() -> None:
    job = Job(CATALOG.model("llama3-8b"), tokens=1e12, seq_len=4096, global_batch=64)
    for layout in enumerate_layouts(job, cluster(16), SearchSpace()):
        assert layout.tp * layout.pp * layout.dp * layout.cp == 16
        assert job.model.heads % layout.tp == 0
        assert job.global_batch % layout.dp == 0


def test_fixed_fields_are_respected() -> None:
    job = Job(CATALOG.model("llama3-8b"), tokens=1e12, seq_len=4096, global_batch=64)
    layouts = list(enumerate_layouts(job, cluster(16), SearchSpace(), fixed={"tp": 2, "pp": 2, "recompute": "full"}))
    assert layouts and all(lay.tp == 2 and lay.pp == 2 and lay.recompute == "full" for lay in layouts)


def test_nothing_fits_reports_the_closest_miss() -> None:
    job = Job(CATALOG.model("llama3-405b"), tokens=1e12, seq_len=8192, global_batch=8)
    result = search(job, cluster(8), CAL)
    assert not result.feasible
    assert result.closest_misses
    _, over = result.closest_misses[0]
    assert over > 0
    assert all(over <= other for _, other in result.closest_misses)


def test_a_layout_two_percent_over_hbm_does_not_fit() -> None:
    # plan and validate share one memory rule: nothing over HBM (no tolerance). A GPU 2 % too small for a layout
    # refuses it by exactly the shortfall, and a search pinned to that layout finds nothing.
    job = Job(CATALOG.model("llama3-8b"), tokens=1e12, seq_len=4096, global_batch=64)
    layout = Layout(dp=8, sharding="zero1", micro_batch=1, recompute="full")
    fits = evaluate(job, layout, cluster(8), CAL)
    assert isinstance(fits, Candidate)
    tight_gpu = H100.model_copy(update={"hbm_gib": fits.memory.total_bytes / 1.02 / 2**30})
    tight = Cluster(tight_gpu, CATALOG.node("dgx-h100"), 8, Fabric(CATALOG.network("ndr400")))
    refused = evaluate(job, layout, tight, CAL)
    assert isinstance(refused, Infeasible) and refused.reason == "memory"
    assert refused.over_bytes == pytest.approx(fits.memory.total_bytes * (1 - 1 / 1.02), rel=1e-6)
    fixed = {"tp": 1, "pp": 1, "dp": 8, "cp": 1, "sharding": "zero1", "micro_batch": 1, "recompute": "full",
             "sequence_parallel": False}
    assert search(job, tight, CAL, fixed=fixed).best is None


def test_moe_layouts_try_whole_experts_where_megatron_would_split_them() -> None:
    # Qwen3-30B-A3B on 16 H100, tp 2: where ep divides dp·cp Megatron-Core's default splits each expert over the TP
    # pair (etp = tp), and the search also tries whole experts (etp 1, MoE parallel folding); where ep does not
    # divide dp·cp the default is already etp 1 and there is nothing else to try. Dense models never vary it.
    job = Job(CATALOG.model("qwen3-30b-a3b"), tokens=1e12, seq_len=4096, global_batch=64)
    fixed = {"tp": 2, "pp": 1, "cp": 1, "micro_batch": 1, "recompute": "none", "sharding": "zero1",
             "sequence_parallel": True}
    layouts = list(enumerate_layouts(job, cluster(16), SearchSpace(), fixed=fixed))
    by_ep: dict[int, set[int | None]] = {}
    for layout in layouts:
        by_ep.setdefault(layout.ep, set()).add(layout.expert_tp)
    assert by_ep[8] == {None, 1}  # dp 8: ep 8 divides it
    assert by_ep[16] == {None}  # ep 16 does not divide dp 8: the default is etp 1 already
    dense = Job(CATALOG.model("llama3-8b"), tokens=1e12, seq_len=4096, global_batch=64)
    assert {lay.expert_tp for lay in enumerate_layouts(dense, cluster(16), SearchSpace(), fixed=fixed)} == {None}


def test_a_layout_that_needs_recompute_recomputes_or_offloads_only_the_layers_it_must() -> None:
    # Llama 3.1 8B on 8 H100 (dp 8, ZeRO-1, micro-batch 2) on a GPU whose memory lies between what the layout needs
    # with and without full recompute: the search also offers block recompute of k of the 32 layers, k the fewest
    # that fit (memory falls by one layer's saved activations per recomputed layer), and ranks it above full.
    job = Job(CATALOG.model("llama3-8b"), tokens=1e12, seq_len=4096, global_batch=16)
    layout = Layout(dp=8, sharding="zero1", micro_batch=2)
    def needs(lay: Layout) -> float:
        return peak_stage_memory(job.model, lay, seq_len=4096, global_batch=16, precision="bf16")[1].total_bytes

    hbm_bytes = (needs(layout) + needs(layout.with_(recompute="full"))) / 2  # halfway: about half the layers
    tight = Cluster(H100.model_copy(update={"hbm_gib": hbm_bytes / 2**30}), CATALOG.node("dgx-h100"), 8,
                    Fabric(CATALOG.network("ndr400")))
    fixed = {"tp": 1, "pp": 1, "dp": 8, "cp": 1, "sharding": "zero1", "micro_batch": 2, "sequence_parallel": False}
    found = search(job, tight, CAL, fixed=fixed)
    best = found.best
    assert best is not None and best.layout.recompute == "full" and best.layout.recompute_layers is not None
    assert 14 <= best.layout.recompute_layers <= 18
    assert best.memory.total_bytes <= tight.gpu.hbm_bytes
    fewer = evaluate(job, best.layout.with_(recompute_layers=best.layout.recompute_layers - 1), tight, CAL)
    assert not isinstance(fewer, Candidate)  # the fewest that fit
    whole = next(c for c in found.feasible if c.layout.recompute == "full" and c.layout.recompute_layers is None)
    assert best.step.step_s < whole.step.step_s
    # at pp 1 the search also offers offloading the fewest layers' activations to CPU memory; over this H100's
    # PCIe link the copies show, so block recompute ranks first here
    offload = next(c for c in found.feasible if c.layout.offload_activation_layers is not None)
    assert offload.layout.recompute == "none" and offload.memory.total_bytes <= tight.gpu.hbm_bytes
    count = offload.layout.offload_activation_layers
    assert count is not None and not isinstance(
        evaluate(job, offload.layout.with_(offload_activation_layers=count - 1), tight, CAL), Candidate)
    assert offload.step.parts["offload.activations"].exposed_s > 0
    # a stack without activation offload (PyTorch FSDP2) gets only the block-recompute variant
    no_offload = search(job, tight, CAL, fixed=fixed, space=SearchSpace(activation_offload=False))
    assert all(c.layout.offload_activation_layers is None for c in no_offload.feasible)
    assert no_offload.best is not None and no_offload.best.layout == best.layout
    # a run that says "full" keeps every layer recomputed
    pinned = search(job, tight, CAL, fixed={**fixed, "recompute": "full"})
    assert all(c.layout.recompute_layers is None for c in pinned.feasible)


def test_selective_recompute_is_skipped_where_a_fused_attention_kernel_stores_no_scores() -> None:
    # With flash/cuDNN attention, selective recompute (the attention core again) saves no memory and costs time, so
    # the search does not try it; with an eager kernel it drops the s x s scores and stays in the space. A run that
    # says "selective" keeps it.
    job = Job(CATALOG.model("llama3-8b"), tokens=1e12, seq_len=4096, global_batch=64)
    flash = search(job, cluster(16), CAL)
    assert all(c.layout.recompute != "selective" for c in flash.feasible)
    eager = CAL.model_copy(update={"attention_kernel": "materialized"})
    assert any(c.layout.recompute == "selective" for c in search(job, cluster(16), eager).feasible)
    pinned = search(job, cluster(16), CAL, fixed={"recompute": "selective"})
    assert pinned.feasible and all(c.layout.recompute == "selective" for c in pinned.feasible)


def test_cheaper_variants_at_pp2_are_the_fewest_that_fit_and_never_beat_no_recompute() -> None:
    # Llama 3.1 8B, pp 2, dp 4, ZeRO-3 on a GPU with 35 GiB: the block-recompute variant recomputes the fewest layers
    # of each chunk that fit (one fewer does not), and no variant is faster than its layout without recompute.
    job = Job(CATALOG.model("llama3-8b"), tokens=1e12, seq_len=4096, global_batch=16)
    tight = Cluster(H100.model_copy(update={"hbm_gib": 35.0}), CATALOG.node("dgx-h100"), 8,
                    Fabric(CATALOG.network("ndr400")))
    fixed = {"tp": 1, "pp": 2, "dp": 4, "cp": 1, "vpp": 1, "sharding": "zero3", "micro_batch": 1,
             "sequence_parallel": False}
    found = search(job, tight, CAL, fixed=fixed)
    block = next(c for c in found.feasible if c.layout.recompute_layers is not None)
    count = block.layout.recompute_layers
    assert count is not None and count >= 1
    if count > 1:
        assert not isinstance(evaluate(job, block.layout.with_(recompute_layers=count - 1), tight, CAL), Candidate)
    plain = estimate_step(job, block.layout.with_(recompute="none", recompute_layers=None), tight, CAL)
    assert block.step.step_s >= plain.step_s


def test_offloaded_tensors_must_fit_in_the_nodes_ram() -> None:
    # Llama 3.1 405B at 8K on 2,048 H100s reaches for activation offload (hundreds of GiB per GPU). A node with
    # 256 GiB of RAM can pin at most 0.8 x 256 GiB for its 8 GPUs: such layouts are rejected as "host memory".
    from gpufleet.catalog.judgements import shipped_judgements

    job = Job(CATALOG.model("llama3-405b"), tokens=1e12, seq_len=8192, global_batch=2048)
    small = CATALOG.node("dgx-h100").model_copy(update={"cpu_ram_gib": 256})
    for node in (CATALOG.node("dgx-h100"), small):
        big = Cluster(H100, node, 2048, Fabric(CATALOG.network("ndr400")))
        result = search(job, big, CAL, space=SearchSpace(micro_batches=(1, 2), vpps=(1,), cps=(1, 2)))
        budget = node.cpu_ram_gib * 2**30 * shipped_judgements().host_ram_usable_fraction
        assert all(c.memory.host_bytes * 8 <= budget for c in result.feasible)
        offloading = [c for c in result.feasible if c.layout.offload_activation_layers]
        if node is small:
            assert result.infeasible["host memory"] > 0
        else:
            assert offloading, "with 2 TiB per node the planner does offload activations here"
