"""`gpufleet bench collectives` vs a bare torch.distributed timing loop of the same sizes: the overhead it adds.

    torchrun --standalone --nproc-per-node 2 benchmarks/bench_collectives_overhead.py [--max-bytes 4MiB] [--rounds 3]

Rank 0 prints `name=value` lines: overhead (our per-call time / the bare loop's, minus 1, median over sizes of the
best of --rounds; target <= 0.05) and the raw per-size figures. The bare loop is what one writes by hand:
`dist.all_reduce(t)` `iters` times between two perf_counter reads after a barrier. Ours is
`gpufleet.runtime.bench.collectives.bench_collectives` (the code `gpufleet bench collectives` runs), all-reduce
only, same iters and warmup. The two alternate size by size, and which one goes first alternates by round
(the first timing after a change of size is slower, whichever side runs it), so both see the same machine state.
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
        for size in sizes:  # the sides alternate size by size, and which goes first alternates by round: the first
            # timing after a change of size pays for gloo's buffers, whichever side it is (measured: 2-3x)
            def run_ours(size: int = size) -> None:
                [row] = bench_collectives(dist, CollectivesRequest(["all-reduce"], [size], args.iters, args.warmup))
                ours[size].append(row.time_s)

            def run_bare(size: int = size) -> None:
                bare[size].append(bare_all_reduce_s(size, args.iters, args.warmup))

            for run in (run_ours, run_bare) if round_index % 2 == 0 else (run_bare, run_ours):
                run()
    if dist.get_rank() == 0:
        ratios = []
        for size in sizes:
            ratio = min(ours[size]) / min(bare[size])
            ratios.append(ratio)
            print(f"size_{size}_ours_s={min(ours[size]):.4g} size_{size}_bare_s={min(bare[size]):.4g} "
                  f"ratio={ratio:.3f}")
        print(f"ranks={dist.get_world_size()}")
        print(f"overhead={statistics.median(ratios) - 1:+.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
