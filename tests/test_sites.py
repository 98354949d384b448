"""Training over two (or more) sites joined by a WAN: `plan --sites N --wan-gbps G --wan-latency L` (issue 22, item 4).

The WAN's cost is checked three ways: by hand from the link's numbers (bytes x 8 / Gb/s + one latency per ring
step), against the flow-level simulator on the fabric graph of two clusters joined by a WAN link (a second
method), and by its properties (a slower or longer link never makes a step faster; one site is today's plan).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clirun import one_error_line
from clirun import run_gpufleet as gpufleet
from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.registry import load_catalog
from gpufleet.errors import InputError
from gpufleet.fabric.collectives import CROSS_LEAF_HOPS
from gpufleet.fabric.graph import join_clusters
from gpufleet.fabric.simulate import simulate_ranks
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.fabric.wan import WanLink, wan_collective_cost
from gpufleet.parallel.layout import Layout
from gpufleet.perf.step import StepOptions, estimate_step
from gpufleet.perf.wan import backward_window_s, dp_across_sites, pp_across_sites, with_wan
from gpufleet.planner.plan import PlanRequest, make_plan
from gpufleet.planner.sites import MAX_SITES, search_sites
from gpufleet.units import parse_latency_s
from gpufleet.workload.job import Job

CATALOG = load_catalog()
H100 = CATALOG.gpu("h100-sxm")
DGX = CATALOG.node("dgx-h100")
NDR = CATALOG.network("ndr400")
CAL = CATALOG.get("calibrations", "h100-sxm", CalibrationProfile)
LLAMA8 = CATALOG.model("llama3-8b")
LLAMA70 = CATALOG.model("llama3-70b")
#: One message from a GPU to its site's gateway: NIC endpoint plus a leaf-spine path's switch hops.
SITE_PATH_S = NDR.endpoint_latency_s + CROSS_LEAF_HOPS * NDR.hop_latency_s


def cluster(gpus: int, network: str = "ndr400") -> Cluster:
    return Cluster(H100, DGX, gpus, Fabric(CATALOG.network(network)))


def llama3_8b_params() -> int:
    """Llama 3 8B's parameters from its published shape (32 layers, hidden 4096, 32 heads of 128, 8 KV heads,
    SwiGLU 14336, vocabulary 128256, untied embeddings, RMSNorm weights only)."""
    hidden, kv, ffn, vocab, layers = 4096, 8 * 128, 14336, 128256, 32
    attention = 2 * hidden * hidden + 2 * hidden * kv  # q and o, k and v
    mlp = 3 * hidden * ffn
    norms = 2 * hidden
    return layers * (attention + mlp + norms) + 2 * vocab * hidden + hidden


# --- the WAN's cost by hand ---------------------------------------------------------------------------------------


def test_dp_across_two_sites_by_hand() -> None:
    """DDP over two sites of 8 GPUs, Llama 3 8B whole on every GPU: each site reduces inside, then the sites
    all-reduce one replica's fp32 gradients (Megatron reduces bf16 training's gradients in fp32) over the link,
    both directions at once, in Megatron's 40M-element buckets, each an all-reduce of 2 members = 2 ring steps."""
    params = llama3_8b_params()
    assert params == pytest.approx(8.03e9, rel=1e-3)  # the published 8.03B
    site = cluster(8)
    layout = Layout(tp=1, pp=1, dp=8, micro_batch=1)
    job = Job(LLAMA8, tokens=1e12, seq_len=4096, global_batch=32)  # the whole job: 16 sequences per site
    site_step = estimate_step(Job(LLAMA8, tokens=1e12, seq_len=4096, global_batch=16), layout, site, CAL)
    link = WanLink(gbps=100, latency_s=2e-3)
    share = dp_across_sites(site_step, job, layout, site, link, 2, StepOptions(dp_overlap=False))
    gradient_bytes = params * 4
    buckets = math.ceil(params / 40e6)
    by_hand_s = gradient_bytes * 8 / 100e9 + buckets * 2 * (2e-3 + SITE_PATH_S)
    assert share.bytes_per_link_direction == pytest.approx(gradient_bytes, rel=1e-9)
    assert share.total_s == pytest.approx(by_hand_s, rel=1e-9)
    assert share.exposed_s == pytest.approx(share.total_s)  # no overlap asked for
    overlapped = dp_across_sites(site_step, job, layout, site, link, 2, StepOptions())
    assert share.total_s / LLAMA8.layers <= overlapped.exposed_s < share.total_s
    assert overlapped.hidden_s == pytest.approx(share.total_s - overlapped.exposed_s)


def test_pp_across_the_seed_sites_by_hand() -> None:
    """Seed 000's two 1,024-GPU clusters, pipeline size 2, tp 8 + SP, 70B: each micro-batch every one of the 1,024
    boundary ranks sends its 1/8 slice of 4096 tokens x 8192 hidden in bf16 (8 MiB) over the link, activations one
    way and gradients the other at once: 8 GiB / 25 GB/s + the latency, about docs/fabric-study.md's simulated
    349 ms. The stage waits for it every micro-batch and once more in the bubble ((pp - 1) x the mean stage's
    share: both stages sit on the boundary)."""
    whole = cluster(2048)
    layout = Layout(tp=8, pp=2, dp=128, sequence_parallel=True, micro_batch=1, sharding="zero1", recompute="full")
    job = Job(LLAMA70, tokens=1e12, seq_len=4096, global_batch=4096)
    step = estimate_step(job, layout, whole, CAL)
    share = pp_across_sites(step, job, layout, whole, WanLink(200, 5e-3), 2)
    crossing_s = 1024 * 8 * 2**20 * 8 / 200e9 + 5e-3 + SITE_PATH_S
    assert crossing_s == pytest.approx(0.349, abs=0.001)
    m = 4096 // 128
    assert step.micro_batches == m
    in_fabric_hop_s = step.parts["comm.pp"].exposed_s / (2 * m)
    added_s = crossing_s - in_fabric_hop_s
    assert share.total_s == pytest.approx(m * crossing_s, rel=1e-9)
    assert share.exposed_s == pytest.approx(m * added_s + added_s, rel=1e-9)
    assert share.bytes_per_link_direction == pytest.approx(m * 8 * 2**30, rel=1e-9)


@pytest.mark.parametrize(("op", "member_bytes", "site_gpus"), [
    ("all-reduce", 2**26, 16), ("send-recv", 2**23, 16), ("all-reduce", 2**20, 64), ("send-recv", 2**23, 64)])
def test_wan_cost_matches_the_flow_simulator(op: str, member_bytes: int, site_gpus: int) -> None:
    """Every GPU of one site runs `op` with its counterpart in the other at once; the flow simulator on the graph of
    two clusters joined by one WAN link (fabric.graph.join_clusters) is the second method."""
    site = cluster(site_gpus)
    graph = join_clusters(site, site, wan_gbps=200, wan_latency_s=5e-3)
    pairs = np.array([[gpu, gpu + site_gpus] for gpu in range(site_gpus)])
    simulated = simulate_ranks(graph, op, member_bytes, pairs)  # type: ignore[arg-type]
    analytical = wan_collective_cost(op, member_bytes, 2, site_gpus, WanLink(200, 5e-3), site)  # type: ignore[arg-type]
    assert analytical.time_s == pytest.approx(simulated.time_s, rel=0.01)


def test_backward_share_is_the_step_models_overlap_window() -> None:
    """perf/wan.py keeps the data-parallel overlap window of perf/step.py (the backward share of a micro-batch's
    compute): over sockets the reduction outlasts it, so the part step.py hides is exactly that window."""
    slow = cluster(16, "socket")
    layout = Layout(tp=1, pp=1, dp=16, micro_batch=1)
    step = estimate_step(Job(LLAMA8, tokens=1e12, seq_len=4096, global_batch=64), layout, slow, CAL)
    dp = step.parts["comm.dp"]
    assert dp.exposed_s > dp.total_s / LLAMA8.layers  # the window binds, not the last granule
    assert backward_window_s(step) == pytest.approx(dp.hidden_s, rel=1e-9)


def test_parts_still_add_up_to_the_step() -> None:
    site = cluster(8)
    layout = Layout(tp=1, pp=1, dp=8, micro_batch=1)
    job = Job(LLAMA8, tokens=1e12, seq_len=4096, global_batch=32)
    site_step = estimate_step(Job(LLAMA8, tokens=1e12, seq_len=4096, global_batch=16), layout, site, CAL)
    share = dp_across_sites(site_step, job, layout, site, WanLink(100, 2e-3), 2, StepOptions())
    step = with_wan(site_step, share, tokens_per_step=job.tokens_per_step, gpus=16)
    assert sum(part.exposed_s for part in step.parts.values()) == pytest.approx(step.step_s, rel=1e-9)
    assert step.gpus == 16 and step.tokens_per_step == 32 * 4096
    assert step.step_s == pytest.approx(site_step.step_s + share.exposed_s)


# --- properties ---------------------------------------------------------------------------------------------------

_SITE = cluster(8)
_DP_LAYOUT = Layout(tp=2, pp=2, dp=2, sequence_parallel=True, micro_batch=1, sharding="zero1")
_DP_JOB = Job(LLAMA8, tokens=1e12, seq_len=4096, global_batch=32)
_DP_STEP = estimate_step(Job(LLAMA8, tokens=1e12, seq_len=4096, global_batch=16), _DP_LAYOUT, _SITE, CAL)
_WHOLE = cluster(16)
_PP_LAYOUT = Layout(tp=2, pp=4, vpp=2, dp=2, sequence_parallel=True, micro_batch=1, sharding="zero1")
_PP_STEP = estimate_step(_DP_JOB, _PP_LAYOUT, _WHOLE, CAL)

gbps = st.floats(min_value=0.1, max_value=1e5)
latency = st.floats(min_value=0.0, max_value=0.2)


def _dp_step_s(link: WanLink) -> float:
    return with_wan(_DP_STEP, dp_across_sites(_DP_STEP, _DP_JOB, _DP_LAYOUT, _SITE, link, 2, StepOptions()),
                    tokens_per_step=_DP_JOB.tokens_per_step, gpus=16).step_s


def _pp_step_s(link: WanLink) -> float:
    return with_wan(_PP_STEP, pp_across_sites(_PP_STEP, _DP_JOB, _PP_LAYOUT, _WHOLE, link, 2),
                    tokens_per_step=_DP_JOB.tokens_per_step, gpus=16).step_s


@settings(max_examples=60, deadline=None)
@given(fast=gbps, slow=gbps, short=latency, long=latency)
def test_a_worse_link_never_makes_a_step_faster(fast: float, slow: float, short: float, long: float) -> None:
    fast, slow = max(fast, slow), min(fast, slow)
    short, long = min(short, long), max(short, long)
    for step_s in (_dp_step_s, _pp_step_s):
        best = step_s(WanLink(fast, short))
        assert step_s(WanLink(slow, short)) >= best * (1 - 1e-12)
        assert step_s(WanLink(fast, long)) >= best * (1 - 1e-12)
        assert best >= (_DP_STEP if step_s is _dp_step_s else _PP_STEP).step_s


@settings(max_examples=3, deadline=None)
@given(fast=st.sampled_from([50.0, 400.0, 3200.0]), factor=st.sampled_from([2.0, 8.0]),
       short=st.sampled_from([1e-4, 2e-3]))
def test_the_best_plan_over_two_sites_never_gets_faster_on_a_worse_link(fast: float, factor: float,
                                                                       short: float) -> None:
    job = Job(LLAMA8, tokens=1e12, seq_len=4096, global_batch=32)
    whole = cluster(8)

    def best_s(link: WanLink) -> float:
        found = search_sites(job, whole, CAL, sites=2, link=link)
        return found.feasible[0].step.step_s

    best = best_s(WanLink(fast, short))
    assert best_s(WanLink(fast / factor, short)) >= best
    assert best_s(WanLink(fast, short * factor)) >= best


def test_every_plan_splits_dp_or_pp_over_the_sites() -> None:
    job = Job(LLAMA8, tokens=1e12, seq_len=4096, global_batch=64)
    found = search_sites(job, cluster(32), CAL, sites=4, link=WanLink(100, 1e-3))
    assert found.feasible
    kinds = set()
    for candidate in found.feasible:
        link = candidate.step.parts["comm.wan"].link
        kind = link.split(" ")[0]
        kinds.add(kind)
        assert (kind == "DP" and candidate.layout.dp % 4 == 0) or (kind == "PP" and candidate.layout.pp % 4 == 0)
        assert candidate.step.gpus == 32 and candidate.layout.gpus == 32
    assert kinds == {"DP", "PP"}
    steps = [candidate.step.step_s for candidate in found.feasible]
    assert steps == sorted(steps)


def test_one_site_is_todays_plan() -> None:
    request = PlanRequest(model="llama3-8b", gpus=16, top=5)
    today = make_plan(request, CATALOG)
    one_site = make_plan(PlanRequest(model="llama3-8b", gpus=16, top=5, sites=1), CATALOG)
    assert [(p.layout, p.candidate.step) for p in one_site.plans] == [(p.layout, p.candidate.step)
                                                                      for p in today.plans]


# --- the CLI ------------------------------------------------------------------------------------------------------

SEED = ["plan", "-m", "llama3-70b", "-t", "15T", "-n", "2048", "--global-batch", "4096", "--top", "1", "--json"]


@pytest.mark.timeout(600)
def test_the_seeds_two_clusters_end_to_end() -> None:
    """Seed 000: two clusters of 1,024 GPUs over a 200 Gb/s link with under 5 ms of latency."""
    one = gpufleet(*SEED)
    two = gpufleet(*SEED, "--sites", "2", "--wan-gbps", "200", "--wan-latency", "5ms")
    assert one.returncode == 0 and two.returncode == 0, (one.stderr, two.stderr)
    single, split = json.loads(one.stdout)["plans"][0], json.loads(two.stdout)["plans"][0]
    wan = split["parts"]["comm.wan"]
    assert wan["link"].startswith(("DP across 2 sites", "PP across 2 sites")) and "200 Gb/s" in wan["link"]
    assert wan["exposed_s"] > 0
    assert "comm.wan" not in single["parts"]
    assert split["step_s"] > single["step_s"]
    assert split["step_s"] == pytest.approx(sum(part["exposed_s"] for part in split["parts"].values()), rel=1e-6)
    layout = split["layout"]
    assert layout["tp"] * layout["pp"] * layout["dp"] * layout["cp"] == 2048
    request = json.loads(two.stdout)["request"]
    assert (request["sites"], request["wan_gbps"], request["wan_latency_s"]) == (2, 200, 0.005)


@pytest.mark.timeout(120)
def test_the_table_says_the_plan_is_over_sites() -> None:
    """A reader of the table (not only of --explain) learns that the plans are over two sites, and the link."""
    shown = gpufleet("plan", "-m", "llama3-8b", "-n", "64", "--sites", "2", "--wan-gbps", "100", "--wan-latency", "2ms")
    assert shown.returncode == 0, shown.stderr
    assert "over 2 sites of 32 GPUs, joined by 100 Gb/s at 2 ms one way" in shown.stdout
    assert "sites" not in gpufleet("plan", "-m", "llama3-8b", "-n", "64").stdout.split("layouts tried")[0]


@pytest.mark.timeout(120)
def test_sites_1_prints_todays_plan() -> None:
    base = ["plan", "-m", "llama3-8b", "-n", "16", "--json"]
    today, one_site = gpufleet(*base), gpufleet(*base, "--sites", "1")
    assert today.returncode == 0 and one_site.returncode == 0
    assert json.loads(today.stdout)["plans"] == json.loads(one_site.stdout)["plans"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("args", "expected"), [
    (["--sites", str(MAX_SITES + 1), "--wan-gbps", "200", "--wan-latency", "5ms"], f"at most {MAX_SITES}"),
    (["--sites", "0"], f"at most {MAX_SITES}"),
    (["--wan-gbps", "200"], "--wan-gbps describes the link between sites"),
    (["--sites", "1", "--wan-gbps", "200", "--wan-latency", "5ms"], "with --sites 2 or more"),
    (["--sites", "2"], "needs the link between the sites: --wan-gbps and --wan-latency"),
    (["--sites", "2", "--wan-gbps", "200"], "needs the link between the sites: --wan-latency"),
    (["--sites", "2", "--wan-gbps", "200", "--wan-latency", "5"], "not a latency with its unit"),
    (["--sites", "2", "--wan-gbps", "-1", "--wan-latency", "5ms"], "--wan-gbps must be a positive number"),
    (["--sites", "2", "--wan-gbps", "nan", "--wan-latency", "5ms"], "--wan-gbps must be a finite number"),
    (["--sites", "3", "--wan-gbps", "200", "--wan-latency", "5ms", "-n", "64"], "does not split evenly over 3"),
    (["--sites", "2", "--wan-gbps", "200", "--wan-latency", "5ms", "-n", "64,100,129"], "--gpus 129"),
    (["--sites", "2", "--wan-gbps", "200", "--wan-latency", "5ms", "--fabric-model", "sim"], "does not model the WAN"),
])
def test_bad_site_input_is_one_line_and_exit_2(args: list[str], expected: str) -> None:
    assert expected in one_error_line(gpufleet("plan", "-m", "llama3-8b", *args, timeout=60))


@pytest.mark.parametrize(("text", "seconds"), [("5ms", 5e-3), ("800us", 800e-6), ("800µs", 800e-6),
                                               ("40ns", 40e-9), ("0.02s", 0.02), ("1.5 ms", 1.5e-3)])
def test_latencies_are_read_with_their_unit(text: str, seconds: float) -> None:
    assert parse_latency_s(text, "--wan-latency") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["5", "5min", "0ms", "-5ms", "fast", "1e400ms"])
def test_a_latency_without_a_short_unit_or_not_positive_is_refused(text: str) -> None:
    with pytest.raises(InputError, match="--wan-latency"):
        parse_latency_s(text, "--wan-latency")


@pytest.mark.timeout(120)
def test_launch_refuses_a_plan_over_sites(tmp_path: Path) -> None:
    done = gpufleet("plan", "-m", "llama3-8b", "-n", "16", "--sites", "2", "--wan-gbps", "100", "--wan-latency",
                    "2ms", "--top", "1", "--json")
    assert done.returncode == 0, done.stderr
    saved = tmp_path / "two-sites.json"
    saved.write_text(done.stdout)
    line = one_error_line(gpufleet("launch", "--plan", str(saved), "--target", "all", "--out", str(tmp_path / "run"),
                                      timeout=60))
    assert "plan over 2 sites" in line
    assert not (tmp_path / "run").exists()
