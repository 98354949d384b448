"""How many destinations (nodes, or GPUs inside one node) a MoE token's routed experts land on.

A dispatcher that sends a token once per destination (DeepEP, HybridEP: `StepOptions.ep_dispatch == "dedup"`)
moves as many copies of it as there are distinct destinations among its top-k experts. That count depends on the
gate:

* **learned** routing, as trained (Megatron-Core's router, DeepSeek-V3's): the top-k experts fall on the experts
  uniformly, without replacement. Group-limited routing (`RouterSpec.groups` / `group_topk`: Megatron-Core's
  `moe_router_num_groups` / `moe_router_group_topk`, DeepSeek-V3's node-limited routing, "each token is sent to
  at most M = 4 nodes", arXiv 2412.19437 Sec. 2.1.2) first picks `group_topk` of the groups of consecutive
  experts, then the top-k among their experts. Megatron-Core's benchmark load balancing
  (`moe_router_force_load_balancing`: random logits, core_v0.16.1 router.py) still routes through the group
  limit, so it applies to benchmark runs too.
* **round-robin**: NeMo AutoModel's benchmark gate (`FakeBalancedGate`, v0.1.0-v0.3.0
  `nemo_automodel/components/moe/layers.py`) gives token i the experts i·k … i·k + k − 1 (mod E): k consecutive
  experts, which Megatron-style expert placement keeps on one or two GPUs.

Experts are placed in order: destination d holds experts d·E/D … (d + 1)·E/D − 1 (Megatron-Core's and AutoModel's
expert-parallel layout).
"""

from __future__ import annotations

from functools import cache
from math import comb, gcd

from gpufleet.catalog.records import MoESpec
from gpufleet.catalog.stacks import EpRouting


@cache  # pure in its integers; the plan search asks the same few shapes many times
def uniform_destinations(experts: int, top_k: int, destinations: int) -> float:
    """Distinct destinations a token's top_k experts land on, experts spread evenly over `destinations` and
    chosen uniformly without replacement: N · (1 − C(E − E/N, k) / C(E, k))."""
    per_destination = experts / destinations
    miss = 1.0
    for i in range(top_k):
        miss *= max(0.0, experts - per_destination - i) / (experts - i)
    return destinations * (1.0 - miss)


@cache
def group_limited_destinations(experts: int, top_k: int, destinations: int, groups: int, group_topk: int) -> float:
    """Distinct destinations under group-limited routing: `group_topk` of `groups` groups of consecutive experts
    are chosen uniformly, then top_k experts uniformly among theirs. Exact where groups nest in destinations or
    destinations in groups; otherwise (and with no real limit) the unlimited count, which is never lower."""
    if group_topk >= groups or experts % groups or experts % destinations:
        return uniform_destinations(experts, top_k, destinations)
    per_group = experts // groups
    allowed = group_topk * per_group  # the experts a token may still choose
    if groups % destinations == 0:  # each destination holds `nested` whole groups
        nested = groups // destinations
        hit = 0.0
        for chosen in range(1, min(nested, group_topk) + 1):  # of the destination's groups among those picked
            p_chosen = comb(nested, chosen) * comb(groups - nested, group_topk - chosen) / comb(groups, group_topk)
            hit += p_chosen * (1.0 - _miss(allowed, chosen * per_group, top_k))
        return destinations * hit
    if destinations % groups == 0:  # each group spans `spread` destinations
        spread = destinations // groups
        p_group = group_topk / groups
        return destinations * p_group * (1.0 - _miss(allowed, per_group // spread, top_k))
    return uniform_destinations(experts, top_k, destinations)


@cache
def round_robin_destinations(experts: int, top_k: int, destinations: int) -> float:
    """Distinct destinations when token i gets experts i·k … i·k + k − 1 (mod E), averaged over the tokens of one
    full cycle (E / gcd(E, k) tokens)."""
    per_destination = experts / destinations
    cycle = experts // gcd(experts, top_k)
    total = 0
    for token in range(cycle):
        first = token * top_k
        total += len({int(((first + j) % experts) // per_destination) for j in range(top_k)})
    return total / cycle


def token_destinations(moe: MoESpec, destinations: int, routing: EpRouting) -> float:
    """Expected distinct destinations of one token's routed experts under `routing` (module docstring)."""
    if routing == "round-robin":
        return round_robin_destinations(moe.experts, moe.top_k, destinations)
    router = moe.router
    if router is not None and router.groups is not None and router.group_topk is not None:
        return group_limited_destinations(moe.experts, moe.top_k, destinations, router.groups, router.group_topk)
    return uniform_destinations(moe.experts, moe.top_k, destinations)


def _miss(allowed: int, inside: int, top_k: int) -> float:
    """P(none of top_k experts drawn without replacement from `allowed` falls among `inside` of them)."""
    if top_k > allowed:
        return 0.0
    return comb(allowed - inside, top_k) / comb(allowed, top_k)
