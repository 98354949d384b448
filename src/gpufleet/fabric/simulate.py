"""Flow-level simulation of collectives on an explicit topology.

The code lives in gpufleet.fabric.sim, one module per concern (records, maxmin, phases, work, run); this module
keeps every name it always had, so callers import from here.

A collective is a list of phases; a phase is a set of GPU-to-GPU flows that run together and repeat
`repeat` times (the steps of a ring all move equal chunks over the same pairs, so one solve serves
them all). Flows share links by max-min fairness (progressive filling, vectorized over a sparse
link x flow incidence); a step ends when its slowest flow ends, plus the largest one-way latency of
its flows. Algorithms, NCCL-style:

* ring (all-reduce, all-gather, reduce-scatter, broadcast): one ring per NIC used by the group on a
  node (NCCL channels); channel c enters each node at the member on NIC c, walks the node's members
  over the scale-up links and leaves through NIC c again (PXN), so each NIC carries one channel each way.
  Inside an AMD mesh, rings of stride 1..k-1 run together (RCCL spreads rings over the mesh's links).
  All-reduce: 2(n-1) steps of S/(n·C) per flow; all-gather / reduce-scatter: n-1 steps.
* tree (all-reduce): NCCL's double binary tree over nodes, a chain inside each node, every channel
  and both trees pipelined at once: each tree carries half the buffer up (reduce) and down (broadcast).
* hierarchical (all-reduce): reduce-scatter inside nodes, k rings across nodes (one per local index,
  on S/k), all-gather inside nodes.
* pairwise (all-to-all): in shift s rank i sends S/n to rank i+s; NCCL posts every peer in one
  group, so shifts run together, as many as keep a phase under 65,536 flows (larger groups run in
  consecutive phases; at most 128 phases are solved, evenly spaced, and scaled). Each peer still
  costs one message latency (n-1 in all), as in the analytical model: NCCL's proxy posts them in turn.
* send-recv: rank i sends S to rank i + n/2 for the first half, all at once.

`auto` picks the faster of ring and tree for all-reduce, as NCCL's tuner does.
Bus bandwidth follows nccl-tests (collectives.bus_factor), so it compares with the analytical model.

Scale. Flows between the same two leaves share one spray path (routing.py), kept once in a factored
incidence (`Incidence`); progressive filling is incremental (`max_min_rates`); all-to-all phases are
built one at a time. Together that took a 1,024-GPU all-to-all from 57 s and 4.5 GB to under a second,
and a 65,536-GPU all-reduce or send-recv (the three-tier NDR fat tree's maximum) from an out-of-memory
kill to a few seconds and ~1 GiB; results are unchanged (to float rounding, tests compare). What is left
grows with flows x phases and, under ECMP, with rounds x links: `estimate_work` prices a simulation by
arithmetic before anything is built, and `check_work` refuses, in one line, one estimated over
MAX_SIM_SECONDS (about a minute) or MAX_SIM_BYTES (2 GiB) on 2 cores. With DGX H100 nodes on a 1:1 fat
tree that allows every collective up to 65,536 GPUs on NDR400 (spray) except all-to-all (8,192), and on
RoCE (ECMP) all-to-all up to 2,048 and all-reduce up to 32,768; benchmarks/bench_fabric.py runs the
largest allowed per collective. `plan --fabric-model sim` goes through the same check.
"""

from __future__ import annotations

from gpufleet.fabric.sim.maxmin import Incidence, _distinct, _ranges, max_min_rates
from gpufleet.fabric.sim.phases import (
    _by_node,
    _entries,
    _hierarchical,
    _intra_ring,
    _pairwise,
    _pairwise_phase,
    _pairwise_plan,
    _ring,
    _ring_flows,
    _send_recv,
    _together,
    _tree,
    collective_phases,
)
from gpufleet.fabric.sim.records import (
    ALGORITHMS,
    MAX_ALL_TO_ALL_STEPS,
    MAX_CONCURRENT_FLOWS,
    Algorithm,
    Bottleneck,
    Phase,
    PhaseResult,
    SimResult,
)
from gpufleet.fabric.sim.run import _solve, default_routing, ranks_for_span, simulate_collective, simulate_ranks
from gpufleet.fabric.sim.work import (
    _BYTES_BASE,
    _BYTES_PER_FLOW,
    _BYTES_PER_HOP_ENTRY,
    _BYTES_PER_LINK,
    _BYTES_PER_PATH_LINK,
    _ROUNDS,
    _SECONDS_PER_FLOW,
    _SECONDS_PER_HOP_ENTRY,
    _SECONDS_PER_PATH_LINK,
    _SECONDS_PER_ROUND,
    _SECONDS_PER_ROUND_LINK,
    MAX_SIM_BYTES,
    MAX_SIM_SECONDS,
    GroupShape,
    SimWork,
    _phases,
    check_work,
    estimate_work,
    fabric_size,
    phase_flows,
    shape_of_ranks,
    shape_of_span,
)

__all__ = [
    "ALGORITHMS",
    "MAX_ALL_TO_ALL_STEPS",
    "MAX_CONCURRENT_FLOWS",
    "MAX_SIM_BYTES",
    "MAX_SIM_SECONDS",
    "_BYTES_BASE",
    "_BYTES_PER_FLOW",
    "_BYTES_PER_HOP_ENTRY",
    "_BYTES_PER_LINK",
    "_BYTES_PER_PATH_LINK",
    "_ROUNDS",
    "_SECONDS_PER_FLOW",
    "_SECONDS_PER_HOP_ENTRY",
    "_SECONDS_PER_PATH_LINK",
    "_SECONDS_PER_ROUND",
    "_SECONDS_PER_ROUND_LINK",
    "Algorithm",
    "Bottleneck",
    "GroupShape",
    "Incidence",
    "Phase",
    "PhaseResult",
    "SimResult",
    "SimWork",
    "_by_node",
    "_distinct",
    "_entries",
    "_hierarchical",
    "_intra_ring",
    "_pairwise",
    "_pairwise_phase",
    "_pairwise_plan",
    "_phases",
    "_ranges",
    "_ring",
    "_ring_flows",
    "_send_recv",
    "_solve",
    "_together",
    "_tree",
    "check_work",
    "collective_phases",
    "default_routing",
    "estimate_work",
    "fabric_size",
    "max_min_rates",
    "phase_flows",
    "ranks_for_span",
    "shape_of_ranks",
    "shape_of_span",
    "simulate_collective",
    "simulate_ranks",
]
