"""What a flow-level simulation is made of and what it answers: algorithms, phases, results."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from gpufleet.fabric.collectives import Op
from gpufleet.fabric.graph import (
    FloatArray,
    IntArray,
)

Algorithm = Literal["auto", "ring", "tree", "hierarchical", "pairwise", "direct"]
ALGORITHMS: tuple[Algorithm, ...] = ("auto", "ring", "tree", "hierarchical", "pairwise", "direct")
#: All-to-all phases actually solved; the rest are represented by these (evenly spaced) ones.
MAX_ALL_TO_ALL_STEPS = 128
#: Flows of one all-to-all phase: up to this many, every shift runs at once (NCCL posts all peers).
MAX_CONCURRENT_FLOWS = 65536


@dataclass(frozen=True)
class Phase:
    """Flows that run together, `repeat` times; `latency_steps` one-way latencies are paid in all."""

    name: str
    src: IntArray
    dst: IntArray
    bytes_per_flow: FloatArray
    repeat: float
    latency_steps: float


@dataclass(frozen=True, slots=True)
class Bottleneck:
    """A tier of links that saturated first, in words and numbers."""

    tier: str
    links: int  # saturated links of that tier
    example: str  # one of them, named
    fair_share_bytes_per_s: float  # rate of the flows it held back


@dataclass(frozen=True, slots=True)
class PhaseResult:
    name: str
    flows: int
    repeat: float
    bandwidth_s: float  # all repeats
    latency_s: float
    bottlenecks: tuple[Bottleneck, ...]


@dataclass(frozen=True, slots=True)
class SimResult:
    """One simulated collective: time, bandwidths (nccl-tests conventions) and what held it back."""

    op: Op
    algorithm: str
    routing: str
    message_bytes: float
    ranks: int
    time_s: float
    bus_bytes_per_s: float  # bus bandwidth including latency, as nccl-tests reports it
    phases: tuple[PhaseResult, ...]

    @property
    def algbw_bytes_per_s(self) -> float:
        return self.message_bytes / self.time_s if self.time_s > 0 else math.inf

    @property
    def bottlenecks(self) -> tuple[Bottleneck, ...]:
        """Bottlenecks of the phase that took longest."""
        if not self.phases:
            return ()
        return max(self.phases, key=lambda p: p.bandwidth_s + p.latency_s).bottlenecks
