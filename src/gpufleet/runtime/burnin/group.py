"""Joining the process group so that a restarted group always meets.

torchrun's workers share the agent's TCPStore across restarts (TORCHELASTIC_USE_AGENT_STORE), so a restarted group
writes its gloo addresses under the same keys its killed predecessor used: a rank that reads a dead peer's address
gets "connection refused". Each round therefore uses its own key prefix (the restart count torchrun exports), and
each attempt inside a round (and each group one process forms) its own too, so that a failed attempt is retried on
a clean slate after a pause.
A single-host job whose master is a loopback address also pins gloo to the loopback interface (GLOO_SOCKET_IFNAME=lo),
since gloo otherwise binds to whatever the host name resolves to.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from gpufleet.runtime.burnin.config import Identity

LOG = logging.getLogger("gpufleet.burnin")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: Attempts to form the group in one round, and the pause before the second (doubling; judgement: a freshly
#: restarted peer needs well under a second to listen, and a dead round is better handed back to torchrun).
INIT_ATTEMPTS = 4
INIT_FIRST_PAUSE_S = 0.5
INIT_TIMEOUT_S = 60.0


def _base_store(me: Identity, timeout: timedelta) -> dist.Store:
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return dist.TCPStore(host, port, me.world_size, is_master=not agent_hosts and me.rank == 0, timeout=timeout)


def join_group(me: Identity, backend: str, phase: str = "train") -> None:
    """init_process_group with a per-round, per-attempt store prefix. Every rank posts whether its attempt worked
    and reads the others' answers, so the ranks retry together (after a doubling pause) or go on together. `phase`
    keeps the keys of successive groups in one process (measure, then train) apart."""
    if os.environ.get("MASTER_ADDR") in LOOPBACK and backend == "gloo":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    timeout = timedelta(seconds=INIT_TIMEOUT_S)
    store = _base_store(me, timeout)
    pause_s = INIT_FIRST_PAUSE_S
    for attempt in range(INIT_ATTEMPTS):
        prefix = f"gpufleet-burnin/{phase}/round{me.restart}/attempt{attempt}"
        problem = ""
        try:
            dist.init_process_group(backend, store=dist.PrefixStore(prefix, store), rank=me.rank,
                                    world_size=me.world_size, timeout=timeout)
        except (RuntimeError, dist.DistError) as error:
            problem = f"{type(error).__name__}: {error}".replace("\n", " ")[:500] or "failed"
        store.set(f"{prefix}/status/{me.rank}", problem or "ok")
        keys = [f"{prefix}/status/{rank}" for rank in range(me.world_size)]
        store.wait(keys, timeout)
        answers = {rank: store.get(key).decode() for rank, key in enumerate(keys)}
        failed = {rank: answer for rank, answer in answers.items() if answer != "ok"}
        if not failed:
            _probe(backend, me)
            return
        if dist.is_initialized():
            dist.destroy_process_group()
        if attempt == INIT_ATTEMPTS - 1:
            raise RuntimeError(f"the process group did not form in {INIT_ATTEMPTS} attempts; last: "
                               + "; ".join(f"rank {rank}: {why}" for rank, why in failed.items()))
        LOG.warning("rank %d: process group attempt %d failed (%s); retrying in %.1f s", me.rank, attempt + 1,
                    "; ".join(f"rank {rank}: {why}" for rank, why in failed.items()), pause_s)
        time.sleep(pause_s)
        pause_s *= 2


def _probe(backend: str, me: Identity) -> None:
    """One all-reduce over the new group: every pair of ranks really talks."""
    probe = torch.ones(1, device=_device(backend, me))
    dist.all_reduce(probe)
    if int(probe.item()) != me.world_size:
        raise RuntimeError(f"probe all-reduce gave {probe.item()}, expected {me.world_size}")


def _device(backend: str, me: Identity) -> torch.device:
    return torch.device("cuda", me.local_rank) if backend == "nccl" else torch.device("cpu")


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def device_for(backend: str, me: Identity) -> torch.device:
    device = _device(backend, me)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device
