"""What `plan --html` adds to a plan: the report's extra numbers, the HTML, the write; and the file's size.

Cases: Llama 3.1 8B on 64 H100s and Llama 3.1 70B on 1,024 H100s, 5 plans each (`--top 5`). The time measured
is everything --html does after the plan exists (plan_figures: memory of every stage, the nearby-count scaling
estimates, cost and goodput curves; rendering; the atomic write), best of 5. Targets (issue 20): <= 0.5 s
added to the plan, < 1 MB for 5 plans.
Run: .venv/bin/python benchmarks/bench_report.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from gpufleet.catalog.registry import load_catalog
from gpufleet.planner.plan import PlanRequest, make_plan
from gpufleet.report.plan_figures import plan_figures
from gpufleet.report.plan_html import write_plan_report

CASES = (PlanRequest(model="llama3-8b", tokens=1e12, gpus=64, top=5),
         PlanRequest(model="llama3-70b", tokens=15e12, gpus=1024, top=5))
REPEATS = 5


def main() -> None:
    catalog = load_catalog()
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "plan.html"
        for request in CASES:
            started = time.perf_counter()
            result = make_plan(request, catalog)
            plan_s = time.perf_counter() - started
            runs = []
            for _ in range(REPEATS):
                started = time.perf_counter()
                write_plan_report(target, plan_figures(result, catalog), "benchmark")
                runs.append(time.perf_counter() - started)
            size = target.stat().st_size
            print(f"{request.model} on {request.gpus} GPUs, {len(result.plans)} plans: plan {plan_s:.2f} s; "
                  f"report adds {min(runs):.3f} s (best of {REPEATS}; runs {', '.join(f'{r:.3f}' for r in runs)}); "
                  f"file {size / 1e6:.3f} MB ({size:,} bytes)")


if __name__ == "__main__":
    main()
