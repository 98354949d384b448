"""The layout search alone, in one process: Llama 3.1 405B on 16,384 H100s (seq 8192, global batch 2048) and
DeepSeek-V3 on 2,048 H800s (fp8, the default batch).

Prints the CPU time of each search as `plan` runs it (keeping the 20 fastest) and the layouts checked per second;
benchmarks/bench_cli.py times whole processes against issue 22's targets.
Run: .venv/bin/python benchmarks/bench_search.py
"""

from __future__ import annotations

import time

from gpufleet.catalog.registry import load_catalog
from gpufleet.planner.plan import PlanRequest, build_cluster, build_job
from gpufleet.planner.search import search

#: (model, GPU, GPUs, precision, global batch) of the searches timed (issue 22's two plan targets)
CASES = (("llama3-405b", "h100-sxm", 16384, "bf16", 2048), ("deepseek-v3", "h800-sxm", 2048, "fp8", None))
#: what `plan` keeps of a search: the fastest max(4 x --top, 20) layouts (planner.plan.make_plan)
KEEP = 20


def main() -> None:
    catalog = load_catalog()
    for model, gpu, gpus, precision, batch in CASES:
        request = PlanRequest(model=model, tokens=15e12, gpu=gpu, gpus=gpus, seq_len=8192 if batch else 4096,
                              global_batch=batch, precision=precision)
        job = build_job(request, catalog)
        calibration = catalog.calibration(gpu)
        runs = []
        for _ in range(3):
            cluster = build_cluster(request, catalog)  # a fresh cluster: nothing remembered from the last run
            started = time.process_time()
            result = search(job, cluster, calibration, options=request.options, keep=KEEP)
            runs.append(time.process_time() - started)
        best = min(runs)
        assert result.best is not None
        print(f"{model} on {gpus} x {gpu}: layouts tried {result.tried}, fit {result.fit}, "
              f"infeasible {dict(result.infeasible)}")
        print(f"  best: {result.best.layout.short()}  step {result.best.step.step_s:.2f} s  "
              f"MFU {result.best.step.mfu:.1%}")
        print(f"  search CPU time: {best:.2f} s (best of 3; runs {', '.join(f'{r:.2f}' for r in runs)}), "
              f"{result.tried / best:,.0f} layouts per second")


if __name__ == "__main__":
    main()
