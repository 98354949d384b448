"""`gpufleet plan` and `gpufleet validate` through the real entry point."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from clirun import one_error_line
from clirun import run_gpufleet as gpufleet


def test_default_plan_runs_and_ranks_by_time_to_train() -> None:
    done = gpufleet("plan", "--json", "--top", "3")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    plans = data["plans"]
    assert len(plans) == 3
    assert [p["rank"] for p in plans] == [1, 2, 3]
    times = [p["time_to_train_s"] for p in plans]
    assert times == sorted(times)
    search = data["search"]
    assert search["tried"] == search["feasible"] + sum(search["infeasible"].values())
    for plan in plans:
        assert plan["peak_memory_bytes"] <= plan["hbm_bytes"]
        assert 0 < plan["mfu"] <= 1
        # time-to-train = failure-free training time / goodput
        assert plan["time_to_train_s"] >= plan["train_time_s"]


def test_piped_table_keeps_each_plan_on_one_line() -> None:
    # Piped into a file or `less` with no $COLUMNS, rich would wrap the table at 80 columns and split
    # each layout over four lines; a row must stay one line that a script can grep.
    done = gpufleet("plan", "--top", "2", env={"COLUMNS": ""})
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("│ 1 ")]
    assert len(rows) == 1 and " dp" in rows[0] and "GiB" in rows[0] and " d " in rows[0], done.stdout


def test_eager_plans_pay_for_unfused_elementwise_kernels(tmp_path: Path) -> None:
    # --eager: same layouts, slower steps (eager PyTorch's fp32 RMSNorm, rotary and SwiGLU as separate kernels);
    # the JSON, the table's header and the HTML report say which was assumed.
    fused = json.loads(gpufleet("plan", "--top", "1", "--json").stdout)
    done = gpufleet("plan", "--eager", "--top", "1", "--json")
    assert done.returncode == 0, done.stderr
    eager = json.loads(done.stdout)
    assert fused["framework"]["fused_elementwise"] and not eager["framework"]["fused_elementwise"]
    fused_best, eager_best = fused["plans"][0], eager["plans"][0]
    assert eager_best["tokens_per_s_per_gpu"] < fused_best["tokens_per_s_per_gpu"]
    # the table's header says so; with Megatron-LM's defaults it says nothing
    assert "framework: eager element-wise kernels" in gpufleet("plan", "--eager", "--top", "1").stdout
    assert "framework:" not in gpufleet("plan", "--top", "1").stdout
    report = tmp_path / "plan.html"
    assert gpufleet("plan", "--eager", "--top", "1", "--html", str(report)).returncode == 0
    assert "eager PyTorch kernels" in report.read_text(encoding="utf-8")


def test_stack_applies_a_frameworks_documented_settings() -> None:
    # torchtitan: FSDP2's fp32 parameters, op-level selective checkpointing, DTensor TP; an explicit flag wins.
    done = gpufleet("plan", "-m", "llama3-70b", "-n", "64", "--stack", "torchtitan", "--overlap-tp", "--top", "1",
                    "--json")
    assert done.returncode == 0, done.stderr
    framework = json.loads(done.stdout)["framework"]
    assert framework["stack"] == "torchtitan" and framework["fp32_params"] and framework["selective_policy"] == "op"
    assert framework["tp_gathered_inputs"] and not framework["tp_async_backward"]
    assert framework["tp_comm_overlap"]  # --overlap-tp on top of the stack
    assert not framework["activation_offload"]  # FSDP2 keeps no activations in CPU memory
    bridge = json.loads(gpufleet("plan", "--stack", "megatron-bridge", "--top", "1", "--json").stdout)["framework"]
    assert bridge["attention_kernel"] == "cudnn" and bridge["grad_dtype"] == "bf16" and bridge["tp_comm_overlap"]
    # the benchmarks' force-balanced routing is the runs' (moe_settings), not the framework's: a plan gets the
    # learned router's judged imbalance
    assert bridge["ep_imbalance"] == 1.2
    off = json.loads(gpufleet("plan", "--stack", "megatron-bridge", "--no-overlap-tp", "--top", "1",
                              "--json").stdout)["framework"]
    assert not off["tp_comm_overlap"]  # a flag can also turn a stack's setting off
    deepseek = json.loads(gpufleet("plan", "-m", "mixtral-8x7b", "-n", "64", "--stack", "deepseek-v3", "--ep-dispatch",
                                   "all-to-all", "--top", "1", "--json").stdout)["framework"]
    assert deepseek["ep_dispatch"] == "all-to-all" and deepseek["ep_comm_overlap"]
    plain = json.loads(gpufleet("plan", "-m", "llama3-70b", "-n", "64", "--top", "1", "--json").stdout)
    assert plain["framework"]["stack"] is None and plain["framework"]["grad_dtype"] == "fp32"
    # the stack reaches the estimate: torchtitan's in-line TP and op-level recompute change the best step
    assert json.loads(done.stdout)["plans"][0]["step_s"] != plain["plans"][0]["step_s"]
    # and a sweep: BLOOM's Megatron-DeepSpeed has no sequence parallelism
    sweep = json.loads(gpufleet("plan", "-m", "llama3-70b", "-n", "64,128", "--stack", "bloom-megatron-deepspeed",
                                "--json").stdout)
    assert sweep["framework"]["stack"] == "bloom-megatron-deepspeed"
    assert all("+sp" not in row["layout"]["label"] for row in sweep["sweep"] if row["fits"])


def test_dtensor_tp_shows_the_reductions_megatron_hides() -> None:
    # Llama 3 70B on 64 H100s plans tensor parallelism with SP first (tp 4 since hidden collectives slow the compute
    # under them). Each column GEMM outlasts its backward collectives, so Megatron hides them; in line (DTensor TP)
    # they add to the step. (Not a law: under SP Megatron also re-gathers the sharded input, which at high tp and
    # short GEMMs can cost more than it hides.)
    def best(*extra: str) -> dict:
        done = gpufleet("plan", "-m", "llama3-70b", "-n", "64", "--json", "--top", "1", *extra)
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout)["plans"][0])

    megatron, inline = best(), best("--dtensor-tp")
    assert megatron["layout"]["tp"] > 1 and megatron["layout"]["sequence_parallel"]
    assert inline["step_s"] > megatron["step_s"]


def test_explain_names_the_links() -> None:
    done = gpufleet("plan", "-m", "llama3-70b", "-n", "64", "--explain", "1")
    assert done.returncode == 0, done.stderr
    assert "step time by part" in done.stdout
    assert "NIC" in done.stdout or "scale-up" in done.stdout


def test_sweep_and_deadline() -> None:
    done = gpufleet("plan", "-m", "llama3-8b", "-t", "2T", "-n", "16,64,256", "--deadline", "30d", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    counts = [row["gpus"] for row in data["sweep"]]
    assert counts == [16, 64, 256]
    chosen = data["smallest_meeting_deadline"]
    meeting = [row for row in data["sweep"] if row["fits"] and row["time_to_train_s"] <= 30 * 86400]
    assert chosen == min(row["gpus"] for row in meeting)
    cheapest = min(meeting, key=lambda row: min(offer["usd"] for offer in row["cost"]["offers"]))
    assert data["cheapest_meeting_deadline"]["gpus"] == cheapest["gpus"]


def test_job_that_fits_nowhere_says_why() -> None:
    done = gpufleet("plan", "-m", "llama3-405b", "-n", "8", "--seq", "8192")
    assert done.returncode == 1
    assert "closest" in done.stderr and "GiB" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [
    ["plan", "--model", "llama9-8b"],
    ["plan", "--gpus", "0"],
    ["plan", "--gpus", "13"],
    ["plan", "--oversubscription", "1:4"],
    ["plan", "--tokens", "lots"],
    ["plan", "--precision", "fp64"],
    ["plan", "--topology", "torus"],
    ["plan", "--ep-dispatch", "ring"],
    ["plan", "--selective-policy", "some"],
    ["plan", "--stack", "megatron"],
    ["plan", "--explain", "99", "--top", "3"],
    ["plan", "--plot", "scaling.png"],  # a plot draws a sweep; one count has nothing to draw
    ["plan", "-n", "8,16", "--plot", "scaling"],  # no file type
    ["plan", "-n", "8,16", "--plot", "/nonexistent-dir/scaling.png"],
    ["plan", "--html", "report.txt"],
    ["plan", "--gpus", "64,"],
    ["plan", "--tokens", "1e400"],  # overflows to inf
    ["plan", "--deadline", "1e400d"],
    ["validate", "--runs", "/nonexistent.yaml"],
    ["validate", "--plot", "/nonexistent-dir/parity.png"],
])
def test_bad_input_is_one_line_and_exit_2(args: list[str]) -> None:
    one_error_line(gpufleet(*args))


@pytest.mark.parametrize(("args", "flag"), [
    (["plan", "--budget", "nan"], "--budget"),
    (["facility", "--gpu", "h100-sxm", "--gpus", "64", "--rack-kw", "inf"], "--rack-kw"),
    (["reliability", "--gpus", "64", "--checkpoint-gb", "-inf"], "--checkpoint-gb"),
])
def test_non_finite_numbers_are_refused_naming_the_flag(args: list[str], flag: str) -> None:
    line = one_error_line(gpufleet(*args))
    assert f"{flag} must be a finite number" in line


@pytest.mark.parametrize(("args", "expected"), [
    (["plan", "-g", ""], "-g must not be empty"),  # named as typed
    (["plan", "--node", " ", "-n", "8"], "--node must not be empty"),
    (["fabric", "build", "--gpus", "8", "--gpu", ""], "--gpu must not be empty"),
    (["plan", "--catalog", ""], "--catalog must not be empty"),  # would otherwise read every YAML file in '.'
    (["validate", "--runs="], "--runs must not be empty"),
    (["catalog", "list", ""], "KIND must not be empty"),
])
def test_an_empty_value_is_refused_instead_of_meaning_the_default(args: list[str], expected: str) -> None:
    assert expected in one_error_line(gpufleet(*args))


@pytest.mark.parametrize(("args", "expected"), [
    (["plan", "--seq", "4k"], "Invalid value for '--seq': not a whole number"),
    (["plan", "--budget", "abc"], "Invalid value for '--budget': not a number"),
    (["plan", "--seq", "0"], "--seq must be a positive number of tokens, got 0"),
    (["plan", "--tokens", "-5T"], "--tokens must be positive, got '-5T'"),
    (["plan", "--global-batch", "-3"], "--global-batch must be a positive number of sequences, got -3"),
    (["plan", "-n", "64,128", "--plot", "/proc/x.png"], "cannot write plot /proc/x.png: No such file or directory"),
])
def test_errors_read_as_sentences_not_library_messages(args: list[str], expected: str) -> None:
    line = one_error_line(gpufleet(*args))
    assert expected in line and "Errno" not in line and "Input should be" not in line


def test_a_sweep_warns_once_where_cost_cannot_be_computed() -> None:
    done = gpufleet("plan", "-n", "65536,131072", "--json")
    assert done.returncode == 0, done.stderr
    (warning,) = done.stderr.splitlines()
    assert warning.startswith("warning: step times stand, but no cost, power or goodput at 131072 GPUs")
    assert "131072 network ports" in warning and "65536" in warning


def test_validate_json_shape() -> None:
    done = gpufleet("validate", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    ids = {run["id"] for run in data["runs"]}
    assert "mpt-7b-h100-8gpu-s2048-bf16" in ids
    for run in data["runs"]:
        assert run["status"] in ("ok", "skipped")
        if run["status"] == "skipped":
            assert run["reason"]
        else:
            expected = run["predicted_tokens_per_s_per_gpu"] / run["target_tokens_per_s_per_gpu"] - 1
            assert abs(run["error"] - expected) < 1e-9
    assert {"all", "high", "medium", "low"} <= set(data["summary"])
    kernels = {run["id"]: run["attention_kernel"] for run in data["runs"]}
    assert kernels["mpt-7b-h100-8gpu-s2048-bf16"] == "flash-v1"  # llm-foundry's Triton FlashAttention-1
    stacks = {run["id"]: run["stack"] for run in data["runs"]}  # whose documented settings were applied
    assert stacks["mpt-7b-h100-8gpu-s2048-bf16"] == "llm-foundry@0.4-0.21"  # the H100 tables: PyTorch 2.1
    assert stacks["torchtitan-405b-512gpu-3d-1f1b"] == "torchtitan@0.1"


def _first_shipped_run() -> dict:
    import yaml

    from gpufleet.planner.published_runs import shipped_runs_path

    return yaml.safe_load(shipped_runs_path().read_text(encoding="utf-8"))[0]


def test_a_bad_gpu_list_echoes_what_was_typed() -> None:
    assert "--gpus '64,' (entry '')" in one_error_line(gpufleet("plan", "--gpus", "64,"))


@pytest.mark.parametrize("flags", [["--explain", "1"], ["--budget", "1e6"], ["--top", "3"]])
def test_single_plan_flags_are_refused_on_a_sweep(flags: list[str]) -> None:
    # a sweep shows one best plan per GPU count: a flag about one ranked list would be silently dropped
    for sweep in (["-n", "8,16"], ["-n", "8-16", "--deadline", "300d"]):
        assert f"{flags[0]} applies to one GPU count" in one_error_line(gpufleet("plan", *sweep, *flags))


def test_a_count_with_no_legal_layout_names_the_nearest_that_have_one() -> None:
    # 1000 = 2^3 * 5^3: with tp <= 8, pp <= 32 and cp a power of two, dp keeps a factor 5 or 25 or 125, which
    # never divides the default batch of 1024 sequences. The suggested counts are checked by planning them.
    done = gpufleet("plan", "-n", "1000")
    line = one_error_line(done)  # a count to change: bad input (exit 2), not a failed check
    assert done.stdout == ""
    assert "1024 sequences" in line
    below, above = (int(n) for n in re.search(r"legal layout: (\d+) or (\d+)", line).groups())
    assert below < 1000 < above
    for count in (below, above):
        assert gpufleet("plan", "-n", str(count), "--top", "1", "--json").returncode == 0


def test_a_sweep_labels_a_count_with_no_legal_layout_apart_from_one_that_does_not_fit() -> None:
    # llama3-70b in bf16 needs ~16 B/param of weights, gradients and Adam state: more than 8 x 80 GB unsharded
    # across dp is possible only with sharding, so 8 GPUs can still fit; 1000 GPUs has no legal split (see above)
    done = gpufleet("plan", "-n", "64,1000", "--json")
    assert done.returncode == 0, done.stderr
    rows = {row["gpus"]: row for row in json.loads(done.stdout)["sweep"]}
    assert rows[64]["fits"] and not rows[1000]["fits"]
    assert rows[1000]["verdict"] == "no legal layout" and "1024 sequences" in rows[1000]["reason"]
    table = gpufleet("plan", "-n", "64,1000")
    assert re.search(r"│ 1000 .*no legal layout", table.stdout), table.stdout
    assert "1000 .*does not fit" not in table.stdout


@pytest.mark.parametrize(("gpus", "message"), [
    ("10000000", "--gpus 10,000,000 is more than 1,048,576"),
    ("1-1000000:1", "names 1,000,000 values; at most 64"),
    ("1-1000000000:1", "names 1,000,000,000 values; at most 64"),  # counted, never built (it would take ~40 GB)
])
def test_absurd_gpu_counts_are_refused_at_once(gpus: str, message: str) -> None:
    assert message in one_error_line(gpufleet("plan", "-n", gpus, timeout=30))


def test_fabric_build_refuses_a_cluster_of_millions_before_building_its_graph() -> None:
    # radix-256 switches would let a 4M-GPU fat tree pass the topology's own size check (~5 GB of graph)
    line = one_error_line(gpufleet("fabric", "build", "--gpus", "4000000", "--network", "roce200", timeout=30))
    assert "--gpus 4,000,000 is more than 1,048,576" in line


def test_a_hopeless_count_answers_quickly() -> None:
    # the nearest-legal-count search is bounded: a count far from any legal one is refused, not searched for minutes
    # (at 999,992 GPUs the default batch is 2^20 sequences: no dp of a legal split divides it)
    done = gpufleet("plan", "-n", "999992", timeout=60)
    assert "no legal layout for this job on 999992 GPUs" in one_error_line(done)


def test_a_cluster_too_big_to_build_still_plans_and_says_why_cost_is_missing() -> None:
    # a three-tier fat tree of radix-64 switches (NDR Quantum-2) holds 64**3 / 4 = 65,536 endpoints
    done = gpufleet("plan", "-n", "131072", "--top", "1", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert "65536" in data["economics_unavailable"] and data["plans"][0]["step_s"] > 0
    assert "no cost, power or goodput" in done.stderr and "65536" in done.stderr
    broke = gpufleet("plan", "-n", "131072", "--budget", "1e9")
    assert broke.returncode == 1 and "--budget needs" in broke.stderr and len(broke.stderr.strip().splitlines()) == 1


def test_run_file_defects_are_one_line(tmp_path: object) -> None:
    from pathlib import Path

    import yaml

    binary = Path(str(tmp_path)) / "runs.yaml"
    binary.write_bytes(b"- id: \xff\xfe\x00")
    assert "not UTF-8" in one_error_line(gpufleet("validate", "--runs", str(binary)))
    empty = Path(str(tmp_path)) / "empty.yaml"
    empty.write_text("[]\n", encoding="utf-8")
    assert "holds no runs" in one_error_line(gpufleet("validate", "--runs", str(empty)))
    twice = Path(str(tmp_path)) / "twice.yaml"
    twice.write_text(yaml.safe_dump([_first_shipped_run()] * 2), encoding="utf-8")
    assert "appears twice" in one_error_line(gpufleet("validate", "--runs", str(twice)))


def test_validate_says_why_a_runs_layout_is_invalid(tmp_path: object) -> None:
    from pathlib import Path

    import yaml

    run = _first_shipped_run()
    run["layout"]["dp"] = 7  # tp*pp*dp no longer covers the run's GPUs
    path = Path(str(tmp_path)) / "bad_layout.yaml"
    path.write_text(yaml.safe_dump([run]), encoding="utf-8")
    done = gpufleet("validate", "--runs", str(path), "--json")
    # nothing could be predicted: a failed check (exit 1), the JSON still says why, and stderr says so once
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: none of the 1 runs could be predicted") and done.stderr.count("\n") == 1
    assert json.loads(done.stdout)["error"] == done.stderr.strip().removeprefix("error: ")
    (row,) = json.loads(done.stdout)["runs"]
    gpus = run["hardware"]["num_gpus"]
    assert row["status"] == "skipped" and f"= {7 * run['layout']['tp'] * run['layout']['pp']}" in row["reason"]
    assert f"has {gpus} GPUs" in row["reason"]


def test_validate_refuses_a_broken_catalog_like_every_other_command(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("gpus:\n  - id: x\n    name: [unclosed\n", encoding="utf-8")
    for args in (["validate", "--catalog", str(broken)], ["validate", "--json", "--catalog", str(broken)]):
        assert "is not valid YAML" in one_error_line(gpufleet(*args))
    assert "is not valid YAML" in one_error_line(gpufleet("validate", env={"GPUFLEET_CATALOG": str(broken)}))
    assert "does not exist" in one_error_line(gpufleet("validate", "--catalog", str(tmp_path / "nope.yaml")))


def test_validate_node_that_no_run_can_use_is_refused() -> None:
    line = one_error_line(gpufleet("validate", "--node", "ubb-mi300x"))
    assert "--node ubb-mi300x holds mi300x, which none of the" in line and "h100-sxm" in line


def test_validate_plot_shows_every_predicted_run(tmp_path: object) -> None:
    from pathlib import Path

    table = Path(str(tmp_path)) / "parity.html"
    done = gpufleet("validate", "--json", "--plot", str(table))
    assert done.returncode == 0, done.stderr
    runs = [run for run in json.loads(done.stdout)["runs"] if run["status"] == "ok"]
    rows = re.findall(r"<tr><td>([^<]+)</td><td>([^<]+)</td><td>[^<]+</td><td>[^<]+</td><td>([^<]+)</td></tr>",
                      table.read_text())
    assert [(run["id"], run["quality"], f"{run['error']:+.1%}") for run in runs] == rows
    picture = Path(str(tmp_path)) / "parity.png"
    assert gpufleet("validate", "--plot", str(picture)).returncode == 0
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fabric_model_sim_retimes_collectives_with_the_simulator() -> None:
    done = gpufleet("plan", "-m", "llama3-70b", "-n", "64", "--fabric-model", "sim", "--top", "2", "--json")
    assert done.returncode == 0, done.stderr
    plans = json.loads(done.stdout)["plans"]
    links = [part["link"] for plan in plans for name, part in plan["parts"].items()
             if part["link"] and name.startswith("comm.")]
    assert links and all(link.startswith("simulated") for link in links)


def test_sweep_plot(tmp_path: object) -> None:
    from pathlib import Path

    target = Path(str(tmp_path)) / "sweep.html"
    done = gpufleet("plan", "-n", "8,16", "--plot", str(target))
    assert done.returncode == 0, done.stderr
    text = target.read_text()
    assert "llama3-8b on h100-sxm" in text and "<td>8</td>" in text and "<td>16</td>" in text


def _held_cheapest_usd(plan: dict) -> float:
    """The cheapest offer that holds its nodes (not spot), as the budget and the table price a run."""
    offers = plan["cost"]["offers"]
    held = [o["usd"] for o in offers if o["pricing"] != "spot"]
    return min(held or [o["usd"] for o in offers])


def test_the_cheapest_cloud_is_not_a_spot_price_without_preemptions() -> None:
    done = gpufleet("plan", "-m", "llama3-8b", "-t", "1T", "-n", "64", "--top", "1", "--json")
    plan = json.loads(done.stdout)["plans"][0]
    by_name = {o["name"]: o for o in plan["cost"]["offers"]}
    assert by_name[plan["cost"]["cheapest"]]["pricing"] != "spot"
    assert any(o["pricing"] == "spot" and o["usd"] < _held_cheapest_usd(plan) for o in by_name.values())
    shown = gpufleet("plan", "-m", "llama3-8b", "-t", "1T", "-n", "64", "--top", "1")
    spot_usd = min(o["usd"] for o in by_name.values() if o["pricing"] == "spot")
    assert f"spot: ${spot_usd:,.0f}" in shown.stdout
    # docs/economics.md quotes the two figures
    held_usd = by_name[plan["cost"]["cheapest"]]["usd"]
    doc = (Path(__file__).parents[1] / "docs" / "economics.md").read_text()
    assert f"${held_usd:,.0f} on demand and ${spot_usd:,.0f} on spot" in doc


def test_budget_keeps_plans_within_it_or_says_the_cheapest() -> None:
    done = gpufleet("plan", "-n", "32", "--top", "3", "--json")
    assert done.returncode == 0, done.stderr
    plans = json.loads(done.stdout)["plans"]
    cheapest = [_held_cheapest_usd(p) for p in plans]
    budget = sorted(cheapest)[1]  # admits some plans, not necessarily all
    within = gpufleet("plan", "-n", "32", "--top", "3", "--budget", str(budget), "--json")
    assert within.returncode == 0, within.stderr
    kept = json.loads(within.stdout)["plans"]
    assert kept and all(_held_cheapest_usd(p) <= budget for p in kept)
    assert [p["time_to_train_s"] for p in kept] == sorted(p["time_to_train_s"] for p in kept)
    broke = gpufleet("plan", "-n", "32", "--budget", "1")
    assert broke.returncode == 1
    assert "budget" in broke.stderr and len(broke.stderr.strip().splitlines()) == 1


def test_a_user_calibration_profile_replaces_the_built_in_one(tmp_path: object) -> None:
    from pathlib import Path

    profile = Path(str(tmp_path)) / "measured.yaml"
    profile.write_text(
        "calibrations:\n"
        "  - id: h100-sxm\n"
        "    gemm_fraction_16bit: 0.706\n"
        "    attention_fraction: 0.33\n"
        "    hbm_fraction: 0.8\n"
        "    in_training_fraction: 1.0\n"
        "    source: a test's own measurement\n"
    )
    base = json.loads(gpufleet("plan", "-n", "8", "--top", "1", "--json").stdout)["plans"][0]
    measured = gpufleet("plan", "-n", "8", "--top", "1", "--json", "--catalog", str(profile))
    assert measured.returncode == 0, measured.stderr
    faster = json.loads(measured.stdout)["plans"][0]
    # Tensor-core kernels at 1/0.87 of their default speed: the step shrinks, by at most 13 %.
    assert faster["step_s"] < base["step_s"]
    assert faster["step_s"] >= base["step_s"] * 0.87 * 0.999


def test_html_report(tmp_path: object) -> None:
    from pathlib import Path

    target = Path(str(tmp_path)) / "plan.html"
    done = gpufleet("plan", "-n", "16", "--top", "2", "--html", str(target), "--stack", "torchtitan", "--json")
    assert done.returncode == 0, done.stderr
    plans = json.loads(done.stdout)["plans"]
    page = target.read_text()
    assert page.startswith("<!doctype html>")
    assert "torchtitan's documented settings" in page
    for plan in plans:
        assert plan["layout"]["label"] in page
    assert page.count("<figure") == page.count("<svg") == page.count("<figcaption>")  # every chart a figure
    assert "compute.gemm" in page


def test_durations_and_money_stay_readable_at_any_size() -> None:
    from gpufleet.cli._plan_output import _money
    from gpufleet.units import format_long_duration as _days

    day = 86_400.0
    assert [_days(5 * 3600), _days(3 * day), _days(400 * day), _days(5 * 365.25 * day)] == \
        ["5.0 h", "3.0 d", "400.0 d", "5 y"]
    assert _days(2e10 * 365.25 * day) == "2e+10 y"  # a 1e30-token job: no 20-digit column
    assert [_money(67_795), _money(2.5e6), _money(7.2e9), _money(6.8e22)] == \
        ["$67,795", "$2.50M", "$7.20B", "$6.8e+22"]


def test_a_node_alone_plans_for_the_gpu_it_holds() -> None:
    done = gpufleet("plan", "--node", "ubb-mi300x", "--top", "1", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cluster"]["gpu"] == "mi300x"
    refused = gpufleet("plan", "--node", "ubb-mi300x", "-g", "h100-sxm")
    assert "--node ubb-mi300x holds mi300x" in one_error_line(refused)


def test_a_sweep_shows_the_batch_each_count_ran_at() -> None:
    # the default batch is ~4M tokens (1,024 sequences at 4K) but at least one sequence per GPU, a power of two
    done = gpufleet("plan", "-n", "512,2048", "--json")
    assert done.returncode == 0, done.stderr
    assert [(row["gpus"], row["global_batch"]) for row in json.loads(done.stdout)["sweep"]] == [(512, 1024),
                                                                                           (2048, 2048)]
    shown = gpufleet("plan", "-n", "512,2048", "--precision", "fp8").stdout
    assert "at least one sequence per GPU" in shown
    assert "(fp8) on h100-sxm; MFU against the dense fp8 peak, 1,978.9 TFLOP/s" in shown  # a sweep says what it is


def test_the_peak_behind_mfu_is_named() -> None:
    done = gpufleet("plan", "--precision", "fp8", "--top", "1")
    assert done.returncode == 0, done.stderr
    assert "dense fp8 peak, 1,978.9 TFLOP/s" in done.stdout  # H100 SXM: 3,958 sparse / 2


def test_gpu_ranges_include_their_top_end_and_counts_appear_once() -> None:
    from gpufleet.units import parse_int_list

    assert parse_int_list("64-512") == [64, 128, 256, 512]
    assert parse_int_list("64-1000") == [64, 128, 256, 512, 1000]
    assert parse_int_list("64-100") == [64, 100]
    assert parse_int_list("64,64,128") == [64, 128]


def test_a_sweep_where_nothing_fits_fails_like_a_single_count() -> None:
    done = gpufleet("plan", "-n", "1000,2000")  # neither count has a layout dividing the default batch
    assert "no GPU count in the sweep has a plan" in one_error_line(done)  # counts to change: exit 2, as for one


def test_rank_by_cost_without_a_cost_fails_instead_of_ranking_by_time() -> None:
    done = gpufleet("plan", "-n", "131072", "--rank-by", "cost")
    assert done.returncode == 1 and "--rank-by cost needs" in done.stderr


@pytest.mark.parametrize(("args", "reason"), [
    (["plan", "-m", "llama3-405b", "-n", "8"], "no layout fits on 8 x h100-sxm"),
    (["plan", "-n", "64", "--budget", "1"], "budget"),
    (["plan", "-n", "16,64", "--deadline", "1h"], "no GPU count in the sweep meets the deadline of 1.0 h"),
    (["reliability", "--gpus", "1024", "--params", "70B", "--restart-min", "1e300"], "cannot make progress"),
    (["memory", "-m", "llama3-405b", "-g", "h100-sxm", "-n", "8"], "does not fit: stage 0 needs"),
])
def test_a_failed_check_exits_1_with_one_stderr_line_and_json_all_the_same(args: list[str], reason: str) -> None:
    # scripts tell "the check failed" (exit 1, a JSON document saying why) from "it crashed" (no JSON)
    for json_flag in ([], ["--json"]):
        done = gpufleet(*args, *json_flag)
        assert done.returncode == 1, done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith("error: ") and reason in line
        if json_flag:
            assert json.loads(done.stdout)["error"] == line.removeprefix("error: ")


def test_the_documented_run_file_example_validates(tmp_path: Path) -> None:
    # docs/runs.md teaches the schema with one example run: it must be a file `validate --runs` predicts
    text = (Path(__file__).parent.parent / "docs" / "runs.md").read_text(encoding="utf-8")
    example = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    path = tmp_path / "mine.yaml"
    path.write_text(example, encoding="utf-8")
    done = gpufleet("validate", "--runs", str(path), "--json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["runs"]
    assert row["status"] == "ok"
    # the example's target is what its own `how` says: global_batch*seq_len/step_time_s/num_gpus
    run = yaml.safe_load(example)[0]
    derived = run["global_batch"] * run["seq_len"] / run["measured"]["step_time_s"] / run["hardware"]["num_gpus"]
    assert abs(derived - row["target_tokens_per_s_per_gpu"]) < 0.05
