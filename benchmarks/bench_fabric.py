"""Flow-simulator benchmark: one 1 GiB all-reduce over 16,384 H100s (target: <= 10 s), then, per collective, the
largest simulation the work limit allows, with its estimated and measured time and peak memory.

    .venv/bin/python benchmarks/bench_fabric.py [--network ndr400,roce400] [--collectives all-to-all,...] [--quick]

The limit (gpufleet.fabric.simulate.MAX_SIM_SECONDS / MAX_SIM_BYTES: about a minute and 2 GiB on 2 cores) is
applied to an estimate made by arithmetic before anything is built; this run is how its constants are
checked: every measured time and memory should sit below its estimate (the estimate is meant to be
conservative), and no allowed run should take much over a minute. "Largest allowed" is the largest power of
two of GPUs (DGX H100 nodes, 1:1 fat tree) whose estimate fits, up to the fat tree's maximum. Each run is a
fresh process, so its peak RSS is its own. --quick runs the 16,384-GPU all-reduce only.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from gpufleet.catalog.registry import load_catalog
from gpufleet.fabric.collectives import OPS, Op
from gpufleet.fabric.graph import build_graph, estimate_fabric_size, max_gpus
from gpufleet.fabric.placement import GroupSpan, span_over_nodes
from gpufleet.fabric.simulate import (
    MAX_SIM_BYTES,
    MAX_SIM_SECONDS,
    default_routing,
    estimate_work,
    shape_of_span,
    simulate_collective,
)
from gpufleet.fabric.topology import Cluster, Fabric


def _cluster(gpus: int, network: str) -> Cluster:
    catalog = load_catalog()
    node = catalog.node("dgx-h100")
    return Cluster(catalog.gpu(node.gpu), node, gpus, Fabric(catalog.network(network), "fat-tree"))


def _whole(cluster: Cluster) -> GroupSpan:
    return span_over_nodes(cluster.gpus, cluster.gpus_per_node, cluster.num_nodes, cluster, "block")


def all_reduce_16k() -> None:
    cluster = _cluster(16384, "ndr400")
    start = time.perf_counter()
    graph = build_graph(cluster)
    built = time.perf_counter()
    result = simulate_collective("all-reduce", 2**30, 16384, cluster, graph=graph)
    done = time.perf_counter()
    print(f"graph: {graph.vertices} vertices, {graph.links} links in {built - start:.2f} s")
    print(f"all-reduce 1 GiB x 16384 GPUs ({result.algorithm}, {result.routing}): {result.time_s * 1e3:.1f} ms "
          f"simulated, busbw {result.bus_bytes_per_s / 1e9:.1f} GB/s")
    print(f"wall time: {done - start:.2f} s (target <= 10 s)")


def largest_allowed(op: Op, network: str) -> tuple[int, float, float]:
    """The largest power-of-two GPU count whose simulation of `op` the limit allows: (GPUs, est. s, est. bytes)."""
    top = max_gpus(_cluster(8, network))
    best = (0, 0.0, 0.0)
    count = 2
    while count <= top:
        cluster = _cluster(count, network)
        work = estimate_work(op, "auto", default_routing(cluster), shape_of_span(cluster, _whole(cluster)),
                             estimate_fabric_size(cluster))
        if work.seconds <= MAX_SIM_SECONDS and work.bytes <= MAX_SIM_BYTES:
            best = (count, work.seconds, work.bytes)
        count *= 2
    return best


def peak_rss_bytes() -> int:
    """This process's peak resident memory: VmHWM (reset by exec; ru_maxrss keeps the forking parent's peak)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def run_one(op: Op, gpus: int, network: str) -> None:
    """One simulation in this process; prints a JSON line with its wall time and peak RSS."""
    cluster = _cluster(gpus, network)
    start = time.perf_counter()
    result = simulate_collective(op, 2**30, _whole(cluster), cluster)
    wall = time.perf_counter() - start
    peak = peak_rss_bytes()
    print(json.dumps({"wall_s": wall, "peak_bytes": peak, "algorithm": result.algorithm, "routing": result.routing}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="ndr400,roce400", help="networks, comma-separated")
    parser.add_argument("--collectives", default=",".join(OPS), help="collectives, comma-separated")
    parser.add_argument("--quick", action="store_true", help="the 16,384-GPU all-reduce only")
    parser.add_argument("--one", nargs=3, metavar=("OP", "GPUS", "NETWORK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        run_one(args.one[0], int(args.one[1]), args.one[2])
        return
    all_reduce_16k()
    if args.quick:
        return
    print(f"\nlargest simulation allowed per collective (limit ~{MAX_SIM_SECONDS:.0f} s, "
          f"{MAX_SIM_BYTES / 2**30:.0f} GiB estimated), 1 GiB, DGX H100, 1:1 fat tree:")
    print(f"{'network':8s} {'collective':15s} {'GPUs':>7s} {'routing':>7s} {'est s':>7s} {'wall s':>7s} "
          f"{'est GiB':>8s} {'peak GiB':>8s}")
    for network in args.network.split(","):
        for op in args.collectives.split(","):
            gpus, est_s, est_bytes = largest_allowed(op, network)
            out = subprocess.run([sys.executable, __file__, "--one", op, str(gpus), network], capture_output=True,
                                 text=True, check=True)
            measured = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{network:8s} {op:15s} {gpus:7,d} {measured['routing']:>7s} {est_s:7.1f} {measured['wall_s']:7.1f} "
                  f"{est_bytes / 2**30:8.2f} {measured['peak_bytes'] / 2**30:8.2f}", flush=True)


if __name__ == "__main__":
    main()
