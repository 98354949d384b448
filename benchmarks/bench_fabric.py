"""Time one 1 GiB all-reduce over 16,384 H100s on a three-tier NDR400 fat tree (target: <= 10 s)."""

from __future__ import annotations

import time

from gpufleet.catalog.registry import load_catalog
from gpufleet.fabric.graph import build_graph
from gpufleet.fabric.simulate import simulate_collective
from gpufleet.fabric.topology import Cluster, Fabric


def main() -> None:
    catalog = load_catalog()
    node = catalog.node("dgx-h100")
    cluster = Cluster(catalog.gpu(node.gpu), node, 16384, Fabric(catalog.network("ndr400"), "fat-tree"))
    start = time.perf_counter()
    graph = build_graph(cluster)
    built = time.perf_counter()
    result = simulate_collective("all-reduce", 2**30, 16384, cluster, graph=graph)
    done = time.perf_counter()
    print(f"graph: {graph.vertices} vertices, {graph.links} links in {built - start:.2f} s")
    print(f"all-reduce 1 GiB x 16384 GPUs ({result.algorithm}, {result.routing}): {result.time_s * 1e3:.1f} ms "
          f"simulated, busbw {result.bus_bytes_per_s / 1e9:.1f} GB/s")
    print(f"wall time: {done - start:.2f} s (target <= 10 s)")


if __name__ == "__main__":
    main()
