"""How many destinations a MoE token reaches under each gate (perf/moe_routing.py): by hand, by a second method
(Monte-Carlo draws of the same routing, a literal replay of the gate's index arithmetic), and through the step."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.registry import load_catalog
from gpufleet.parallel.layout import Layout
from gpufleet.perf.moe_routing import (
    group_limited_destinations,
    round_robin_destinations,
    token_destinations,
    uniform_destinations,
)
from gpufleet.perf.step import StepOptions, estimate_step
from gpufleet.planner.published_runs import fitted_run_paths, framework_options, load_runs, run_step_options
from gpufleet.workload.job import Job
from test_step import cluster

CATALOG = load_catalog()
CAL = CATALOG.get("calibrations", "h100-sxm", CalibrationProfile)


def test_uniform_destinations_by_hand() -> None:
    # 16 experts on 2 nodes, top-2 without replacement: a node is missed with probability C(8,2)/C(16,2) = 28/120.
    assert uniform_destinations(16, 2, 2) == pytest.approx(2 * (1 - 28 / 120))
    assert uniform_destinations(256, 8, 1) == pytest.approx(1.0)
    assert uniform_destinations(8, 8, 8) == pytest.approx(8.0)  # top-k of all experts hits every node


@settings(deadline=None)  # 2,000 routing draws per example: tens of ms, more on a busy CI machine
@given(st.integers(0, 7), st.integers(1, 16), st.integers(0, 6))
def test_uniform_destinations_between_one_and_the_fewer_of_top_k_and_destinations(
        log_destinations: int, top_k: int, log_per_destination: int) -> None:
    # A token reaches at least one destination and at most one per routed expert or per destination; a
    # Monte-Carlo draw of the same routing agrees with the closed form (within 5 standard errors).
    destinations = 2 ** log_destinations
    experts = destinations * 2 ** log_per_destination
    assume(top_k <= experts)
    expected = uniform_destinations(experts, top_k, destinations)
    assert 1.0 - 1e-9 <= expected <= min(top_k, destinations) + 1e-9
    rng = random.Random(experts * 131 + top_k)
    draws = [len({e * destinations // experts for e in rng.sample(range(experts), top_k)}) for _ in range(2000)]
    mean = statistics.fmean(draws)
    assert mean == pytest.approx(expected, abs=max(0.01, 5 * statistics.pstdev(draws) / len(draws) ** 0.5))


def test_round_robin_keeps_a_token_on_one_node_by_hand() -> None:
    # AutoModel's FakeBalancedGate: token i gets experts 8i .. 8i+7 (mod E). DeepSeek-V3's 256 experts on 8 nodes
    # (32 each) or Qwen3-30B's 128 on 8 GPUs (16 each): every block of 8 sits in one destination. On 64 GPUs (4 each)
    # a block spans exactly two.
    assert round_robin_destinations(256, 8, 8) == 1.0
    assert round_robin_destinations(128, 8, 8) == 1.0
    assert round_robin_destinations(256, 8, 64) == 2.0
    # 12 experts, top 8, 3 destinations of 4: the blocks start at 0, 8, 4 and each covers two destinations.
    assert round_robin_destinations(12, 8, 3) == 2.0
    # 6 experts, top 4, 3 destinations of 2: blocks {0-3}, {4,5,0,1}, {2-5}: 2, 2 and 2 destinations.
    assert round_robin_destinations(6, 4, 3) == 2.0
    # 8 experts, top 3, 4 destinations of 2: 8 blocks from 3i mod 8; {0,1,2} 2, {3,4,5} 2, {6,7,0} 2, {1,2,3} 2,
    # {4,5,6} 2, {7,0,1} 2, {2,3,4} 2, {5,6,7} 2.
    assert round_robin_destinations(8, 3, 4) == 2.0


@given(st.integers(1, 64), st.integers(1, 16), st.integers(0, 5))
def test_round_robin_matches_a_replay_of_the_gate(experts_per_destination: int, top_k: int,
                                                  log_destinations: int) -> None:
    # Replay FakeBalancedGate's own arithmetic, arange(n_tokens * k).view(-1, k) % E, over E·k tokens (a whole number
    # of the gate's cycles, E / gcd(E, k) tokens each).
    destinations = 2 ** log_destinations
    experts = experts_per_destination * destinations
    assume(top_k <= experts)
    tokens = experts * top_k
    flat = list(range(tokens * top_k))
    counts = [len({(flat[t * top_k + j] % experts) // experts_per_destination for j in range(top_k)})
              for t in range(tokens)]
    assert round_robin_destinations(experts, top_k, destinations) == pytest.approx(statistics.fmean(counts))
    assert 1.0 <= round_robin_destinations(experts, top_k, destinations) <= min(top_k, destinations)


def test_node_limited_routing_by_hand() -> None:
    # DeepSeek-V3: 256 experts in 8 groups, 4 groups per token, EP over 8 nodes (one group per node). A node is
    # reached only if its group is picked (4/8), and then unless all 8 experts fall in the other 3 picked groups:
    # C(96, 8) / C(128, 8).
    miss = math.prod((96 - i) / (128 - i) for i in range(8))
    assert group_limited_destinations(256, 8, 8, 8, 4) == pytest.approx(8 * 0.5 * (1 - miss))
    assert group_limited_destinations(256, 8, 8, 8, 4) <= 4.0  # "at most M = 4 nodes"
    # On 4 nodes (two groups each): a node with j of its 2 groups picked (hypergeometric over 4 of 8) is missed with
    # probability C(128 - 32 j, 8) / C(128, 8).
    p = {j: math.comb(2, j) * math.comb(6, 4 - j) / math.comb(8, 4) for j in (0, 1, 2)}
    miss_j = {j: math.prod((128 - 32 * j - i) / (128 - i) for i in range(8)) for j in (1, 2)}
    assert group_limited_destinations(256, 8, 4, 8, 4) == pytest.approx(4 * sum(p[j] * (1 - miss_j[j]) for j in (1, 2)))
    # No real limit (every group allowed): the unlimited count.
    assert group_limited_destinations(256, 8, 8, 8, 8) == uniform_destinations(256, 8, 8)


@settings(deadline=None)  # 2,000 routing draws per example
@given(st.sampled_from([(256, 8, 8, 4), (256, 8, 8, 3), (128, 6, 16, 4), (64, 4, 4, 2)]), st.integers(0, 6))
def test_group_limited_routing_matches_monte_carlo(shape: tuple[int, int, int, int], log_destinations: int) -> None:
    # Draw the routing the closed form describes: group_topk groups uniformly, then top_k experts uniformly among
    # theirs; count the distinct destinations (experts placed in order). Within 5 standard errors of the closed
    # form, which also never exceeds the unlimited count.
    experts, top_k, groups, group_topk = shape
    destinations = 2 ** log_destinations
    assume(experts % destinations == 0 and (groups % destinations == 0 or destinations % groups == 0))
    per_group, per_destination = experts // groups, experts // destinations
    rng = random.Random(experts * 7 + destinations)
    draws = []
    for _ in range(2000):
        picked = rng.sample(range(groups), group_topk)
        allowed = [g * per_group + e for g in picked for e in range(per_group)]
        draws.append(len({e // per_destination for e in rng.sample(allowed, top_k)}))
    closed = group_limited_destinations(experts, top_k, destinations, groups, group_topk)
    assert statistics.fmean(draws) == pytest.approx(closed, abs=max(0.01, 5 * statistics.pstdev(draws) / 2000 ** 0.5))
    assert closed <= uniform_destinations(experts, top_k, destinations) + 1e-9


def test_the_router_of_the_model_sets_the_limit() -> None:
    # The catalog's DeepSeek-V3 records node-limited routing (n_group 8, topk_group 4); Qwen3-30B-A3B none.
    deepseek, qwen = CATALOG.model("deepseek-v3").moe, CATALOG.model("qwen3-30b-a3b").moe
    assert deepseek is not None and qwen is not None
    assert token_destinations(deepseek, 8, "learned") == group_limited_destinations(256, 8, 8, 8, 4)
    assert token_destinations(qwen, 8, "learned") == uniform_destinations(128, 8, 8)
    assert token_destinations(deepseek, 8, "round-robin") == 1.0


def test_round_robin_gate_cuts_the_deduplicated_all_to_all_only() -> None:
    # Qwen3-30B-A3B at 64K tokens per rank over ep 16 on 2 nodes (bandwidth-bound: test_step.py): with the dedup
    # dispatcher the EP part scales with the copies per token, 2·(1 − C(64,8)/C(128,8)) learned and 1 round-robin
    # (each block of 8 experts sits on one GPU of one node); the per-expert all-to-all sends 8 copies either way.
    job = Job(CATALOG.model("qwen3-30b-a3b"), tokens=1e12, seq_len=65536, global_batch=16)
    layout = Layout(tp=1, ep=16, dp=16, micro_batch=1)

    def ep_s(dispatch: str, routing: str) -> float:
        options = StepOptions(dp_overlap=False, ep_dispatch=dispatch, ep_routing=routing)  # type: ignore[arg-type]
        return estimate_step(job, layout, cluster(16), CAL, options).parts["comm.ep"].exposed_s

    learned_copies = 2 * (1 - math.prod((128 - 64 - i) / (128 - i) for i in range(8)))
    assert ep_s("dedup", "round-robin") / ep_s("dedup", "learned") == pytest.approx(1 / learned_copies, rel=0.02)
    assert ep_s("all-to-all", "round-robin") == ep_s("all-to-all", "learned")


def test_automodel_runs_route_round_robin_and_megatron_bridge_runs_learned() -> None:
    # The stacks say which gate a run's benchmark used: AutoModel's FakeBalancedGate, Megatron-Core's router.
    runs = {run.id: run for path in fitted_run_paths() for run in load_runs(path)}
    automodel = run_step_options(runs["automodel-h100-deepseek-v3-256gpu"], CATALOG)
    bridge = run_step_options(runs["mbridge-2602-gb200-deepseek-v3-256gpu"], CATALOG)
    assert automodel.ep_routing == "round-robin" and automodel.ep_dispatch == "dedup"
    assert bridge.ep_routing == "learned"


def test_planning_with_automodel_keeps_the_learned_router() -> None:
    # The benchmark gate is the benchmark config's choice: a user planning a real run with --stack nemo-automodel
    # gets the router as trained, and only the runs that record the gate route round-robin.
    assert framework_options(CATALOG.stack("nemo-automodel")).ep_routing == "learned"
    runs = [run for path in fitted_run_paths() for run in load_runs(path)]
    round_robin = {run.id for run in runs if run_step_options(run, CATALOG).ep_routing == "round-robin"}
    assert round_robin == {"automodel-h100-deepseek-v3-1024gpu", "automodel-h100-deepseek-v3-256gpu",
                           "automodel-h100-qwen3-30b-a3b-8gpu"}
