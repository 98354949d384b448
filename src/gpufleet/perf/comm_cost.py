"""What one collective of a step costs on its group of ranks, and how much of it a compute window hides.

`collective` prices a collective over the group a layout gives (`fabric.placement.group_span`) with the
analytical α–β model, or with the flow-level simulator when `StepOptions.fabric_model` is "sim".
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from gpufleet.fabric.collectives import CollectiveCost, Op, collective_cost
from gpufleet.fabric.placement import GroupKind, GroupSpan, Placement, group_span
from gpufleet.fabric.topology import Cluster
from gpufleet.parallel.layout import Layout

if TYPE_CHECKING:
    from gpufleet.perf.step import StepOptions


def overlap(comm_s: float, window_s: float, granules: int) -> tuple[float, float]:
    """(exposed, hidden) when `comm_s` overlaps a compute window; the first/last granule never hides."""
    if comm_s <= 0:
        return 0.0, 0.0
    exposed = max(comm_s - window_s, comm_s / max(granules, 1))
    return exposed, comm_s - exposed


def collective(op: Op, nbytes: float, kind: GroupKind, layout: Layout, cluster: Cluster,
               options: StepOptions) -> CollectiveCost:
    """One collective of `nbytes` over the layout's `kind` group on this cluster."""
    span = group_span(layout, kind, cluster, options.placement)
    if options.fabric_model == "sim" and span.size > 1 and nbytes > 0:
        return _simulated_cost(op, nbytes, span, cluster, options.placement)
    return collective_cost(op, nbytes, span, cluster)


@lru_cache(maxsize=1024)
def _simulated_cost(op: Op, nbytes: float, span: GroupSpan, cluster: Cluster, placement: Placement) -> CollectiveCost:
    """The flow-level simulator's time for this collective on this cluster's topology graph."""
    from gpufleet.fabric.simulate import simulate_collective

    result = simulate_collective(op, nbytes, span, cluster, placement=placement)
    where = ", ".join(f"{b.tier} ({b.links} links saturated)" for b in result.bottlenecks[:1]) or "no bottleneck"
    return CollectiveCost(op, nbytes, span.size, result.time_s, result.bus_bytes_per_s,
                          f"simulated {result.algorithm}: {where} ({result.bus_bytes_per_s / 1e9:.0f} GB/s bus)")


def chunked_s(op: Op, nbytes: float, chunks: int, kind: GroupKind, layout: Layout, cluster: Cluster,
              options: StepOptions) -> tuple[float, str]:
    """Seconds for `nbytes` moved as `chunks` equal collectives (each pays its own latency), and the link."""
    chunks = max(1, chunks)
    one = collective(op, nbytes / chunks, kind, layout, cluster, options)
    return chunks * one.time_s, one.link
