"""`gpufleet bench collectives` vs a bare torch.distributed timing loop of the same sizes: the overhead it adds.

    torchrun --standalone --nproc-per-node 2 benchmarks/bench_collectives_overhead.py [--max-bytes 4MiB] [--rounds 10]

Rank 0 prints `name=value` lines: `ratio` (our per-call time / the bare loop's: the median over every round and
size of the two timings taken back to back; target <= 1.05), `overhead` (ratio - 1), the median ratio per size and
each side's median time per size. Ours is `gpufleet.runtime.bench.collectives.bench_collectives` (the code `gpufleet
bench collectives` runs), all-reduce only; the bare loop is what one writes by hand: `dist.all_reduce(t)` `iters`
times between two perf_counter reads after a barrier, the slowest rank's time. Both use the same process group,
the same sizes, iters and warm-up calls. Robustness on a shared machine: the two sides alternate size by size and
which goes first alternates by round (the first timing after a change of size pays for gloo's buffers, whichever
side runs it), and every figure is a median of paired ratios, so a burst of load from other jobs moves one pair,
not the result.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from gpufleet.runtime.bench.busbw import size_sweep
from gpufleet.runtime.bench.collectives import CollectivesRequest, bench_collectives
from gpufleet.units import parse_bytes


def bare_all_reduce_s(size_bytes: int, iters: int, warmup: int) -> float:
    tensor = torch.ones(size_bytes // 4, dtype=torch.float32)
    for _ in range(warmup):
        dist.all_reduce(tensor)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def ours_all_reduce_s(size_bytes: int, iters: int, warmup: int) -> float:
    [row] = bench_collectives(dist, CollectivesRequest(["all-reduce"], [size_bytes], iters, warmup))
    return row.time_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-bytes", default="64KiB")
    parser.add_argument("--max-bytes", default="4MiB")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    sizes = size_sweep(int(parse_bytes(args.min_bytes)), int(parse_bytes(args.max_bytes)), 4.0)
    ours: dict[int, list[float]] = {size: [] for size in sizes}
    bare: dict[int, list[float]] = {size: [] for size in sizes}
    for round_index in range(args.rounds):
        for size in sizes:
            sides = [(ours_all_reduce_s, ours[size]), (bare_all_reduce_s, bare[size])]
            for timer, into in sides if round_index % 2 == 0 else sides[::-1]:
                into.append(timer(size, args.iters, args.warmup))
    if dist.get_rank() == 0:
        paired = {size: [o / b for o, b in zip(ours[size], bare[size], strict=True)] for size in sizes}
        for size in sizes:
            print(f"size_{size}_ours_s={statistics.median(ours[size]):.4g} "
                  f"size_{size}_bare_s={statistics.median(bare[size]):.4g} "
                  f"size_{size}_ratio={statistics.median(paired[size]):.3f}")
        ratio = statistics.median(r for size in sizes for r in paired[size])
        print(f"ranks={dist.get_world_size()} rounds={args.rounds} iters={args.iters}")
        print(f"ratio={ratio:.3f}")
        print(f"overhead={ratio - 1:+.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
