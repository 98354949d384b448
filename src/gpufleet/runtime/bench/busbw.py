"""Algorithm and bus bandwidth by nccl-tests' definitions, and what gpufleet's fabric model expects. Pure: no torch.

nccl-tests (doc/PERFORMANCE.md, https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
`algbw = S / t`, S the collective's size as nccl-tests counts it (all-reduce, broadcast: the buffer; all-gather,
reduce-scatter, all-to-all: the full, n-rank buffer, i.e. receive size for all-gather and send size for
reduce-scatter); `busbw = algbw · factor`, factor 2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter
and all-to-all, 1 for broadcast and send/recv. busbw is comparable to the hardware's peak bandwidth whatever the
rank count. The factors are `gpufleet.fabric.collectives.bus_factor`, the ones the model uses.

Units: `*_gbps` in a row are GB/s (10^9 bytes per second), the unit nccl-tests prints — not Gbit/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.errors import InputError
from gpufleet.fabric.collectives import OPS, Op, bus_factor, collective_cost
from gpufleet.fabric.placement import span_over_nodes
from gpufleet.fabric.topology import Cluster
from gpufleet.units import parse_bytes

#: The largest buffer a bench takes (judgement: twice the largest HBM in the catalog; a typo of extra zeros gets
#: one line instead of an out-of-memory crash).
MAX_BENCH_BYTES = 2**39


def bench_bytes(text: str, flag: str) -> int:
    """A buffer size a bench takes: 1 byte to MAX_BENCH_BYTES."""
    return int(parse_bytes(text, flag, least_bytes=1, most_bytes=MAX_BENCH_BYTES))

#: A measured bus bandwidth below this fraction of what the model expects is flagged as a shortfall. Judgement:
#: well-tuned NCCL reaches 85-95 % of the model's achievable figure at large sizes; the seeds' TCP fallback
#: (120 Gb/s instead of 380) is 0.32. 0.75 flags a fallback or a bad link, not run-to-run noise.
SHORTFALL_FRACTION = 0.75
#: The most sizes one sweep may hold (each is `iters` collectives; a factor of 1.0001 would never end).
MAX_SWEEP_SIZES = 64


@dataclass(frozen=True, slots=True)
class CollectiveRow:
    """One size of one collective, with the issue's JSON keys (GB/s = 10^9 bytes/s)."""

    collective: Op
    size_bytes: int
    time_s: float
    algbw_gbps: float
    busbw_gbps: float
    expected_busbw_gbps: float | None
    ranks: int
    ranks_per_node: int | None = None  # None: not known (one node assumed nowhere; calibrate asks for it)

    @property
    def shortfall(self) -> bool:
        expected = self.expected_busbw_gbps
        return expected is not None and self.busbw_gbps < SHORTFALL_FRACTION * expected

    def as_json(self) -> dict[str, Any]:
        return {"collective": self.collective, "size_bytes": self.size_bytes, "time_s": self.time_s,
                "algbw_gbps": self.algbw_gbps, "busbw_gbps": self.busbw_gbps,
                "expected_busbw_gbps": self.expected_busbw_gbps, "shortfall": self.shortfall, "ranks": self.ranks,
                "ranks_per_node": self.ranks_per_node}


def measured_row(op: Op, size_bytes: int, ranks: int, time_s: float, expected_busbw_gbps: float | None,
                 ranks_per_node: int | None = None) -> CollectiveRow:
    """A row from one timing: algbw = S/t, busbw = algbw · nccl-tests' factor."""
    algbw = size_bytes / time_s / 1e9
    return CollectiveRow(op, size_bytes, time_s, algbw, algbw * _factor(op, ranks), expected_busbw_gbps, ranks,
                         ranks_per_node)


def _factor(op: Op, ranks: int) -> float:
    # nccl-tests' factor: send/recv and broadcast are 1 even for 2 ranks; bus_factor(n<=1) is 0 (no traffic).
    return bus_factor(op, ranks) if ranks > 1 else 0.0


def expected_busbw_gbps(op: Op, size_bytes: int, cluster: Cluster) -> float:
    """The bus bandwidth the fabric model predicts at this size, latency included (what nccl-tests would print for
    the model's time): S · factor / t_model, for a group of every GPU of the cluster in block placement."""
    span = span_over_nodes(cluster.gpus, cluster.gpus_per_node, cluster.num_nodes, cluster)
    cost = collective_cost(op, float(size_bytes), span, cluster)
    if cost.time_s <= 0:
        return 0.0
    return size_bytes * _factor(op, cluster.gpus) / cost.time_s / 1e9


def size_sweep(min_bytes: int, max_bytes: int, factor: float) -> list[int]:
    """nccl-tests' `-b MIN -e MAX -f FACTOR` sweep: MIN, MIN·f, … up to MAX (MAX included when the steps land on it)."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise InputError(f"sizes must satisfy 1 <= --min-bytes <= --max-bytes, got {min_bytes} and {max_bytes}")
    if factor <= 1 and max_bytes > min_bytes:
        raise InputError(f"--factor must be above 1 for a sweep from {min_bytes} to {max_bytes} bytes, got {factor}")
    sizes = [min_bytes]
    while sizes[-1] * factor <= max_bytes * (1 + 1e-9) and max_bytes > min_bytes:
        sizes.append(round(sizes[-1] * factor))
        if len(sizes) > MAX_SWEEP_SIZES:
            raise InputError(f"the sweep from {min_bytes} to {max_bytes} bytes by ×{factor} has more than "
                             f"{MAX_SWEEP_SIZES} sizes; use a larger --factor")
    return sizes


def parse_ops(text: str) -> list[Op]:
    """`all` or a comma list of collectives."""
    if text.strip() == "all":
        return list(OPS)
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in OPS]
    if unknown or not names:
        raise InputError(f"unknown collective(s) {', '.join(unknown) or repr(text)}; known: all, {', '.join(OPS)}")
    return [op for op in OPS if op in names]
