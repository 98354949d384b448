"""Hold-out check: Megatron-Bridge performance-table rows that are NOT in the shipped published_runs.yaml.

Rows transcribed from NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md (26.02, 25.11 and 25.09
NeMo containers, DGX-H100 and DGX-B200; the shipped file holds one of them, the 25.11 Qwen3-30B-A3B H100 row).
The tables give model, GPUs, precision, global and micro batch, sequence length, FSDP, TP, PP, CP, VP, EP and
tokens/s/GPU; sharding (except FSDP), sequence parallelism and recompute are not stated, so the planner fills
them, as `gpufleet validate` does for any run with null fields. Architectures come from the catalog. Nothing
in the model is fitted to these rows; the script reports how the model does on them. Run:

    .venv/bin/python scripts/holdout_megatron_bridge.py
"""

from __future__ import annotations

import statistics

from gpufleet.catalog.registry import Catalog, load_catalog
from gpufleet.planner.runs import PublishedRun, RunModel, RunMoE, load_runs
from gpufleet.planner.validate import predict_run

#: system -> (catalog GPU, GPUs per node, scale-out Gb/s per GPU): DGX-H100 and DGX-B200 have 8 x 400G NICs.
SYSTEMS = {"h100": ("h100-sxm", 8, 400.0), "b200": ("b200", 8, 400.0)}
#: The tables' precisions in the run schema: FP8 with current scaling (CS) or MX blocks both run fp8 GEMMs.
PRECISIONS = {"fp8-cs": "fp8", "fp8-mx": "fp8", "mxfp8": "fp8", "bf16": "bf16"}

#: container system model gpus precision gbs mbs seq fsdp tp pp cp vp ep tokens_per_s_per_gpu (vp 1 = n/a)
ROWS = """26.02 h100 llama3-70b 64 fp8-cs 256 1 8192 0 4 8 1 5 1 1621
26.02 h100 llama3-405b 1024 fp8-cs 1536 1 8192 0 8 8 2 8 1 311
26.02 h100 qwen3-30b-a3b 16 fp8-cs 1024 1 4096 0 1 2 1 12 8 5113
26.02 h100 qwen3-235b-a22b 256 fp8-cs 8192 1 4096 0 2 8 1 4 32 1633
26.02 b200 qwen3-30b-a3b 8 mxfp8 512 1 4096 0 1 1 1 1 8 9691
26.02 b200 qwen3-235b-a22b 256 mxfp8 8192 1 4096 0 1 8 1 1 8 3805
25.11 h100 llama3-8b 8 fp8-cs 128 1 8192 8 1 1 1 1 1 14451
25.11 h100 llama3-70b 64 fp8-cs 128 1 8192 0 4 8 1 5 1 1602
25.11 h100 llama3-405b 1024 fp8-cs 512 1 8192 0 8 8 2 8 1 292
25.11 h100 qwen3-235b-a22b 256 fp8-cs 2048 1 4096 0 2 8 1 4 32 1575
25.11 b200 llama3-8b 8 fp8-cs 128 2 8192 0 1 1 1 1 1 30624
25.11 b200 llama3-405b 128 fp8-cs 64 1 8192 0 4 8 2 8 1 661
25.11 b200 qwen3-30b-a3b 8 fp8-mx 512 1 4096 0 1 1 1 1 8 9299
25.11 b200 qwen3-235b-a22b 64 fp8-mx 1024 1 4096 0 1 8 1 2 8 3269
25.09 h100 llama3-8b 8 fp8-cs 128 1 8192 8 1 1 1 1 1 14079
25.09 h100 llama3-70b 64 fp8-cs 128 1 8192 0 4 8 1 5 1 1619
25.09 h100 llama3-405b 1024 fp8-cs 512 1 8192 0 8 8 2 8 1 302
25.09 h100 deepseek-v3 1024 fp8-cs 8192 1 4096 0 2 8 1 4 64 1297
25.09 h100 qwen3-30b-a3b 16 fp8-cs 512 2 4096 0 1 2 1 24 8 10494
25.09 h100 qwen3-235b-a22b 256 fp8-cs 2048 1 4096 0 2 8 1 4 32 1204"""


def _run_model(catalog: Catalog, model_id: str) -> RunModel:
    spec = catalog.model(model_id)
    moe = None
    if spec.moe is not None:
        moe = RunMoE(experts=spec.moe.experts, top_k=spec.moe.top_k, shared_experts=spec.moe.shared_experts,
                     expert_ffn_hidden=spec.moe.expert_ffn_hidden, dense_layers=spec.moe.dense_layers)
    return RunModel(name=spec.name, layers=spec.layers, hidden=spec.hidden, heads=spec.heads, kv_heads=spec.kv_heads,
                    ffn_hidden=spec.ffn_hidden, gated_mlp=spec.gated_mlp, vocab=spec.vocab,
                    tied_embeddings=spec.tied_embeddings, moe=moe)


def holdout_runs(catalog: Catalog) -> list[PublishedRun]:
    """The table rows as runs, with the shipped Megatron-Bridge row (same source) as template."""
    template = next(run for run in load_runs() if run.id.startswith("mbridge-"))
    runs = []
    for line in ROWS.splitlines():
        container, system, model_id, gpus, precision, gbs, mbs, seq, fsdp, tp, pp, cp, vp, ep, tokens = line.split()
        gpu, per_node, scale_out = SYSTEMS[system]
        n, t, p, c = int(gpus), int(tp), int(pp), int(cp)
        layout = template.layout.model_copy(update=dict(
            tp=t, pp=p, cp=c, dp=n // (t * p * c), ep=int(ep), vpp=int(vp), micro_batch=int(mbs),
            sharding="fsdp" if fsdp != "0" else None, sequence_parallel=None, recompute=None))
        runs.append(template.model_copy(update=dict(
            id=f"{container}-{system}-{model_id}-{n}gpu", model=_run_model(catalog, model_id), seq_len=int(seq),
            global_batch=int(gbs), precision=PRECISIONS[precision], layout=layout,
            hardware=template.hardware.model_copy(update=dict(gpu=gpu, num_gpus=n, gpus_per_node=per_node,
                                                              scale_out_gbps_per_gpu=scale_out)),
            target=template.target.model_copy(update=dict(tokens_per_s_per_gpu=float(tokens))))))
    return runs


def main() -> None:
    catalog = load_catalog()
    errors: dict[str, list[float]] = {}
    for run in holdout_runs(catalog):
        prediction = predict_run(run, catalog)
        layout = prediction.layout.short() if prediction.layout else "-"
        if prediction.error is None:
            print(f"{run.id:38s} skipped: {prediction.reason}")
            continue
        kind = "moe" if run.model.moe is not None else "dense"
        errors.setdefault(kind, []).append(prediction.error)
        print(f"{run.id:38s} target {run.target.tokens_per_s_per_gpu:8.0f} predicted "
              f"{prediction.predicted_tokens_per_s_per_gpu or 0:8.0f} error {prediction.error:+6.1%}  {layout}"
              f"  {prediction.note}")
    for kind, values in errors.items():
        print(f"{kind}: {len(values)} rows, median |error| {statistics.median(abs(e) for e in values):.1%}, "
              f"mean {statistics.mean(values):+.1%}")
    every = [e for values in errors.values() for e in values]
    print(f"all: {len(every)} rows, median |error| {statistics.median(abs(e) for e in every):.1%}")


if __name__ == "__main__":
    main()
