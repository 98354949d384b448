"""Regenerate the figures of docs/two-sites.md: seed 000's two clusters over a 200 Gb/s WAN, planned.

Run: PYTHONPATH=src .venv/bin/python scripts/two_sites.py  (a few minutes on two cores: about a dozen searches)
It prints the Markdown tables the document quotes.
"""

from __future__ import annotations

from dataclasses import replace

from gpufleet.catalog.registry import load_catalog
from gpufleet.fabric.wan import WanLink
from gpufleet.parallel.layout import Layout
from gpufleet.parallel.memory import MemoryAssumptions
from gpufleet.perf.step import StepOptions, estimate_step
from gpufleet.perf.wan import pp_across_sites, with_wan
from gpufleet.planner.plan import PlanRequest, build_cluster, build_job
from gpufleet.planner.published_runs import stack_calibration
from gpufleet.planner.search import Candidate, evaluate, search
from gpufleet.planner.sites import search_sites

#: Seed 000's setup: two clusters of 1,024 H100s (128 nodes each), 200 Gb/s between them, under 5 ms; its
#: DeepSpeed template's train_batch_size 4096 (sequences of 4,096 tokens); a 70B dense model, the one
#: docs/fabric-study.md assumed (the seed does not name it).
REQUEST = PlanRequest(model="llama3-70b", tokens=15e12, gpu="h100-sxm", gpus=2048, global_batch=4096)
LINK = WanLink(gbps=200, latency_s=5e-3)
#: The seed's own layout: tensor parallel 8, pipeline 2 (one stage per cluster), the rest data parallel.
SEED_LAYOUT = Layout(tp=8, pp=2, dp=128, sequence_parallel=True, micro_batch=1, sharding="zero1", recompute="full")


def row(label: str, candidate: Candidate, single_s: float) -> str:
    step = candidate.step
    wan = step.parts.get("comm.wan")
    exposed = f"{wan.exposed_s:.2f} s" if wan else "-"
    hidden = f"{wan.hidden_s:.2f} s" if wan else "-"
    return (f"| {label} | {candidate.layout.short()} | {step.step_s:.2f} s | {step.step_s / single_s:.2f}x | "
            f"{exposed} | {hidden} | {step.mfu:.1%} |")


def main() -> None:
    catalog = load_catalog()
    cluster, job = build_cluster(REQUEST, catalog), build_job(REQUEST, catalog)
    calibration = stack_calibration(catalog.calibration(cluster.gpu.id), None)
    single = search(job, cluster, calibration).feasible[0]
    single_s = single.step.step_s
    dp = search_sites(job, cluster, calibration, sites=2, link=LINK, across=("dp",)).feasible[0]
    pp = search_sites(job, cluster, calibration, sites=2, link=LINK, across=("pp",)).feasible[0]
    fitted = evaluate(job, SEED_LAYOUT, cluster, calibration)
    if not isinstance(fitted, Candidate):
        raise SystemExit(f"the seed's layout does not fit: {fitted}")
    seed = replace(fitted, step=with_wan(fitted.step, pp_across_sites(fitted.step, job, SEED_LAYOUT, cluster, LINK, 2),
                                         tokens_per_step=fitted.step.tokens_per_step, gpus=cluster.gpus))
    print("| plan | layout | step | vs one site | WAN exposed | WAN hidden | MFU |")
    print("|---|---|---|---|---|---|---|")
    print(row("one site of 2,048 GPUs", single, single_s))
    print(row("two sites, best DP across", dp, single_s))
    print(row("two sites, best PP across", pp, single_s))
    print(row("two sites, the seed's tp8 pp2 (PP across)", seed, single_s))
    for name, candidate in (("DP", dp), ("PP", pp), ("seed", seed)):
        print(f"{name}: {candidate.step.parts['comm.wan'].link}")
    pp_alone = estimate_step(job, pp.layout, cluster, calibration)
    busy_s = pp_across_sites(pp_alone, job, pp.layout, cluster, LINK, 2).total_s
    print(f"PP across, if the pipeline hid its hops: at least max(link busy {busy_s:.2f} s, step without the WAN "
          f"{pp_alone.step_s:.2f} s)")
    bf16 = StepOptions(memory=MemoryAssumptions(grad_dtype="bf16"))
    half = search_sites(job, cluster, calibration, sites=2, link=LINK, options=bf16, across=("dp",)).feasible[0]
    single_bf16 = search(job, cluster, calibration, options=bf16).feasible[0]
    print(row("one site, gradients reduced in bf16", single_bf16, single_s))
    print(row("two sites, DP across, gradients reduced in bf16", half, single_s))
    print(f"bf16: {half.step.parts['comm.wan'].link}")
    print()
    print("| link Gb/s | best two-site step | vs one site | arrangement | WAN exposed |")
    print("|---|---|---|---|---|")
    for gbps in (200, 400, 800, 1600, 3200, 6400):
        best = search_sites(job, cluster, calibration, sites=2, link=replace(LINK, gbps=gbps)).feasible[0]
        wan = best.step.parts["comm.wan"]
        print(f"| {gbps:,} | {best.step.step_s:.2f} s | {best.step.step_s / single_s:.2f}x | "
              f"{wan.link.split(' (')[0]} ({best.layout.short()}) | {wan.exposed_s:.2f} s |")


if __name__ == "__main__":
    main()
