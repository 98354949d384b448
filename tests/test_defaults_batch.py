"""Realistic defaults: the default global batch is capped at Llama 3's 16M tokens, plan says when the batch is
its own choice, and it warns when a plan's batch is too small to fill its pipeline."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clirun import run_gpufleet
from gpufleet.planner.plan import DEFAULT_BATCH_MAX_TOKENS, default_batch_rule, default_global_batch

M = 2**20


@pytest.mark.parametrize(("seq_len", "gpus", "expected"), [
    (4096, 64, 1024),  # 4M tokens / 4,096 = 1,024 sequences, more than one per GPU
    (4096, 2048, 2048),  # one sequence per GPU: 8M tokens
    (4096, 3000, 4096),  # one per GPU, rounded up to a power of two: 16M tokens, at the cap
    (4096, 16384, 4096),  # one per GPU would be 67M tokens: capped at 16M
    (8192, 16384, 2048),  # Llama 3 405B on 16,384 H100s: 2,048 sequences of 8,192 (arXiv 2407.21783, Table 4)
    (8192, 8, 512),  # 4M tokens
    (3000, 100_000, 4096),  # 16M / 3,000 = 5,592 sequences, down to a power of two
    (2**25, 8, 1),  # a sequence longer than the cap: one sequence
])
def test_default_batch_by_hand(seq_len: int, gpus: int, expected: int) -> None:
    assert default_global_batch(seq_len, gpus) == expected


@given(st.integers(min_value=128, max_value=2**20), st.integers(min_value=1, max_value=2**20))
def test_default_batch_is_a_power_of_two_within_the_cap(seq_len: int, gpus: int) -> None:
    batch = default_global_batch(seq_len, gpus)
    assert batch & (batch - 1) == 0
    assert batch * seq_len <= max(DEFAULT_BATCH_MAX_TOKENS, seq_len)
    if 2 * batch * seq_len <= DEFAULT_BATCH_MAX_TOKENS:  # where the cap does not bind: the old rule
        assert batch >= gpus and batch >= 4 * M // seq_len


def test_the_rule_names_what_set_the_batch() -> None:
    assert "capped at 16M tokens" in default_batch_rule(4096, 16384)
    assert "one sequence per GPU" in default_batch_rule(4096, 2048)
    assert "about 4M tokens" in default_batch_rule(4096, 64)


@pytest.mark.timeout(300)
def test_plan_says_whose_batch_it_is() -> None:
    args = ("plan", "-m", "llama3-8b", "-t", "1T", "-n", "32", "--top", "1")
    chosen = run_gpufleet(*args, "--json")
    assert chosen.returncode == 0, chosen.stderr
    job = json.loads(chosen.stdout)["job"]
    assert job["global_batch"] == 1024 and job["global_batch_chosen_by"] == "planner"
    assert "planner's default" in job["global_batch_rule"]
    text = run_gpufleet(*args)
    assert "batch: 1,024 sequences = 4.0M tokens, the planner's default" in " ".join(text.stdout.split())
    given_batch = json.loads(run_gpufleet(*args, "--global-batch", "256", "--json").stdout)["job"]
    assert given_batch["global_batch_chosen_by"] == "user" and "global_batch_rule" not in given_batch


@pytest.mark.timeout(300)
def test_a_batch_too_small_for_the_pipeline_is_warned_about() -> None:
    # 405B on 1,024 GPUs with 4 sequences of 8K: it fits only with a deep pipeline, which 4 micro-batches never fill
    args = ("plan", "-m", "llama3-405b", "-t", "1T", "-n", "1024", "--seq", "8192", "--global-batch", "4",
            "--top", "2")
    done = run_gpufleet(*args, "--json")
    assert done.returncode == 0, done.stderr
    for plan in json.loads(done.stdout)["plans"]:
        pp, dp, mb = plan["layout"]["pp"], plan["layout"]["dp"], plan["layout"]["micro_batch"]
        assert plan["micro_batches"] == 4 // (dp * mb)
        if plan["micro_batches"] < pp:
            assert plan["warnings"] and f"--global-batch {pp * dp * mb:,} or more" in plan["warnings"][0]
        else:
            assert plan["warnings"] == []
    assert any(plan["warnings"] for plan in json.loads(done.stdout)["plans"])
    text = " ".join(run_gpufleet(*args).stdout.split())
    assert "warning: plan #1 pushes" in text and "the pipeline never fills" in text
    full = json.loads(run_gpufleet("plan", "-m", "llama3-8b", "-t", "1T", "-n", "32", "--top", "3", "--json").stdout)
    assert all(plan["warnings"] == [] for plan in full["plans"])  # 1,024 sequences fill any pipeline here
