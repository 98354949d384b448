"""What a WAN between sites adds to a step: a post-step adjustment that adds the part `comm.wan`.

Two ways to split a job over `sites` sites (TP, CP and EP always stay inside one):

* **Data parallelism across sites.** Every site runs the same layout with dp / sites replicas on its own share of
  the batch, and reduces its gradients inside the site as a one-site job does (the site's own step estimate).
  Then the sites all-reduce what that reduction left on each rank: the rank's shard of its replica's gradients
  (DDP: reduce-scatter inside, all-reduce across, all-gather inside; ZeRO and FSDP shard inside a site and
  replicate across sites, as HSDP, and sites synchronise once per step). Summed over a site's ranks the shards
  are one model replica's gradients, tp copies of the replicated norms included. Bytes on each link, each way,
  per step: bus_factor(all-reduce, sites) x that replica's gradient bytes; with two sites, one replica's
  gradients each way at once (the link is full duplex). It goes in the same buckets as the in-site reduction
  (the memory model's `dp_bucket_elements`, or one transformer block when sharded), each paying the ring's latency
  steps, and it overlaps the last micro-batch's backward only as far as perf/step.py's data-parallel rule lets
  the reduction overlap: the backward share of that micro-batch's compute, less what the in-site reduction
  already hides there, and never the last granule.
* **Pipeline parallelism across sites.** Each site holds pp / sites consecutive stages. Every micro-batch's
  activations cross each site boundary forward and their gradients come back (2·vpp − 1 crossings each way on a
  two-site link with interleaving: vpp forward, vpp − 1 on the way round from the last stage to the first). Each
  crossing is a send-recv of every rank's 1/tp slice (the pipeline's in-fabric hop, perf/step.py) by all the
  stage's ranks at once over the link. The boundary stage waits for it as it waits for an in-fabric hop (the
  step model hides neither), so it is added to the slowest stage for every micro-batch (the boundary stage is
  taken as the slowest: never optimistic), and the mean stage grows by the boundary stages' share, which the
  bubble ((pp − 1) / vpp of a mean stage) carries.

`comm.wan`'s exposed time is what the WAN adds to the step (so the parts still add up to the step), its hidden
time what backward hid; its link names the arrangement, the link and what crosses it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from gpufleet.fabric.collectives import bus_factor
from gpufleet.fabric.topology import Cluster
from gpufleet.fabric.wan import WanLink, wan_collective_cost
from gpufleet.parallel.layout import Layout, expert_parallel_degrees
from gpufleet.perf.compute import ACTIVATION_BYTES
from gpufleet.perf.step import Part, StepEstimate, StepOptions, stage_parameters
from gpufleet.units import format_bytes
from gpufleet.workload.job import Job

Across = Literal["dp", "pp"]

#: Share of a micro-batch's compute that is backward, the window perf/step.py's data-parallel rule lets the
#: gradient reduction overlap (its `backward_window`: 2/3, since backward runs two GEMMs per forward GEMM).
#: tests/test_sites.py checks the two stay equal.
BACKWARD_SHARE = 2 / 3
#: Parts of a step that fill a micro-batch's compute window on a stage (the window perf/step.py's overlap rule
#: uses, less the context- and expert-parallel traffic it may also count and the stage imbalance: never larger).
WINDOW_PARTS = ("compute.gemm", "compute.attention", "compute.elementwise", "compute.recompute",
                "compute.logits+loss", "comm.tp", "host.moe", "offload.activations")
SHARDED = ("zero3", "fsdp", "hsdp")


@dataclass(frozen=True, slots=True)
class WanShare:
    """What crosses the WAN in one step and what it costs."""

    across: Across
    sites: int
    bytes_per_link_direction: float  # per step, on the busiest link, each way
    total_s: float  # seconds the transfers take in a step
    exposed_s: float  # seconds they add to the step
    link: str
    bubble_s: float = 0.0  # of exposed_s, what widens the pipeline's bubble

    @property
    def hidden_s(self) -> float:
        return self.total_s - self.exposed_s if self.across == "dp" else 0.0


def replica_gradient_bytes(job: Job, site_layout: Layout, grad_bytes: float, bucket_elements: float
                           ) -> tuple[float, int]:
    """(gradient bytes a site's ranks hold after their in-site reduction, summed: one replica's; the most buckets
    of `bucket_elements` one rank sends them in)."""
    _, edp = expert_parallel_degrees(site_layout)
    ranks_per_stage = site_layout.tp * site_layout.cp * site_layout.dp
    stage_layers = math.ceil(job.model.layers / site_layout.pp)
    sharded = site_layout.sharding in SHARDED
    total = 0.0
    units = 0
    for stage in range(site_layout.pp):
        params = stage_parameters(job, site_layout, stage)
        total += (site_layout.tp * params.dense + ranks_per_stage * params.expert / edp) * grad_bytes
        dense_units = stage_layers if sharded else math.ceil(params.dense / bucket_elements)
        expert_units = 0 if not params.expert else stage_layers if sharded else math.ceil(
            params.expert / bucket_elements)
        units = max(units, dense_units + expert_units)
    return total, max(units, 1)


def backward_window_s(step: StepEstimate) -> float:
    """The backward of one micro-batch on a stage: the window the data-parallel reduction may overlap."""
    per_step_s = sum(step.parts[name].exposed_s for name in WINDOW_PARTS if name in step.parts)
    return BACKWARD_SHARE * per_step_s / max(step.micro_batches, 1)


def _window_left_s(step: StepEstimate, sharded: bool) -> float:
    """The last micro-batch's backward, less what the in-site data-parallel reduction already hides there (all of
    its hidden time, or one micro-batch's share when it reduces every micro-batch: never more window than is)."""
    dp = step.parts.get("comm.dp")
    used_s = 0.0 if dp is None else dp.hidden_s / (step.micro_batches if sharded else 1)
    return max(0.0, backward_window_s(step) - used_s)


def dp_across_sites(site_step: StepEstimate, job: Job, site_layout: Layout, site: Cluster, link: WanLink,
                    sites: int, options: StepOptions) -> WanShare:
    """The cross-site all-reduce after each site's own step (`site_step`: `site_layout` on one site's `site`
    cluster with 1/sites of the batch)."""
    grad_bytes = options.memory.reduced_grad_bytes(job.precision)
    replica_bytes, buckets = replica_gradient_bytes(job, site_layout, grad_bytes,
                                                     options.memory.resolved_dp_bucket_elements)
    ranks = site.gpus
    bucket = wan_collective_cost("all-reduce", replica_bytes / ranks / buckets, sites, ranks, link, site)
    total_s = buckets * bucket.time_s
    sharded = site_layout.sharding in SHARDED
    if options.dp_overlap:
        granules = max(math.ceil(job.model.layers / site_layout.pp), 1)
        exposed_s = max(total_s - _window_left_s(site_step, sharded), total_s / granules)
    else:
        exposed_s = total_s
    per_link = replica_bytes * bus_factor("all-reduce", sites)
    return WanShare("dp", sites, per_link, total_s, exposed_s,
                    f"DP across {sites} sites (dp{site_layout.dp} in each): all-reduce of each replica's "
                    f"gradients, {format_bytes(per_link)} each way per step in {buckets} buckets; {bucket.link}")


def boundary_crossings(sites: int, vpp: int) -> int:
    """Transfers each way per micro-batch on the busiest site link: a two-site link carries the forward crossing
    and, with interleaving, the way round from the last stage to the first (2·vpp − 1); a ring of three or more
    gives the way round a link of its own (vpp)."""
    return 2 * vpp - 1 if sites == 2 else vpp


def boundary_stages(pp: int, sites: int, vpp: int) -> int:
    """Pipeline ranks whose sends cross a site link: both sides of each site boundary, and with interleaving the
    last and first stage (the way round)."""
    per_site = pp // sites
    stages = {stage for boundary in range(per_site, pp, per_site) for stage in (boundary - 1, boundary)}
    if vpp > 1:
        stages |= {0, pp - 1}
    return len(stages)


def pp_across_sites(step: StepEstimate, job: Job, layout: Layout, cluster: Cluster, link: WanLink,
                    sites: int) -> WanShare:
    """The stage-boundary send-recvs of `layout` (pp a multiple of `sites`) on `cluster` (all sites' GPUs; one
    site's fabric per site) once they cross the WAN, per micro-batch, and the bubble they widen."""
    m, vpp, pp = step.micro_batches, layout.vpp, layout.pp
    slice_bytes = layout.micro_batch * job.seq_len / layout.cp * job.model.hidden * ACTIVATION_BYTES / layout.tp
    ranks = layout.tp * layout.cp * layout.dp
    hop = wan_collective_cost("send-recv", slice_bytes, 2, ranks, link, cluster)
    crossings = boundary_crossings(sites, vpp)
    in_fabric = step.parts.get("comm.pp")
    # the in-fabric send-recv each crossing replaces, as the step charged it: its exposed seconds (an overlapped one
    # cost the step nothing to take back; the WAN's is charged exposed)
    in_fabric_hop_s = in_fabric.exposed_s / (2 * vpp * m) if in_fabric is not None and m else 0.0
    # The boundary stage's vpp sends that now cross, at the link's whole load in their direction
    added_per_micro_batch_s = max(0.0, crossings * hop.time_s - vpp * in_fabric_hop_s)
    bubble_s = (pp - 1) / vpp * added_per_micro_batch_s * boundary_stages(pp, sites, vpp) / pp
    exposed_s = m * added_per_micro_batch_s + bubble_s
    per_link = crossings * m * slice_bytes * ranks
    plural = "s" if crossings > 1 else ""
    per_micro_batch_ms = crossings * hop.time_s * 1e3
    return WanShare("pp", sites, per_link, m * crossings * hop.time_s, exposed_s,
                    f"PP across {sites} sites (pp{pp // sites} in each): {crossings} send-recv{plural} of "
                    f"{format_bytes(slice_bytes * ranks)} each way per micro-batch ({per_micro_batch_ms:,.1f} ms; "
                    f"{m} micro-batches, {bubble_s * 1e3:,.1f} ms more bubble); {hop.link}", bubble_s)


def with_wan(step: StepEstimate, share: WanShare, *, tokens_per_step: int, gpus: int) -> StepEstimate:
    """`step` with the WAN's part added (`comm.wan`), for the whole job over all sites."""
    step_s = step.step_s + share.exposed_s
    parts = {**step.parts, "comm.wan": Part(share.exposed_s, share.hidden_s, share.link)}
    bubble_s = step.bubble_fraction * step.step_s + share.bubble_s
    return replace(step, step_s=step_s, parts=parts, tokens_per_step=tokens_per_step, gpus=gpus,
                   bubble_fraction=bubble_s / step_s if step_s > 0 else 0.0)
