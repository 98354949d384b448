"""Training over several sites joined by a WAN: the request's site fields, checked up front, and the search.

The cluster's GPUs split evenly over the sites. A plan runs data or pipeline parallelism across them (TP, CP and
EP stay inside a site); the search tries both (perf/wan.py prices each):

* DP across: the layout search of one site (its share of the GPUs and of the batch), each fitting layout then
  paying the cross-site gradient all-reduce;
* PP across: the layout search of all the GPUs, keeping the layouts whose pp is a multiple of the site count
  (each site holds pp / sites consecutive stages), each paying its stage-boundary hops over the WAN.

A layout that can run either way is kept once, in its faster arrangement (`comm.wan` names which).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.errors import InputError
from gpufleet.fabric.topology import Cluster
from gpufleet.fabric.wan import WanLink
from gpufleet.parallel.layout import Layout, expert_parallel_degrees
from gpufleet.perf.step import StepOptions
from gpufleet.perf.wan import Across, dp_across_sites, pp_across_sites, with_wan
from gpufleet.planner.search import Candidate, ClosestMiss, SearchResult, SearchSpace, search
from gpufleet.units import parse_latency_s
from gpufleet.workload.job import Job

if TYPE_CHECKING:
    from gpufleet.planner.plan import PlanRequest

#: The most sites `plan --sites` takes. Judgement: the search costs the same at any count (one search per
#: arrangement), but the link model (sites on a ring of point-to-point links, perf/wan.py) stops being a fair
#: picture of how more sites would be joined.
MAX_SITES = 8


def check_sites(sites: int, wan_gbps: float | None, wan_latency_s: float | None, gpus: Sequence[int],
                fabric_model: str = "analytical") -> None:
    """Refuse, in one line, a site count out of range, a link without sites or sites without a link, a GPU
    count that does not split evenly, or a fabric model that cannot see the WAN."""
    if not 1 <= sites <= MAX_SITES:
        raise InputError(f"--sites {sites} is out of range: the planner models 1 to {MAX_SITES} sites "
                         f"(at most {MAX_SITES})")
    given = [flag for flag, value in (("--wan-gbps", wan_gbps), ("--wan-latency", wan_latency_s))
             if value is not None]
    if sites == 1:
        if given:
            verb, them = ("describe", "them") if len(given) > 1 else ("describes", "it")
            raise InputError(f"{' and '.join(given)} {verb} the link between sites: give {them} with --sites 2 "
                             "or more")
        return
    if wan_gbps is None or wan_latency_s is None:
        missing = [flag for flag in ("--wan-gbps", "--wan-latency") if flag not in given]
        raise InputError(f"--sites {sites} needs the link between the sites: {' and '.join(missing)} "
                         "(e.g. --wan-gbps 200 --wan-latency 5ms: Gb/s each way, one-way latency)")
    WanLink(wan_gbps, wan_latency_s)  # positive, finite
    uneven = next((count for count in gpus if count % sites), None)
    if uneven is not None:
        nearest = " or ".join(str(count) for count in (uneven // sites * sites, (uneven // sites + 1) * sites)
                              if count > 0)
        raise InputError(f"--gpus {uneven} does not split evenly over {sites} sites: give a multiple of {sites} "
                         f"(e.g. {nearest})")
    if fabric_model != "analytical":
        raise InputError(f"--fabric-model {fabric_model} does not model the WAN between sites; plan --sites with "
                         "the analytical model")


def sites_fields(sites: int | None, wan_gbps: float | None, wan_latency: str | None, gpus: Sequence[int],
                 fabric_model: str = "analytical") -> dict[str, Any]:
    """PlanRequest's site fields from `plan --sites N --wan-gbps G --wan-latency L` (L with a unit: 5ms)."""
    count = 1 if sites is None else sites
    latency_s = parse_latency_s(wan_latency, "--wan-latency") if wan_latency is not None else None
    if wan_gbps is not None and not (math.isfinite(wan_gbps) and wan_gbps > 0):
        raise InputError(f"--wan-gbps must be a positive number of Gb/s each way, got {wan_gbps:g}")
    check_sites(count, wan_gbps, latency_s, gpus, fabric_model)
    return {"sites": count, "wan_gbps": wan_gbps, "wan_latency_s": latency_s}


def _whole_layout(site_layout: Layout, sites: int, job: Job) -> Layout:
    """The layout over all sites of one site's DP-across layout (its expert-TP degree pinned, since the default
    rule reads dp)."""
    pinned = expert_parallel_degrees(site_layout)[0] if job.model.moe is not None else site_layout.expert_tp
    return site_layout.with_(dp=site_layout.dp * sites, expert_tp=pinned)


def _dp_across(job: Job, cluster: Cluster, calibration: CalibrationProfile, sites: int, link: WanLink,
               space: SearchSpace, options: StepOptions,
               progress: Callable[[int], None] | None) -> tuple[list[Candidate], SearchResult]:
    """Each site's layouts with 1/sites of the GPUs and of the batch, plus the cross-site all-reduce."""
    if job.global_batch % sites:
        reasons = Counter({f"DP across: the batch of {job.global_batch} does not split over {sites} sites": 1})
        return [], SearchResult([], 0, reasons)
    try:
        site = Cluster(cluster.gpu, cluster.node, cluster.gpus // sites, cluster.fabric,
                       scale_up_step_latency_s=cluster.scale_up_step_latency_s)
    except InputError as error:
        raise InputError(f"one site of {cluster.gpus // sites} GPUs: {error}") from error
    site_job = replace(job, global_batch=job.global_batch // sites)
    found = search(site_job, site, calibration, space=space, options=options, progress=progress)
    candidates = []
    for candidate in found.feasible:
        share = dp_across_sites(candidate.step, job, candidate.layout, site, link, sites, options)
        step = with_wan(candidate.step, share, tokens_per_step=job.tokens_per_step, gpus=cluster.gpus)
        candidates.append(Candidate(_whole_layout(candidate.layout, sites, job), candidate.peak_stage,
                                    candidate.memory, step))
    misses = [ClosestMiss(_whole_layout(miss.layout, sites, job), miss.over_bytes) for miss in found.closest_misses]
    return candidates, SearchResult([], found.tried, found.infeasible, misses)


def _pp_across(job: Job, cluster: Cluster, calibration: CalibrationProfile, sites: int, link: WanLink,
               space: SearchSpace, options: StepOptions,
               progress: Callable[[int], None] | None) -> tuple[list[Candidate], SearchResult]:
    """Layouts of all the GPUs whose stages split evenly over the sites, plus their WAN hops."""
    found = search(job, cluster, calibration, space=space, options=options, progress=progress)
    candidates = []
    uneven = 0
    for candidate in found.feasible:
        if candidate.layout.pp % sites:
            uneven += 1
            continue
        share = pp_across_sites(candidate.step, job, candidate.layout, cluster, link, sites)
        step = with_wan(candidate.step, share, tokens_per_step=candidate.step.tokens_per_step, gpus=cluster.gpus)
        candidates.append(replace(candidate, step=step))
    reasons = found.infeasible.copy()
    if uneven:
        reasons[f"PP across: pp not a multiple of {sites} sites"] += uneven
    return candidates, SearchResult([], found.tried, reasons, list(found.closest_misses))


def search_sites(job: Job, cluster: Cluster, calibration: CalibrationProfile, *, sites: int, link: WanLink,
                 space: SearchSpace | None = None, options: StepOptions | None = None,
                 progress: Callable[[int], None] | None = None,
                 across: tuple[Across, ...] = ("dp", "pp")) -> SearchResult:
    """Every layout that runs data or pipeline parallelism (`across`: both by default) across `sites` sites of
    `cluster.gpus / sites` GPUs, ranked by step time with the WAN priced (fastest first); a layout that runs both
    ways is kept in its faster."""
    if sites < 2 or cluster.gpus % sites:
        raise InputError(f"{cluster.gpus} GPUs do not split over {sites} sites (need 2 or more, evenly)")
    space = space or SearchSpace()
    options = options or StepOptions()
    none: tuple[list[Candidate], SearchResult] = ([], SearchResult([], 0))
    dp_candidates, dp_found = (_dp_across(job, cluster, calibration, sites, link, space, options, progress)
                               if "dp" in across else none)
    pp_candidates, pp_found = (_pp_across(job, cluster, calibration, sites, link, space, options, progress)
                               if "pp" in across else none)
    fastest: dict[Layout, Candidate] = {}
    for candidate in dp_candidates + pp_candidates:
        kept = fastest.get(candidate.layout)
        if kept is None or candidate.step.step_s < kept.step.step_s:
            fastest[candidate.layout] = candidate
    feasible = sorted(fastest.values(), key=lambda c: c.step.step_s)
    misses = sorted(dp_found.closest_misses + pp_found.closest_misses, key=lambda miss: miss.over_bytes)[:5]
    return SearchResult(feasible, dp_found.tried + pp_found.tried, dp_found.infeasible + pp_found.infeasible,
                        misses)


def search_request_sites(request: PlanRequest, job: Job, cluster: Cluster, calibration: CalibrationProfile,
                         progress: Callable[[int], None] | None = None) -> SearchResult:
    """make_plan's search for a request with sites (or a WAN link): checked as the CLI checks it, then searched."""
    check_sites(request.sites, request.wan_gbps, request.wan_latency_s, [request.gpus], request.fabric_model)
    if request.wan_gbps is None or request.wan_latency_s is None:  # check_sites refused sites without a link
        raise InputError("a plan over sites needs --wan-gbps and --wan-latency")
    return search_sites(job, cluster, calibration, sites=request.sites,
                        link=WanLink(request.wan_gbps, request.wan_latency_s), space=request.search_space,
                        options=request.options, progress=progress)
