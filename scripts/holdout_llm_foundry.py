"""Hold-out check: llm-foundry MPT benchmark rows that are NOT in the shipped published_runs.yaml.

Rows transcribed from mosaicml/llm-foundry scripts/train/benchmarking/README.md (tables 'H100 80GB BF16'
and 'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'): model, seq len, GPUs, micro-batch, grad
accumulation, global batch (sequences), activation checkpointing, tokens/s/GPU. Each row is predicted
like a shipped run (the shipped MPT row of the same GPU as template, FSDP over all GPUs). Nothing in the
model is fitted to these rows; the script reports how the model does on them. Run:

    .venv/bin/python scripts/holdout_llm_foundry.py
"""

from __future__ import annotations

import statistics

from gpufleet.catalog.registry import load_catalog
from gpufleet.planner.published_runs import PublishedRun, load_runs
from gpufleet.planner.validate import predict_run

#: size seq gpus micro_batch grad_accum global_batch act_ckpt(T/F) tokens_per_s_per_gpu
H100_BF16 = """70b 2048 64 8 4 2048 T 1039
70b 2048 32 2 16 1024 T 882
30b 8192 8 1 21 168 T 1384
30b 4096 8 1 21 168 T 1802
30b 2048 32 14 3 1344 T 2308
30b 2048 16 10 3 480 T 2263
30b 2048 8 3 21 504 T 2002
30b 1024 8 6 21 1008 T 2084
13b 32768 8 1 3 24 T 1976
13b 16384 8 3 3 72 T 2985
13b 4096 8 10 3 240 T 4717
13b 2048 64 2 1 128 F 4800
13b 2048 32 2 1 64 F 4811
13b 2048 16 2 1 32 F 4767
13b 2048 8 2 1 16 F 4792
13b 1024 8 40 3 960 T 5502
7b 65536 8 1 2 16 T 1956
7b 32768 8 2 2 32 T 3318
7b 8192 8 8 2 128 T 6935
7b 4096 8 16 2 256 T 8611
7b 2048 8 6 1 48 F 10643
7b 1024 8 64 2 1024 T 10203
3b 65536 8 1 2 16 T 3262
3b 32768 8 3 6 144 T 5873
3b 16384 8 1 6 48 F 11152
3b 8192 8 3 6 144 F 16578
3b 4096 8 5 6 240 F 20964
3b 2048 64 6 3 1152 F 22525
3b 2048 32 6 3 576 F 23021
3b 2048 16 10 3 480 F 24142
3b 1024 8 20 6 960 F 27046
3b 512 8 40 6 1920 F 27965
1b 65536 8 1 2 16 T 5506
1b 32768 8 1 4 32 F 12025
1b 16384 8 2 4 64 F 19649
1b 8192 8 3 4 96 F 29157
1b 4096 8 7 4 224 F 38535
1b 2048 64 20 1 1280 F 44402
1b 2048 32 20 1 640 F 45130
1b 2048 16 20 1 320 F 46037
1b 2048 8 14 1 112 F 45455
1b 1024 8 18 4 576 F 48910
1b 512 8 56 4 1792 F 52275"""
A100_80GB = """13b 32768 8 1 3 24 T 1016
13b 8192 8 5 3 120 T 1795
13b 4096 8 10 3 240 T 2060
13b 2048 8 2 3 48 F 2262
13b 1024 8 40 3 960 T 2330
7b 65536 8 1 2 16 T 1013
7b 32768 8 2 2 32 T 1672
7b 16384 8 4 2 64 T 2453
7b 8192 8 8 2 128 T 3206
7b 4096 8 16 2 256 T 3684
7b 2048 8 6 2 96 F 4641
7b 1024 8 64 2 1024 T 4357
3b 65536 8 1 2 16 T 1767
3b 32768 8 3 6 144 T 3029
3b 16384 8 1 6 48 F 5529
3b 8192 8 3 6 144 F 7695
3b 4096 8 5 6 240 F 9457
3b 2048 8 10 2 160 F 10811
3b 1024 8 20 6 960 F 11580
3b 512 8 40 6 1920 F 12127
1b 65536 8 1 2 16 T 3044
1b 32768 8 1 4 32 F 6275
1b 16384 8 2 4 64 F 9956
1b 8192 8 3 4 96 F 13814
1b 4096 8 7 4 224 F 17807
1b 2048 8 14 4 448 F 20513
1b 1024 8 18 4 576 F 22112
1b 512 8 56 4 1792 F 23148"""


def holdout_runs(table: str, template: PublishedRun, arch: dict[str, object], prefix: str,
                 shipped: set[tuple[str, int, int, int]]) -> list[PublishedRun]:
    runs = []
    for line in table.splitlines():
        size, seq, gpus, micro_batch, _accum, global_batch, ckpt, tokens = line.split()
        key = (size, int(seq), int(gpus), int(micro_batch))
        if size not in arch or key in shipped:
            continue
        runs.append(template.model_copy(update={
            "id": f"{prefix}-mpt-{size}-s{seq}-{gpus}gpu-mb{micro_batch}",
            "model": arch[size], "seq_len": int(seq), "global_batch": int(global_batch),
            "hardware": template.hardware.model_copy(update={"num_gpus": int(gpus)}),
            "layout": template.layout.model_copy(update={
                "dp": int(gpus), "micro_batch": int(micro_batch), "recompute": "full" if ckpt == "T" else "none"}),
            "target": template.target.model_copy(update={"tokens_per_s_per_gpu": float(tokens)}),
        }))
    return runs


def main() -> None:
    catalog = load_catalog()
    shipped_runs = {run.id: run for run in load_runs()}
    mpt = [run for run in shipped_runs.values() if run.id.startswith("mpt-")]
    arch = {run.model.name.lower().removeprefix("mpt-"): run.model for run in mpt}
    shipped = {(run.model.name.lower().removeprefix("mpt-"), run.seq_len, run.hardware.num_gpus,
                run.layout.micro_batch or 0) for run in mpt}
    for name, table, template in (
            ("H100 BF16", H100_BF16, shipped_runs["mpt-7b-h100-8gpu-s2048-bf16"]),
            ("A100 80GB", A100_80GB, shipped_runs["mpt-7b-a100-8gpu-s2048-bf16"])):
        errors = []
        for run in holdout_runs(table, template, arch, name.split()[0].lower(), shipped):
            prediction = predict_run(run, catalog)
            if prediction.error is None:
                continue
            errors.append(prediction.error)
            print(f"{run.id:40s} predicted {prediction.predicted_tokens_per_s_per_gpu:9.0f} "
                  f"target {run.target.tokens_per_s_per_gpu:9.0f} error {prediction.error:+.1%}")
        print(f"{name}: {len(errors)} hold-out rows, median |error| "
              f"{statistics.median(abs(e) for e in errors):.1%}, mean error {statistics.mean(errors):+.1%}, "
              f"worst {max(errors, key=abs):+.1%}\n")


if __name__ == "__main__":
    main()
