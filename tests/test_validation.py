"""The model against measured runs: published-run accuracy and vTrain layout ranking.

Tests named `test_regression_guard_*` pin bounds at the figures measured when they were written
(docs/validation.md): they catch regressions and prove nothing about accuracy. Every run file here is also
a fitting set of the recorded calibration fits (catalog/data/fits.yaml), so their figures are in-sample;
the out-of-sample figures are tests/test_fit.py's leave-one-source-out ones.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
import yaml

from gpufleet.catalog.registry import load_catalog
from gpufleet.errors import GpufleetError
from gpufleet.fabric.collectives import collective_cost
from gpufleet.fabric.placement import group_span
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.parallel.layout import Layout
from gpufleet.perf.step import StepOptions
from gpufleet.planner.published_runs import (
    PublishedRun,
    check_run_stacks,
    fitted_run_paths,
    framework_options,
    load_runs,
    run_calibration,
    run_step_options,
    shipped_runs_path,
)
from gpufleet.planner.ranking import rank_groups, smooth_model_ceiling, spearman
from gpufleet.planner.validate import ErrorStats, RunPrediction, Summary, predict_run, summarize

DATA = Path(__file__).parent / "data"
RUN_FILES = (*fitted_run_paths(), shipped_runs_path("vtrain_runs.yaml"))


def _options(run: PublishedRun, options: StepOptions | None = None) -> StepOptions:
    return run_step_options(run, load_catalog(), options)


def test_spearman_by_hand() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    # d = ranks differ by (0, 0, 1, -1): rho = 1 - 6*2/(4*15) = 0.8
    assert spearman([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(0.8)
    # ties share the mean rank: x ranks (1, 2.5, 2.5, 4), y ranks (1, 3, 2, 4); Pearson of those = 4.5 / sqrt(4.5 * 5)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(3 / math.sqrt(10), rel=1e-12)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))  # a constant side has no order


@pytest.fixture(scope="module")
def published_predictions() -> dict[str, RunPrediction]:
    catalog = load_catalog()
    return {run.id: predict_run(run, catalog) for run in load_runs()}


@pytest.fixture(scope="module")
def published(published_predictions: dict[str, RunPrediction]) -> Summary:
    return summarize(list(published_predictions.values()))


def test_every_published_run_is_predicted_or_skipped_with_a_reason(published: Summary) -> None:
    skipped = published.skipped
    # Only runs whose layout lacks tp, pp or dp (RUNS.md) or whose layout no longer fits are skipped.
    assert len(skipped) <= 4


#: The one high/medium run far outside the issue's 25 % bound (docs/validation.md): Qwen3-30B-A3B on 16 H100 in
#: the 25.11 container, dropless routing. NVIDIA ran it without recompute (Megatron-Bridge v0.2.0
#: set_qwen3_common_configs: recompute_granularity None), which the run now records; the memory model puts that just
#: over 80 GiB and says so (memory_rejected). It ran at half the speed of the same layout with token-drop routing in
#: 25.09.
SMALL_EXPERT_DROPLESS_RUN = "mbridge-2511-qwen3-30b-a3b-fp8cs-16"


def test_regression_guard_published_accuracy(published: Summary,
                                             published_predictions: dict[str, RunPrediction]) -> None:
    # A regression guard (bounds at the figures measured when written, docs/validation.md), in-sample: issue 7's
    # targets high+medium median <= 10 %, all runs median <= 15 %, worst high+medium <= 25 % but for the dropless
    # Qwen3-30B-A3B row.
    high, high_medium, everything = (published.groups[group] for group in ("high", "high+medium", "all"))
    assert high_medium.median_abs_error is not None and high_medium.median_abs_error <= 0.10
    assert everything.median_abs_error is not None and everything.median_abs_error <= 0.15
    assert high.worst_abs_error is not None and high.worst_abs_error <= 0.25
    others = [abs(p.error or 0.0) for run_id, p in published_predictions.items()
              if p.quality in ("high", "medium") and run_id != SMALL_EXPERT_DROPLESS_RUN]
    assert max(others) <= 0.25
    outlier = published_predictions[SMALL_EXPERT_DROPLESS_RUN]
    assert outlier.layout is not None and outlier.layout.recompute == "none" and outlier.layout.sharding == "zero1"
    # (+31 % before the fits were refitted on the runs' own MoE settings, docs/moe.md; +28 % with every layer
    # recomputed; +65 % with the recompute its config records)
    assert outlier.error is not None and 0.2 < outlier.error < 1.1
    # the published layouts the memory model rejects are counted, not hidden by a tolerance
    rejected = ("deepseek-v3-2048xh800", "mpt-30b-a100-8gpu-s2048-bf16", SMALL_EXPERT_DROPLESS_RUN)
    assert published.memory_rejected == rejected
    assert published.as_dict()["memory_rejected"] == {"runs": 3, "ids": list(rejected)}


def test_every_run_names_a_catalog_stack_and_says_how_its_element_wise_ops_ran() -> None:
    catalog = load_catalog()
    for path in RUN_FILES:
        runs = load_runs(path)
        check_run_stacks(runs, catalog, path)
        assert all(run.elementwise in ("fused", "eager") for run in runs), path
    # the stack every `plan --stack` example names is a catalog stack; an unknown name names the nearest
    for name in ("megatron-core", "megatron-bridge", "nemo", "nemo-automodel", "torchtitan", "llm-foundry",
                 "deepseek-v3", "bloom-megatron-deepspeed"):
        catalog.stack(name)
    assert catalog.stack("deepseek-v3").value("ep_dispatch") == "dedup"
    with pytest.raises(GpufleetError, match="megatron-bridge"):
        catalog.stack("megatron")
    bad = load_runs()[0].model_copy(update={"stack": "megatron"})
    with pytest.raises(GpufleetError, match="stack 'megatron' is not a catalog stack"):
        check_run_stacks([bad], catalog)


def test_free_text_changes_nothing_and_a_run_without_a_stack_gets_the_default() -> None:
    # What a run's source, id or notes say is never read: only `stack:` and `elementwise:` choose settings.
    catalog = load_catalog()
    run = next(r for r in load_runs() if r.id == "torchtitan-8b-8gpu-fsdp-eager")
    reworded = run.model_copy(update={"source": "NVIDIA-NeMo/Megatron-Bridge 2021 llm-foundry", "id": "x",
                                      "notes": "not eager"})
    assert _options(reworded) == _options(run)
    assert run_calibration(reworded, catalog, "h100-sxm") == run_calibration(run, catalog, "h100-sxm")
    unnamed = run.model_copy(update={"stack": None, "elementwise": None})
    # Megatron-LM's defaults, fused element-wise kernels, priced with the catalog's judgements
    assert _options(unnamed) == StepOptions(judgements=catalog.judgements())
    prediction = predict_run(unnamed, catalog)
    assert prediction.stack == "megatron-lm" and prediction.stack_defaulted
    assert "stack: megatron-lm (default: the run names none)" in prediction.note


def test_stacks_before_megatrons_async_tp_all_reduce_run_it_in_line() -> None:
    # Megatron-LM 2021 (SC21), BLOOM's and MT-NLG's Megatron-DeepSpeed forks all-reduce the column-parallel input
    # gradient in line; Megatron-Core / Megatron-DeepSpeed since 2022 hide it under the weight-gradient GEMM, and
    # torchtitan's DTensor TP runs it in line.
    runs = {run.id: run for run in load_runs()}
    inline = {run_id: not _options(run).tp_async_backward for run_id, run in runs.items()}
    assert inline["bloom-176b-384gpu"] and inline["mtnlg-530b-2240"] and inline["sc21-t1-145b"]
    assert all(inline[r] for r in runs if r.startswith("torchtitan"))
    assert not any(inline[r] for r in runs if r.startswith(("mcore", "korthikanti", "mpt", "deepseek")))


def test_each_run_gets_the_attention_kernel_its_stack_used() -> None:
    # llm-foundry's benchmark sweep ran attn_impl=triton (FlashAttention-1 in Triton); Megatron-LM 2021
    # (PTD-P), BLOOM and every source that cites nothing after 2022 predate flash attention; the rest
    # keep the calibration's FA2-class kernel, and a user profile that says materialized stays so.
    catalog = load_catalog()
    runs = {run.id: run for run in load_runs()}
    kernel = {run_id: run_calibration(run, catalog, "h100-sxm").attention_kernel for run_id, run in runs.items()}
    assert kernel["mpt-7b-h100-8gpu-s2048-bf16"] == "flash-v1"
    assert kernel["bloom-176b-384gpu"] == "materialized"
    assert {kernel[r] for r in runs if r.startswith("narayanan")} <= {"materialized"}
    assert kernel["deepseek-v3-2048xh800"] == "flash"
    assert all(kernel[r] == "flash" for r in runs if r.startswith("torchtitan"))
    # Transformer Engine stacks (Megatron-Core, Megatron-Bridge) give cuDNN's fused attention preference on Hopper+
    assert all(kernel[r] == "cudnn" for r in runs if r.startswith(("mcore", "mbridge")))
    vtrain_catalog = load_catalog([DATA / "vtrain_cluster.yaml"])
    mpt = runs["mpt-7b-h100-8gpu-s2048-bf16"]
    assert run_calibration(mpt, vtrain_catalog, "a100-sxm-80gb").attention_kernel == "materialized"


def test_megatron_bridge_runs_get_their_recipes_settings() -> None:
    # Megatron-Bridge's performance recipes set ddp.grad_reduce_in_fp32=False (bf16 gradient buffer) and turn
    # on TP communication overlap; its MoE runs record the benchmark's force-balanced routing (moe_settings
    # ep_imbalance 1.0). Other stacks keep gpufleet's Megatron-LM defaults (fp32 main_grad, no TP overlap).
    runs = {run.id: run for run in load_runs()}
    bridge = _options(runs["mbridge-2511-qwen3-30b-a3b-fp8cs-16"], StepOptions(dp_overlap=False))
    assert bridge.memory.grad_dtype == "bf16"
    assert bridge.tp_comm_overlap and bridge.resolved_ep_imbalance == 1.0 and bridge.moe_dropless
    assert bridge.loss_bytes_per_logit == 40.0  # fused cross-entropy; Megatron-LM's default unfused one moves 52
    token_drop = runs["mbridge-2511-qwen3-30b-a3b-fp8cs-16"].model_copy(update={"stack": "megatron-bridge@25.09"})
    assert not _options(token_drop).moe_dropless  # the archive labels 25.09's MoE rows "(tokendrop)"
    assert not bridge.dp_overlap  # the caller's own options are kept
    other = _options(runs["mpt-7b-h100-8gpu-s2048-bf16"])
    # llm-foundry 0.4 on (PyTorch 2.1): only its recompute's early stop differs from the defaults
    assert other == StepOptions(recompute_early_stop="aten", judgements=load_catalog().judgements())
    # NeMo 2's 25.x performance scripts: the same gradient and TP settings and TE's cuDNN attention, default routing
    nemo = runs["mpt-7b-h100-8gpu-s2048-bf16"].model_copy(update={"stack": "nemo@25.04"})
    nemo_options = _options(nemo)
    assert nemo_options.memory.grad_dtype == "bf16" and nemo_options.tp_comm_overlap
    assert nemo_options.resolved_ep_imbalance == StepOptions().resolved_ep_imbalance
    assert run_calibration(nemo, load_catalog(), "h100-sxm").attention_kernel == "cudnn"
    # NeMo named without a release: what every release runs by default (the recipes' fp32 gradient reduction,
    # TP communication in line)
    bare = _options(nemo.model_copy(update={"stack": "nemo"}))
    assert bare.memory.grad_dtype == "fp32" and not bare.tp_comm_overlap


def test_a_stacks_documented_sharding_and_expert_tp_are_not_the_fillers_to_choose() -> None:
    # Megatron-Bridge runs the distributed optimizer (ZeRO-1; FSDP only where a row says so) and its MoE presets set
    # expert_tensor_parallel_size=1; Meta's Llama 3 sharded optimizer states and gradients (ZeRO-2-like).
    catalog = load_catalog()
    runs = {run.id: run for run in load_runs()}
    prediction = predict_run(runs[SMALL_EXPERT_DROPLESS_RUN], catalog)
    assert prediction.layout is not None
    assert prediction.layout.sharding == "zero1" and prediction.layout.expert_tp == 1
    assert "sharding" not in prediction.filled and "recompute" not in prediction.filled  # its config's own
    dense = predict_run(runs["mcore-h100-weak-70b"], catalog)  # Megatron-Core's README, not Bridge: no recipe
    assert dense.layout is not None and dense.layout.expert_tp is None
    meta = load_runs(shipped_runs_path("llama3_fitted.yaml"))[0]
    assert meta.stack is not None and catalog.stack(meta.stack).value("sharding") == "zero2"
    # DeepSeek-V3's report: DualPipe hides the expert all-to-all under another micro-batch's compute, and each token
    # crosses InfiniBand once per destination node (was -50 % with a plain, exposed all-to-all)
    deepseek = _options(runs["deepseek-v3-2048xh800"])
    assert deepseek.ep_comm_overlap and deepseek.ep_dispatch == "dedup"
    predicted = predict_run(runs["deepseek-v3-2048xh800"], catalog)
    assert predicted.step is not None and predicted.error is not None
    assert predicted.step.parts["comm.ep"].hidden_s > predicted.step.parts["comm.ep"].exposed_s
    assert abs(predicted.error) <= 0.15


def test_regression_guard_megatron_bridge_fitted() -> None:
    # A regression guard: 32 rows of Megatron-Bridge's performance archive that are not in the shipped file, filled
    # by plan's own search (no HBM tolerance). Bounds at the figures measured when written (docs/validation.md).
    catalog = load_catalog()
    runs = load_runs(shipped_runs_path("megatron_bridge_fitted.yaml"))
    predictions = {run.id: predict_run(run, catalog) for run in runs}
    assert all(p.status == "ok" for p in predictions.values())
    dense = {run.id: abs(predictions[run.id].error or 0.0) for run in runs if run.model.moe is None}
    assert len(dense) == 17
    assert statistics.median(dense.values()) <= 0.10
    # (0.12 until the Hopper cuDNN refit 0.62 -> 0.61 that came with the chunks window: Llama 3 8B on H100 -12.5 %)
    assert max(error for run_id, error in dense.items() if "gb200" not in run_id) <= 0.13
    # Llama 3 405B on GB200 (tp4 pp16 vpp4, which NVIDIA ran without recompute): the memory model puts it just over
    # 186 GiB, so the fill recomputes one layer per virtual stage, -14 ... -16 %. The vpp8 row: 126 layers over 128
    # chunks put 8 layers on stage 1 and 7 on stage 0; since the fit check sees every stage (it looked only at the
    # first and last), the memory model puts stage 1 at 207 GiB without recompute, so the fill recomputes every
    # layer and is 27 % slow — a memory over-estimate the old check hid; that one row gets its own bound.
    worst_row = "mbridge-2602-gb200-llama3-405b-256gpu"
    assert max(error for run_id, error in dense.items() if run_id != worst_row) <= 0.20
    assert dense[worst_row] <= 0.30
    # Llama 3 70B with FSDP on GB200: NVIDIA offloaded 40 layers' activations to the Grace CPU; so does the fill
    fsdp = predictions["mbridge-2511-gb200-llama3-70b-64gpu"].layout
    assert fsdp is not None and fsdp.recompute == "none" and fsdp.offload_activation_layers is not None
    # whole experts (etp 1, Megatron-Bridge's MoE presets) and the distributed optimizer, as the stack documents
    twin = predictions["mbridge-2509-h100-qwen3-30b-a3b-16gpu"]
    assert twin.layout is not None and twin.layout.sharding == "zero1" and twin.layout.expert_tp == 1
    deepseek = predictions["mbridge-2509-h100-deepseek-v3-1024gpu"]
    assert deepseek.layout is not None and deepseek.layout.expert_tp == 1
    assert deepseek.error is not None and abs(deepseek.error) <= 0.40
    moe = [abs(predictions[run.id].error or 0.0) for run in runs if run.model.moe is not None]
    assert len(moe) == 15
    assert statistics.median(moe) <= 0.25


def test_regression_guard_llama3_405b_fitted() -> None:
    # A regression guard: Meta's Llama 3 405B at 8K on 8,192 and 16,384 H100s (430 and 400 TFLOP/s/GPU), not in the
    # shipped file. The run gives tp, pp, dp and the batch; the stack (llama3-meta) gives ZeRO-2-style sharding; plan's
    # search tries at most 4 virtual stages (Meta's are not published), so the bubble is larger than Meta's.
    catalog = load_catalog()
    for run in load_runs(shipped_runs_path("llama3_fitted.yaml")):
        prediction = predict_run(run, catalog)
        assert prediction.layout is not None and prediction.error is not None
        assert prediction.layout.vpp == 4 and prediction.layout.sharding == "zero2"
        assert "sharding" not in prediction.filled
        assert abs(prediction.error) <= 0.20, (run.id, prediction.error)


@pytest.fixture(scope="module")
def vtrain() -> tuple[list, list]:
    catalog = load_catalog([DATA / "vtrain_cluster.yaml"])
    runs = load_runs(shipped_runs_path("vtrain_runs.yaml"))
    # Megatron-DeepSpeed's pipeline engine reduces gradients after the last micro-batch (no overlap).
    options = StepOptions(dp_overlap=False)
    return runs, [predict_run(run, catalog, options, node_id="vtrain-a100-node") for run in runs]


@pytest.mark.parametrize(("gpus", "measured_s"), [(8, 2_162_300e-9), (4, 1_929_000e-9)])
def test_vtrain_node_all_reduce_matches_vtrain_nccl_tests(gpus: int, measured_s: float) -> None:
    # vTrain's nccl-tests tables from the same A100 cluster (trace/a100/AR_GPU{8,4}_1M_1024M_LUT): a
    # 256 MiB all-reduce inside one node took 2.162 ms on 8 GPUs and 1.929 ms on 4.
    catalog = load_catalog([DATA / "vtrain_cluster.yaml"])
    node = catalog.node("vtrain-a100-node")
    cluster = Cluster(catalog.gpu(node.gpu), node, 8, Fabric(catalog.network(node.default_network)))
    span = group_span(Layout(tp=gpus, dp=8 // gpus), "tp", cluster)
    modelled_s = collective_cost("all-reduce", 2**28, span, cluster).time_s
    assert modelled_s == pytest.approx(measured_s, rel=0.10)


def test_vtrain_absolute_accuracy(vtrain: tuple[list, list]) -> None:
    _, predictions = vtrain
    summary = summarize(predictions).all
    assert summary.runs == 109 and summary.median_abs_error is not None
    # Issue 7 target: median |error| <= 10 %. Measured 6.9 % with the node's measured NVLink all-reduce. vTrain's runs
    # are no fitting set of the recorded fits (they need their own cluster file): out of sample for all four.
    assert summary.median_abs_error <= 0.10


def test_vtrain_ranking(vtrain: tuple[list, list]) -> None:
    runs, predictions = vtrain
    ranking = rank_groups(runs, predictions)
    groups = {row.group.split(" (")[0]: row for row in ranking.groups}
    assert set(groups) == {"GPT 3.6B", "GPT 18.4B", "GPT 39.1B", "GPT 175B"}
    # Issue 7 targets: Spearman >= 0.9 and regret <= 2 % in every group. Met for 3.6B (0.95); 175B 0.85 (its
    # 21 runs span 54-67 s: overlapping the backward TP all-reduce with the weight-gradient GEMM, as Megatron-
    # DeepSpeed does, moved it from 0.92 and 39.1B from 0.65 to 0.73); 18.4B 0.79 (its pick is 4.5 % slower).
    assert groups["GPT 3.6B"].spearman >= 0.9
    assert groups["GPT 175B"].spearman >= 0.8 and groups["GPT 18.4B"].spearman >= 0.75
    assert min(row.spearman for row in groups.values()) >= 0.7
    assert groups["GPT 3.6B"].regret <= 0.02 and groups["GPT 175B"].regret <= 0.02
    # The table names layouts, not run ids: the 3.6B pick is the measured best, tp1 pp1 dp64 mb8.
    assert groups["GPT 3.6B"].pick_layout == groups["GPT 3.6B"].measured_best_layout
    assert groups["GPT 3.6B"].pick_layout.startswith("tp1 pp1 dp64 mb8")
    assert groups["GPT 39.1B"].regret <= 0.02
    assert max(row.regret for row in groups.values()) <= 0.05


def test_smooth_model_ceiling_by_hand() -> None:
    # Four runs of one (tp, pp) sub-group whose tokens/s follow W·(m+pp-1)/m + c·(m+pp-1) exactly: the fit
    # reproduces them, so the ceiling is a perfect 1. Swapping two measurements that no smooth curve orders that
    # way (mb 4 slower than both mb 2 and mb 8) pulls it below 1.
    template = load_runs(DATA.parent.parent / "src/gpufleet/catalog/runs/vtrain_runs.yaml")[0]
    pp, global_batch, dp = 4, 512, 8

    def run(micro_batch: int, tokens_per_s: float) -> PublishedRun:
        layout = template.layout.model_copy(update={"tp": 2, "pp": pp, "dp": dp, "micro_batch": micro_batch,
                                                    "vpp": 1, "cp": 1, "ep": 1})
        target = template.target.model_copy(update={"tokens_per_s_per_gpu": tokens_per_s})
        return template.model_copy(update={"layout": layout, "target": target, "global_batch": global_batch})

    def tokens_per_s(micro_batch: int) -> float:
        m = global_batch / (dp * micro_batch)
        return 1.0 / (10.0 * (m + pp - 1) / m + 0.05 * (m + pp - 1))

    smooth = [run(mb, tokens_per_s(mb)) for mb in (1, 2, 4, 8)]
    assert smooth_model_ceiling(smooth) == pytest.approx(1.0)
    swapped = [run(1, tokens_per_s(1)), run(2, tokens_per_s(4)), run(4, tokens_per_s(2) * 0.9),
               run(8, tokens_per_s(8))]
    assert smooth_model_ceiling(swapped) < 1.0


def test_vtrain_18b_group_is_noisier_than_the_rank_target(vtrain: tuple[list, list]) -> None:
    # Issue 7 asks for Spearman >= 0.9 in every group. In the 18.4B group even a model told each (tp, pp)
    # sub-group's work and per-micro-batch cost, fitted to the measurements themselves, reaches only 0.89:
    # tp4 pp2 runs 10.03 s at mb 2, 10.95 s at mb 4 and 10.86 s at mb 8 (vTrain's ground_truth_multi.csv).
    runs, predictions = vtrain
    groups = {row.group.split(" (")[0]: row for row in rank_groups(runs, predictions).groups}
    assert groups["GPT 18.4B"].smooth_model_ceiling < 0.9
    # ... and that model's pick is more than 2 % slower than the measured best (tp8 pp1 is 9.60 s at mb 8 but
    # 10.45 s at mb 2 and 10.51 s at mb 16), so the regret target asks for the same scatter.
    assert groups["GPT 18.4B"].smooth_model_regret > 0.02
    assert groups["GPT 39.1B"].smooth_model_ceiling > 0.9  # reachable in principle; the model is at 0.65
    assert all(row.spearman <= row.smooth_model_ceiling + 0.05 for row in groups.values())


def test_a_runs_own_expert_tp_wins_over_its_stacks() -> None:
    # gpufleet's run files may state expert_tp (an extension of RUNS.md): DeepSeek-V3 on 1,024 H100 with the experts
    # split over the TP pair instead of Megatron-Bridge's whole experts moves each rank's whole sequence in the
    # all-to-all, and the prediction says so.
    runs = {r.id: r for r in load_runs(shipped_runs_path("megatron_bridge_fitted.yaml"))}
    run = runs["mbridge-2509-h100-deepseek-v3-1024gpu"]
    catalog = load_catalog()
    split = run.model_copy(update={"layout": run.layout.model_copy(update={"expert_tp": 2})})
    whole, halves = predict_run(run, catalog), predict_run(split, catalog)
    assert whole.layout is not None and halves.layout is not None
    assert whole.layout.expert_tp == 1 and halves.layout.expert_tp == 2
    assert whole.step is not None and halves.step is not None
    assert halves.step.parts["comm.ep"].exposed_s > whole.step.parts["comm.ep"].exposed_s


def test_torchtitan_pipeline_runs_get_torchtitan_default_micro_batches() -> None:
    # torchtitan splits a rank's local batch into as many micro-batches as there are pipeline ranks unless told
    # otherwise, and gives interleaved schedules 2 stages per rank: Llama 3.1 405B, global batch 256 over dp 8 and
    # pp 8 -> 8 micro-batches of 256 / 64 = 4 sequences; the run files leave both null.
    runs = {run.id: run for run in load_runs() if run.id.startswith("torchtitan-405b-512gpu-3d")}
    catalog = load_catalog()
    one_f_one_b = predict_run(runs["torchtitan-405b-512gpu-3d-1f1b"], catalog)
    interleaved = predict_run(runs["torchtitan-405b-512gpu-3d-interleaved"], catalog)
    for prediction in (one_f_one_b, interleaved):
        assert prediction.layout is not None and prediction.step is not None
        assert prediction.layout.micro_batch == 4 and prediction.step.micro_batches == 8
        assert "micro_batch" not in prediction.filled
    assert one_f_one_b.layout is not None and one_f_one_b.layout.vpp == 1  # the run says 1F1B
    assert interleaved.layout is not None and interleaved.layout.vpp == 2
    # the bubble: (pp - 1) / vpp stage-times (a stage of the interleaved run also sends twice as many p2p messages)
    assert one_f_one_b.step is not None and interleaved.step is not None
    assert one_f_one_b.step.parts["bubble"].exposed_s == pytest.approx(
        2 * interleaved.step.parts["bubble"].exposed_s, rel=0.01)


def test_a_run_marked_eager_gets_eager_elementwise_kernels() -> None:
    # torchtitan's Dec-2024 tables put "FSDP" (eager) beside "FSDP + torch.compile": same layout, 5,762 against
    # 6,667 tokens/s on 8 GPUs (1.157x) and 5,605 against 6,514 on 128 (1.162x). Only the rows whose run file says
    # `elementwise: eager` lose the fused kernels, and the modelled gap lands within 4 % of the measured one.
    runs = {run.id: run for run in load_runs()}
    eager, compiled = runs["torchtitan-8b-8gpu-fsdp-eager"], runs["torchtitan-8b-8gpu-fsdp-compile"]
    assert eager.elementwise == "eager" and compiled.elementwise == "fused"
    assert not _options(eager).fused_elementwise and _options(compiled).fused_elementwise
    assert not _options(compiled.model_copy(update={"elementwise": "eager"})).fused_elementwise
    catalog = load_catalog()
    eager_prediction, compiled_prediction = predict_run(eager, catalog), predict_run(compiled, catalog)
    assert eager_prediction.eager and "eager element-wise" in eager_prediction.note and not compiled_prediction.eager
    predicted_gap = (compiled_prediction.predicted_tokens_per_s_per_gpu or 0) / (
        eager_prediction.predicted_tokens_per_s_per_gpu or 1)
    assert predicted_gap == pytest.approx(6667 / 5762, rel=0.04)


def test_regression_guard_nemotron4_340b() -> None:
    # Not in the shipped file (in-sample for the recorded fits): Nemotron-4 340B's own training on 6,144 H100 (report
    # Table 2: batch 2304, 8.0 s per step; -3.3 % when written) and NVIDIA's DGXC benchmark on 128 H100 (NeMo 24.11:
    # tp8 pp8 vpp12, 4.77 s). The memory model puts the latter 11 % over 80 GiB without recompute, and at vpp 12 each
    # chunk holds one layer, so block recompute has nothing between none and all: the fill recomputes every layer.
    catalog = load_catalog()
    predictions = {run.id: predict_run(run, catalog) for run in load_runs(shipped_runs_path("nemotron_fitted.yaml"))}
    report = predictions["nemotron4-340b-6144xh100"]
    assert report.error is not None and abs(report.error) <= 0.05
    dgxc = predictions["nemotron4-340b-128xh100-dgxc-2411"]
    assert dgxc.layout is not None and dgxc.layout.recompute == "full" and dgxc.layout.recompute_layers is None
    assert dgxc.error is not None and abs(dgxc.error) <= 0.20


def _fitted_file_summary(name: str) -> ErrorStats:
    """Median and worst |error| over a hold-out file's runs (validate's own summary); every run predicted."""
    predictions = [predict_run(run, load_catalog()) for run in load_runs(shipped_runs_path(name))]
    assert all(p.error is not None for p in predictions)
    return summarize(predictions).all


def test_regression_guard_nemo_2412() -> None:
    # Not in the shipped file (in-sample for the recorded fits): NeMo Framework 24.12's FP8 pre-training table on H100
    # for the 8 rows whose models the catalog has. When written: median 7.5 %, worst -18.5 % (Nemotron-4 340B at
    # vpp 12: the memory model wants recompute, and only full is expressible); -22.7 % since the overlap contention
    # is on by default (its hidden TP and DP collectives slow its compute); -23.3 % since the refit that followed full
    # recompute's early stop (docs/model.md: the global in-training fraction 0.90 -> 0.89); -24.0 % since the refit
    # that no longer depends on its start (0.89 -> 0.88, docs/residuals.md).
    summary = _fitted_file_summary("nemo_2412_fitted.yaml")
    assert summary.runs == 8
    assert summary.median_abs_error <= 0.10
    assert summary.worst_abs_error <= 0.245


def test_regression_guard_nemo_blackwell() -> None:
    # Not in the shipped file, and one of the two sets the Blackwell GEMM fit is fitted on (in-sample): NeMo's FP8
    # tables for DGX-B200 (25.02 container) and DGX-GB200 (25.04), 12 rows. When written: median 6.8 %, worst 13.7 %
    # (25.02 was early software for B200: Llama 3 8B on 8 B200 ran 26,006 tokens/s/GPU there, 30,624 in 25.11).
    summary = _fitted_file_summary("nemo_blackwell_fitted.yaml")
    assert summary.runs == 12
    assert summary.median_abs_error <= 0.12
    assert summary.worst_abs_error <= 0.20


def test_regression_guard_automodel() -> None:
    # Not in the shipped file (in-sample for the recorded fits): NeMo AutoModel (PyTorch FSDP2 + Transformer Engine +
    # DeepEP) on H100 in BF16, a stack the model captures less well. When written: DeepSeek-V3 on 1,024 / 256 H100
    # -11.3 / -34.9 % (with DeepEP's once-per-node dispatch), Qwen3-30B-A3B on 8 -35.0 % (the memory model says even
    # full recompute is 6 GiB over, so it is counted as rejected), Llama 3 70B on 64 +13.7 % (FSDP2 stacks cannot
    # offload activations to CPU memory, so the fill recomputes 36 of 80 layers). Re-recorded when the benchmark
    # gate's routing was counted (docs/moe.md, one node per token): +30.4 / +7.1 %, -3.1 %, +4.4 %.
    catalog = load_catalog()
    runs = load_runs(shipped_runs_path("automodel_fitted.yaml"))
    errors = {run.id: predict_run(run, catalog).error for run in runs}
    assert all(e is not None for e in errors.values())
    assert abs(errors["automodel-h100-deepseek-v3-1024gpu"] or 0.0) <= 0.35
    assert abs(errors["automodel-h100-qwen3-30b-a3b-8gpu"] or 0.0) <= 0.40
    assert max(abs(e or 0.0) for e in errors.values()) <= 0.40
    deepseek = _options(runs[0])
    assert deepseek.ep_dispatch == "dedup" and deepseek.memory.fp32_params
    # FSDP2 stacks cannot keep activations in CPU memory: the fill never offloads
    llama = predict_run(next(run for run in runs if "llama3-70b" in run.id), catalog)
    assert llama.layout is not None and llama.layout.offload_activation_layers is None
    torchtitan = next(run for run in load_runs() if run.id.startswith("torchtitan"))
    assert _options(torchtitan).memory.fp32_params  # FSDP2 keeps fp32 parameters as the master
    assert _options(torchtitan).memory.selective_policy == "op"  # llama3 presets: selective_ac_option = 'op'
    assert _options(torchtitan).loss_bytes_per_logit == 40.0  # PyTorch's cross_entropy on upcast logits
    assert deepseek.memory.selective_policy == "attention"  # Megatron-style unless a recipe says otherwise


def test_a_runs_own_moe_settings_win_over_its_stacks() -> None:
    # Megatron-Bridge's performance configs set the expert all-to-all overlap and the flex dispatcher per model and
    # GPU (26.02: QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2 moe_a2a_overlap=True; the GB200 presets
    # moe_flex_dispatcher_backend='hybridep'), not per stack: a run file says which it ran, with that config as source,
    # and only that run gets it.
    runs = {run.id: run for run in load_runs(shipped_runs_path("megatron_bridge_fitted.yaml"))}
    h100, gb200 = runs["mbridge-2602-h100-qwen3-235b-a22b-256gpu"], runs["mbridge-2602-gb200-qwen3-235b-a22b-256gpu"]
    assert h100.moe_settings is not None and "moe_a2a_overlap=True" in h100.moe_settings.source
    assert _options(h100).ep_comm_overlap and _options(h100).ep_dispatch == "all-to-all"
    assert not _options(gb200).ep_comm_overlap and _options(gb200).ep_dispatch == "dedup"
    bare = h100.model_copy(update={"moe_settings": None})
    assert not _options(bare).ep_comm_overlap  # the stack's setting (Megatron-Bridge: off) without the run's word
    # the overlap hides expert all-to-all time under another micro-batch's compute: the step gets shorter
    catalog = load_catalog()
    overlapped, serial = predict_run(h100, catalog), predict_run(bare, catalog)
    assert overlapped.step is not None and serial.step is not None
    assert overlapped.step.parts["comm.ep"].hidden_s > 0 == serial.step.parts["comm.ep"].hidden_s
    assert overlapped.step.step_s < serial.step.step_s


def test_moe_settings_need_a_source(tmp_path: Path) -> None:
    run = load_runs(shipped_runs_path("megatron_bridge_fitted.yaml"))[0].model_dump()
    run["moe_settings"] = {"ep_overlap": True}
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump([run]))
    with pytest.raises(GpufleetError, match="source"):
        load_runs(path)


def test_a_runs_cuda_graphs_reach_its_step_options(tmp_path: Path) -> None:
    # The Blackwell presets of Megatron-Bridge capture the MoE router and preprocessing in CUDA graphs (26.02
    # QWEN3_30B_A3B_PRETRAIN_CONFIG_B200_FP8_CS_V1: cuda_graph_scope ["moe_router", "moe_preprocess"]); the H100 FP8
    # presets capture nothing. Each run says so in moe_settings, and only that run's host term gets it.
    runs = {run.id: run for run in load_runs(shipped_runs_path("megatron_bridge_fitted.yaml"))}
    b200, h100 = runs["mbridge-2602-b200-qwen3-30b-a3b-8gpu"], runs["mbridge-2602-h100-qwen3-30b-a3b-16gpu"]
    assert _options(b200).moe_cuda_graph_modules == ("moe_router", "moe_preprocess")
    assert _options(h100).moe_cuda_graph_modules == ()
    catalog = load_catalog()
    graphed = predict_run(b200, catalog)
    bare = predict_run(b200.model_copy(update={"moe_settings": None}), catalog)
    assert graphed.step is not None and bare.step is not None
    assert graphed.step.parts["host.moe"].exposed_s < bare.step.parts["host.moe"].exposed_s
    # Megatron-Core captures the preprocessing only together with the router: a run file that lists it alone is
    # refused with one line naming the rule
    run = b200.model_dump()
    run["moe_settings"]["cuda_graph_modules"] = ["moe_preprocess"]
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump([run]))
    with pytest.raises(GpufleetError, match="moe_router"):
        load_runs(path)


def test_a_runs_layer_counts_are_its_layout(tmp_path: Path) -> None:
    # Megatron-Bridge's GB200 Llama 3 70B FP8-CS presets keep 40 layers' activations in CPU memory (v0.2.0
    # LLAMA3_70B_GB200_FP8_CS_BASE_CONFIG, v0.3.0 ..._GB200_FP8_CS_V2: cpu_offloading_num_layers=40): the runs say
    # so, and validate prices that layout, not the search's own fill; the memory model thinks it does not fit, and
    # the row says so rather than choosing another count
    catalog = load_catalog()
    runs = {run.id: run for run in load_runs(shipped_runs_path("megatron_bridge_fitted.yaml"))}
    for run_id in ("mbridge-2511-gb200-llama3-70b-64gpu", "mbridge-2602-gb200-llama3-70b-64gpu-fp8-cs"):
        run = runs[run_id]
        assert run.layout.offload_activation_layers == 40 and run.layout.recompute == "none"
        prediction = predict_run(run, catalog)
        assert prediction.layout is not None and prediction.layout.offload_activation_layers == 40
        assert prediction.memory_rejected and "published layout" in (prediction.reason or "")
    # block recompute of some layers is full recompute of those layers: a run that gives only the count gets
    # recompute full; the step recomputes 5 of the stage's 32 layers, between none and all
    base = runs["mbridge-2511-h100-llama3-8b-8gpu"]
    steps = {}
    for recompute, count in (("none", None), ("full", None), (None, 5)):
        layout = base.layout.model_copy(update={"recompute": recompute, "recompute_layers": count})
        prediction = predict_run(base.model_copy(update={"layout": layout}), catalog)
        assert prediction.step is not None and prediction.layout is not None
        steps[count or recompute] = prediction.step.step_s
    assert prediction.layout.recompute == "full" and prediction.layout.recompute_layers == 5
    assert steps["none"] < steps[5] < steps["full"]
    # a count with another recompute mode is refused with one line
    row = base.model_dump()
    row["layout"].update(recompute="selective", recompute_layers=5)
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump([row]))
    with pytest.raises(GpufleetError, match="recompute must be full"):
        load_runs(path)


def test_automodel_attention_is_transformer_engines_cudnn() -> None:
    # AutoModel's benchmark configs set backend.attn: te, and Transformer Engine prefers its cuDNN FusedAttention on
    # Hopper: the runs are priced with the cuDNN fraction, like Megatron-Bridge's
    catalog = load_catalog()
    for run in load_runs(shipped_runs_path("automodel_fitted.yaml")):
        assert predict_run(run, catalog).attention_kernel == "cudnn"


def test_automodel_benchmarks_route_through_a_balanced_gate() -> None:
    # NeMo AutoModel's benchmark configs set backend.fake_balanced_gate: true: no expert-parallel straggler. The
    # runs say so; the stack does not, so a plan with --stack nemo-automodel keeps the judged imbalance.
    run = load_runs(shipped_runs_path("automodel_fitted.yaml"))[0]
    assert run.stack == "nemo-automodel" and _options(run).resolved_ep_imbalance == 1.0
    assert (framework_options(load_catalog().stack("nemo-automodel")).resolved_ep_imbalance
            == StepOptions().resolved_ep_imbalance)


def test_balanced_routing_is_recorded_on_every_benchmark_moe_run() -> None:
    # Every MoE run of a stack whose benchmarks balance the routing by force (Megatron-Bridge's
    # moe_router_force_load_balancing or token drop at capacity 1.0; AutoModel's FakeBalancedGate) records it.
    runs = [run for path in fitted_run_paths() for run in load_runs(path)]
    runs += load_runs(shipped_runs_path("megatron_bridge_2604_holdout.yaml"))
    benchmark = [run for run in runs if run.model.moe is not None
                 and (run.stack or "").startswith(("megatron-bridge", "nemo-automodel"))]
    assert len(benchmark) == 26
    for run in benchmark:
        assert _options(run).resolved_ep_imbalance == 1.0, run.id


def test_automodel_experts_are_one_grouped_gemm_and_megatron_bridge_experts_are_per_expert() -> None:
    # AutoModel's DeepEP experts run grouped_gemm's gmm over all local experts; Megatron-Core's TEGroupedMLP
    # (--moe-grouped-gemm) launches each local expert's GEMMs on its own streams: the host cost of a MoE layer grows
    # with the local experts only for the second
    automodel = [run for run in load_runs(shipped_runs_path("automodel_fitted.yaml")) if run.model.moe is not None]
    bridge = [run for run in load_runs(shipped_runs_path("megatron_bridge_fitted.yaml")) if run.model.moe is not None]
    assert automodel and bridge
    assert {_options(run).moe_expert_kernels for run in automodel} == {"grouped"}
    assert {_options(run).moe_expert_kernels for run in bridge} == {"per-expert"}


def test_regression_guard_megatron_bridge_2604_moe_holdout() -> None:
    # Held out (in no fit's set): the seven MoE rows of Megatron-Bridge's 26.04 container whose models the catalog has,
    # added after the MoE run settings were fitted (docs/moe.md). When first scored: H100 Qwen3-30B-A3B and 235B-A22B
    # -1.0 / +2.0 % (-29.3 / -24.8 % without the runs' moe_settings: the overlap and the once-per-destination dispatch
    # are what closes them); the Blackwell rows (MXFP8, HybridEP, CUDA graphs) -11.5 ... -20.5 %, median 14.1 %;
    # with the runs' CUDA-graphed router and preprocessing recorded, -9.2 ... -14.0 %, median 10.4 %. After the refit
    # that followed full recompute's early stop (in-training fraction 0.90 -> 0.89): H100 +1.5 / -5.0 %, Blackwell
    # -9.3 ... -14.1 %, median 10.5 %.
    catalog = load_catalog()
    runs = load_runs(shipped_runs_path("megatron_bridge_2604_holdout.yaml"))
    assert shipped_runs_path("megatron_bridge_2604_holdout.yaml") not in fitted_run_paths()
    errors = {run.id: predict_run(run, catalog).error for run in runs}
    assert len(errors) == 7 and all(error is not None for error in errors.values())
    h100 = [abs(error or 0.0) for run_id, error in errors.items() if "-h100-" in run_id]
    assert len(h100) == 2 and max(h100) <= 0.06
    assert statistics.median(abs(error or 0.0) for error in errors.values()) <= 0.16
    assert max(abs(error or 0.0) for error in errors.values()) <= 0.25
