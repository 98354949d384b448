"""`gpufleet bench collectives`: time each collective over a size sweep inside a torch.distributed process group.

The timing loop is the bare one nccl-tests and a hand-written torch loop use: `warmup` untimed calls, a barrier,
then `iters` back-to-back calls between two clock reads (a device synchronise before the second on GPUs). Every
rank times; the slowest rank's time is the collective's (a collective is done when its last rank is), taken with
one all-reduce(MAX) per size, outside the timed region.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.catalog.registry import Catalog
from gpufleet.errors import InputError
from gpufleet.fabric.collectives import Op
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.runtime.bench.busbw import CollectiveRow, expected_busbw_gbps, measured_row

LAUNCH_HINT = ("run it under torchrun, e.g. `torchrun --nproc-per-node 8 -m gpufleet bench collectives`, or under "
               "srun with MASTER_ADDR exported (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT unset)")
#: Element type of the buffers: float32, as nccl-tests' default (`-d float`).
ELEMENT_BYTES = 4


#: torch.distributed's default port, used under srun when the job script sets MASTER_ADDR but not MASTER_PORT.
DEFAULT_MASTER_PORT = "29500"


def from_slurm(environ: Mapping[str, str]) -> dict[str, str]:
    """The torch.distributed variables an `srun` task lacks, from Slurm's own (SLURM_PROCID, SLURM_NTASKS,
    SLURM_LOCALID); empty unless the job script set MASTER_ADDR (Slurm does not know the rendezvous host)."""
    if "RANK" in environ or "SLURM_PROCID" not in environ or "MASTER_ADDR" not in environ:
        return {}
    return {"RANK": environ["SLURM_PROCID"], "WORLD_SIZE": environ.get("SLURM_NTASKS", "1"),
            "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
            "MASTER_PORT": environ.get("MASTER_PORT", DEFAULT_MASTER_PORT)}


def launched_by_a_launcher(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return all(name in env for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def init_process_group(command: str) -> Any:
    """The default process group from torchrun's (or srun + MASTER_ADDR's) environment: NCCL on GPUs, gloo on CPUs.
    Without one: InputError that says how to launch `command`."""
    import torch
    import torch.distributed as dist

    os.environ.update(from_slurm(os.environ))
    if not launched_by_a_launcher():
        raise InputError(f"{command} needs a process group: {LAUNCH_HINT.replace('bench collectives', command)}")
    if dist.is_initialized():
        return dist
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    return dist


@dataclass(frozen=True)
class CollectivesRequest:
    ops: Sequence[Op]
    sizes_bytes: Sequence[int]
    iters: int = 20
    warmup: int = 5
    cluster: Cluster | None = None  # for the expected column; None = no expectation


def _count(op: Op, size_bytes: int, ranks: int) -> int:
    """Elements in the op's full buffer, rounded down so that it splits evenly over the ranks (as nccl-tests does)."""
    unit = ranks if op in ("all-gather", "reduce-scatter", "all-to-all") else 1
    return max(unit, size_bytes // ELEMENT_BYTES // unit * unit)


def tensor_collectives(dist: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(all-gather, reduce-scatter) into/out of one flat tensor, `(output, input)`: the `_single` names where this
    torch has them (2.13 deprecates all_gather_into_tensor and reduce_scatter_tensor), else the older ones."""
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor,
            getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)


def make_call(dist: Any, op: Op, count: int, device: Any) -> Callable[[], Any]:
    """One call of `op` over a full buffer of `count` float32 elements, buffers allocated once."""
    import torch

    ranks, rank = dist.get_world_size(), dist.get_rank()
    full = torch.ones(count, dtype=torch.float32, device=device)
    shard = torch.ones(count // ranks, dtype=torch.float32, device=device)
    if op == "all-reduce":
        return lambda: dist.all_reduce(full)
    all_gather, reduce_scatter = tensor_collectives(dist)
    if op == "all-gather":
        return lambda: all_gather(full, shard)
    if op == "reduce-scatter":
        return lambda: reduce_scatter(shard, full)
    if op == "all-to-all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full)
    if op == "broadcast":
        return lambda: dist.broadcast(full, 0)
    peer_send, peer_recv = (rank + 1) % ranks, (rank - 1) % ranks  # nccl-tests' sendrecv: a ring of pairs
    recv = torch.empty_like(full)

    def send_recv() -> None:
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, full, peer_send),
                                            dist.P2POp(dist.irecv, recv, peer_recv)]):
            work.wait()
    return send_recv


def time_call(dist: Any, call: Callable[[], Any], iters: int, warmup: int, synchronize: Callable[[], None]) -> float:
    """Seconds per call on the slowest rank."""
    import torch

    for _ in range(warmup):
        call()
    synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    synchronize()
    elapsed_s = (time.perf_counter() - start) / iters
    slowest = torch.tensor([elapsed_s], dtype=torch.float64, device=_device())
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest.item())


def _device() -> Any:
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _synchronizer() -> Callable[[], None]:
    import torch

    return torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)


def ranks_per_node(dist: Any) -> int:
    """Ranks per host (hostnames gathered from every rank): what tells a calibration's scale-up tier (one host)
    from its network tier."""
    names: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(names, socket.gethostname())
    return max(1, dist.get_world_size() // len(set(names)))


def bench_collectives(dist: Any, request: CollectivesRequest) -> list[CollectiveRow]:
    """Every (op, size) of the request, in order; the same rows on every rank."""
    ranks, device, synchronize = dist.get_world_size(), _device(), _synchronizer()
    per_node = ranks_per_node(dist)
    rows = []
    for op in request.ops:
        if op == "send-recv" and ranks < 2:
            continue
        for size in request.sizes_bytes:
            count = _count(op, size, ranks)
            seconds = time_call(dist, make_call(dist, op, count, device), request.iters, request.warmup, synchronize)
            size_bytes = count * ELEMENT_BYTES
            expected = expected_busbw_gbps(op, size_bytes, request.cluster) if request.cluster else None
            rows.append(measured_row(op, size_bytes, ranks, seconds, expected, per_node))
    return rows


def expected_cluster(catalog: Callable[[], Catalog], node: str | None, network: str | None, ranks: int,
                     oversubscription: float) -> Cluster | None:
    """The cluster the model prices the collectives on: `ranks` GPUs of --node-type on --network; None without
    --node-type (`catalog()` opens the catalog, only with one)."""
    if node is None:
        if network is not None:
            raise InputError("--network needs --node-type (the node type whose GPUs the ranks are)")
        return None
    cat = catalog()
    node_spec = cat.node(node)
    net = cat.network(network or node_spec.default_network)
    return Cluster(cat.gpu(node_spec.gpu), node_spec, ranks, Fabric(net, "fat-tree", oversubscription),
                   scale_up_step_latency_s=cat.judgements().scale_up_step_latency_s)
