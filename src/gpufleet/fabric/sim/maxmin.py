"""Max-min fair rates by progressive filling over a factored link x flow incidence (the solver of every
simulated phase)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from gpufleet.fabric.graph import (
    FloatArray,
    IntArray,
)
from gpufleet.fabric.routing import spans

if TYPE_CHECKING:
    from scipy.sparse import csr_matrix

def _distinct(ids: IntArray, size: int) -> IntArray:
    """The distinct values of `ids` (all below `size`), ascending: a mask when there are many, else a sort."""
    if len(ids) * 8 < size:
        return np.unique(ids)
    mark = np.zeros(size, dtype=bool)
    mark[ids] = True
    return np.flatnonzero(mark)


def _ranges(indptr: IntArray, rows: IntArray) -> IntArray:
    """Positions, in a CSR's indices/data, of the entries of `rows` (concatenated, in row order)."""
    return spans(indptr[rows], indptr[rows + 1] - indptr[rows])


class Incidence:
    """A links x flows incidence A = F + S·P: each flow's own entries F (links x flows), plus the shared
    paths S (links x paths) that P assigns flows to (`path_of_flow`, -1 for none). Flows on one path
    share its weighted links; keeping them once per path instead of once per flow is what lets a
    three-tier spray fabric (~2,000 links a path) be simulated at scale. Sums over flows are exact;
    only the order of floating-point additions differs from the expanded matrix."""

    def __init__(self, own: csr_matrix, shared: csr_matrix | None = None, path_of_flow: IntArray | None = None):
        from scipy.sparse import csr_matrix  # imported when a collective is simulated, not by `gpufleet --help`

        own = csr_matrix(own)
        own.sum_duplicates()
        self.shape: tuple[int, int] = own.shape
        self.by_link = own  # links x flows
        self.by_flow = own.T.tocsr()  # flows x links
        flows = self.shape[1]
        self.shared: csr_matrix | None = None
        self.path_of_flow = np.full(flows, -1, dtype=np.int64) if path_of_flow is None else path_of_flow
        if shared is not None and shared.shape[1] > 0:
            shared = csr_matrix(shared)
            shared.sum_duplicates()
            self.shared = shared  # links x paths
            self.shared_by_path = shared.T.tocsr()  # paths x links
            on_path = np.flatnonzero(self.path_of_flow >= 0)
            order = np.argsort(self.path_of_flow[on_path], kind="stable")
            self.flows_of_path = on_path[order]  # flows grouped by path (CSR over paths)
            counts = np.bincount(self.path_of_flow[on_path], minlength=shared.shape[1])
            self.path_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def entries_of(self, flows: IntArray) -> tuple[IntArray, FloatArray, IntArray]:
        """The entries of `flows` (distinct flow ids): link, summed weight and number of those flows, per entry
        (a link may appear in several entries)."""
        at = _ranges(self.by_flow.indptr, flows)
        where, weight = self.by_flow.indices[at], self.by_flow.data[at]
        times = np.ones(len(at), dtype=np.int64)
        if self.shared is None:
            return where, weight, times
        path = self.path_of_flow[flows]
        per_path = np.bincount(path[path >= 0], minlength=self.shared.shape[1])
        touched = np.flatnonzero(per_path)
        at = _ranges(self.shared_by_path.indptr, touched)
        repeat = np.repeat(per_path[touched], np.diff(self.shared_by_path.indptr)[touched])
        return (np.concatenate([where, self.shared_by_path.indices[at]]),
                np.concatenate([weight, self.shared_by_path.data[at] * repeat]), np.concatenate([times, repeat]))

    def flows_on(self, links: IntArray) -> IntArray:
        """Flows that cross any of `links`, ascending."""
        found = self.by_link.indices[_ranges(self.by_link.indptr, links)]
        if self.shared is not None:
            paths = _distinct(self.shared.indices[_ranges(self.shared.indptr, links)], self.shared.shape[1])
            found = np.concatenate([found, self.flows_of_path[_ranges(self.path_ptr, paths)]])
        return _distinct(found, self.shape[1])


def max_min_rates(incidence: csr_matrix | Incidence, capacity: FloatArray, tolerance: float = 1e-9
                  ) -> tuple[FloatArray, list[tuple[IntArray, float]]]:
    """Max-min fair rates by progressive filling.

    `incidence` is links x flows with the fraction of each flow on each link. All unfrozen flows rise
    together until a link fills; the flows on it freeze. Returns the rates and, per round, the links
    that filled and the rate their flows froze at.

    Incremental: the unfrozen flows all sit at the current level, so link l fills when the level reaches
    fill[l] = (capacity - what its frozen flows hold) / (weight of its unfrozen flows), and counts as full
    (within `tolerance` of its capacity) from full_at[l] = fill[l] - tolerance·capacity / weight. Both
    change only when some of the link's flows freeze, so a round updates the links that its frozen flows
    cross. Each flow's entries are visited once: the cost is the incidence's size plus rounds x (two
    vector passes over the links), not rounds x the incidence (a collective over ECMP's colliding paths
    takes thousands of rounds).
    """
    a = incidence if isinstance(incidence, Incidence) else Incidence(incidence)
    links, flows = a.shape
    rate = np.zeros(flows)
    active = np.ones(flows, dtype=bool)
    frozen_rounds: list[tuple[IntArray, float]] = []
    level = 0.0
    where, weight, times = a.entries_of(np.arange(flows, dtype=np.int64))
    load = np.bincount(where, weights=weight, minlength=links)  # weight of the unfrozen flows, per link
    count = np.bincount(where, weights=times, minlength=links).astype(np.int64)  # and their number
    held = np.zeros(links)  # capacity the frozen flows hold
    usable = capacity - tolerance * np.maximum(capacity, 1.0)
    fill = np.full(links, math.inf)  # level at which each link fills (inf: no unfrozen flow on it)
    full_at = np.full(links, math.inf)  # level from which it counts as full
    remaining = flows

    def refresh(touched: IntArray) -> None:
        busy = (count[touched] > 0) & (load[touched] > 1e-15)
        on, off = touched[busy], touched[~busy]
        fill[off] = full_at[off] = math.inf
        fill[on] = (capacity[on] - held[on]) / load[on]
        full_at[on] = (usable[on] - held[on]) / load[on]

    refresh(np.arange(links, dtype=np.int64))
    while remaining:
        tightest = int(np.argmin(fill))
        if not math.isfinite(fill[tightest]):  # flows on no link at all (cannot happen for real routes)
            rate[active] = math.inf
            break
        level = max(level, float(fill[tightest]))
        full_links = np.flatnonzero(full_at <= level)
        frozen_rounds.append((full_links, level))
        newly = a.flows_on(full_links)
        newly = newly[active[newly]]
        if not len(newly):  # numerical safety: freeze the flows of the tightest link
            newly = a.flows_on(np.array([tightest], dtype=np.int64))
            newly = newly[active[newly]]
        rate[newly] = level
        active[newly] = False
        remaining -= len(newly)
        where, weight, times = a.entries_of(newly)
        np.add.at(held, where, level * weight)
        np.subtract.at(load, where, weight)
        np.subtract.at(count, where, times)
        refresh(_distinct(np.concatenate([where, full_links]), links))
    return rate, frozen_rounds
