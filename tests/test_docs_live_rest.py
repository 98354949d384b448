"""Docs quote live output, the rest: the figures of README.md and docs/*.md that tests/test_docs_live.py and
tests/test_docs_live_more.py left out, each compared with what the command or project script that prints it prints
today (a command's --json run in process where it has one), within the doc's own rounding.

Pages: README.md (vTrain, ranking, memory peaks, input limits), memory.md, runs.md, economics.md, launch.md (the
worked example, the seeds' examples), launch-targets.md, measure.md, monitoring.md, checkpoint.md (its crash-point
counts: tests/runtime/test_crashpoints.py), report.md, plan-defaults-and-speed.md, seed-claims.md (every
"`gpufleet …` → `output`" quote), two-sites.md, residuals.md, dp-scaling.md, fabric-study.md and validation.md (each
the output of its script).

Same helpers and rules as tests/test_docs_live.py. Figures that are measured timings or ratios on a shared machine
are not a command's deterministic output: each doc marks them as measured (date, machine, command), and
`test_measured_figures_say_when_and_where` checks that the mark is there. Study scripts that take more than a few
seconds are re-run by tests marked slow; the residuals study (minutes) is checked through its committed output,
docs/data/residuals_study*.txt, which a slow test re-runs in part.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from clirun import run_gpufleet
from test_docs_live import ROOT, assert_quotes, command_json, doc
from test_docs_live_more import SEED_JOB, assert_cell, split_medians, table_row, two_sites

GIB = 2**30
RUNS = ROOT / "src" / "gpufleet" / "catalog" / "runs"


def memory_json(*args: str) -> Any:
    """`gpufleet memory ARGS --json`: exit 0 (fits) or 1 (does not fit) both print the breakdown."""
    result = run_gpufleet("memory", *args, "--json")
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def peak_gib(data: Any) -> tuple[float, float, float]:
    """The worst stage's total, its total before the overhead allowance, and its activations, in GiB."""
    stage = data["stages"][data["peak_stage"]]
    total = stage["total_bytes"]
    return total / GIB, (total - stage["bytes"]["overhead"]) / GIB, stage["bytes"]["activations"] / GIB


# ---- docs/memory.md: the torchtitan calibration table ---------------------------------------------------

#: The table's first cell -> `gpufleet memory` arguments for that run (torchtitan's settings via --stack) and the
#: measured peak in GiB the table quotes (torchtitan's benchmarks/llama3_h100_202412_torchtitan.md).
TORCHTITAN_ROWS = {
    "T1 8B, seq 8K, FSDP 8, lbs 2, selective (op) AC, eager":
        ("-m llama3-8b -n 8 --seq 8192 --micro-batch 2 --global-batch 16 --recompute selective", 82.4),
    "T3 8B, seq 8K, FSDP 128, lbs 2, selective (op) AC, eager":
        ("-m llama3-8b -n 128 --seq 8192 --micro-batch 2 --global-batch 256 --recompute selective", 67.0),
    "T2 8B, seq 32K, FSDP 8, full AC": ("-m llama3-8b -n 8 --seq 32768 --global-batch 8 --recompute full", 83.9),
    "T2 8B, seq 64K, FSDP 4 CP 2":
        ("-m llama3-8b -n 8 --cp 2 --seq 65536 --global-batch 4 --recompute full", 84.2),
    "T2 8B, seq 128K, FSDP 2 CP 4":
        ("-m llama3-8b -n 8 --cp 4 --seq 131072 --global-batch 2 --recompute full", 84.0),
    "T2 8B, seq 256K, FSDP 1 CP 8":
        ("-m llama3-8b -n 8 --cp 8 --seq 262144 --global-batch 1 --recompute full", 84.5),
    "T4 70B, seq 8K, FSDP 32 TP 8, lbs 16, full AC":
        ("-m llama3-70b -n 256 --tp 8 --seq 8192 --micro-batch 16 --global-batch 512 --recompute full", 71.9),
}


def torchtitan_memory(first_cell: str, *extra: str) -> tuple[float, float, float]:
    args, _ = TORCHTITAN_ROWS[first_cell]
    return peak_gib(memory_json(*args.split(), "-g", "h100-sxm", "--sharding", "fsdp", "--stack", "torchtitan",
                                *extra))


@pytest.mark.parametrize("first_cell", list(TORCHTITAN_ROWS))
def test_memory_torchtitan_table(first_cell: str) -> None:
    """Each row's gpufleet GiB, error against the measured peak and raw model (no allowance): `memory --stack
    torchtitan` for that run."""
    total, raw, _ = torchtitan_memory(first_cell)
    measured = TORCHTITAN_ROWS[first_cell][1]
    row = table_row(doc("docs/memory.md"), first_cell)
    assert_cell(row[2], measured)
    assert_cell(row[3], total)
    assert_cell(row[4].replace("−", "-"), total / measured - 1, scale=100)
    assert_cell(row[5], raw)


def test_memory_prose_figures() -> None:
    """The prose around the table: the raw model's shortfall, the allowance's effect, Megatron's selective policy on
    Tables 1/3, DTensor TP's share of the 70B run, and fp8's activation saving."""
    text = doc("docs/memory.md")
    errors = {cell: torchtitan_memory(cell) for cell in TORCHTITAN_ROWS}
    raw_8b = [errors[cell][1] / TORCHTITAN_ROWS[cell][1] - 1 for cell in TORCHTITAN_ROWS if " 8B" in cell]
    seventy = "T4 70B, seq 8K, FSDP 32 TP 8, lbs 16, full AC"
    assert_quotes(text, "The raw model, before the allowance, is ", -max(raw_8b), scale=100)
    assert_quotes(text, "The raw model, before the allowance, is ", -min(raw_8b), nth=1, scale=100)
    assert_quotes(text, "low for 8B and ", -(errors[seventy][1] / 71.9 - 1), scale=100)
    worst_8b = max(abs(errors[cell][0] / TORCHTITAN_ROWS[cell][1] - 1) for cell in TORCHTITAN_ROWS if " 8B" in cell)
    assert_quotes(text, "the allowance brings the 8B runs within ", worst_8b, scale=100)  # "within 3 %"
    assert worst_8b < 0.03
    assert_quotes(text, "the allowance brings the 8B runs within 3 % and leaves the 70B 2D run ",
                  -(errors[seventy][0] / 71.9 - 1), scale=100)
    megatron_tp = torchtitan_memory(seventy, "--megatron-tp")[0] / 71.9 - 1
    # the doc writes these with a minus sign (−), which the figure reader does not take as a sign
    assert_quotes(text, "that took the 70B run from −", -megatron_tp, scale=100)
    assert_quotes(text, "that took the 70B run from −14 % to −", -(errors[seventy][0] / 71.9 - 1), scale=100)
    t1, t3 = list(TORCHTITAN_ROWS)[:2]
    megatron = [torchtitan_memory(cell, "--selective-policy", "attention")[0] for cell in (t1, t3)]
    marker = "With\nMegatron's policy gpufleet predicts "
    assert_quotes(text, marker, megatron[0])
    assert_quotes(text, marker, megatron[1], nth=1)
    assert_quotes(text, marker, megatron[0] / 82.4 - 1, nth=4, scale=100)  # after "Tables 1/3"
    assert_quotes(text, marker, megatron[1] / 67.0 - 1, nth=5, scale=100)
    assert_quotes(text, "with torchtitan's,\n", errors[t1][0])
    assert_quotes(text, "with torchtitan's,\n", errors[t3][0], nth=1)
    # fp8 activation storage, Llama 3 70B at tp 4 with SP (memory's default sequence, 4,096)
    bf16 = peak_gib(memory_json("-m", "llama3-70b", "-g", "h100-sxm", "-n", "4", "--tp", "4"))[2]
    fp8 = peak_gib(memory_json("-m", "llama3-70b", "-g", "h100-sxm", "-n", "4", "--tp", "4", "--precision", "fp8"))[2]
    assert_quotes(text, "For Llama 3 70B (tp 4 + SP) this is ", 1 - fp8 / bf16, scale=100)


def test_memory_zero_paper_figures() -> None:
    """The ZeRO check's four figures, as the memory model gives them for the paper's setting (tests/test_memory.py
    holds them at the paper's own precision; the page quotes more digits)."""
    from gpufleet.workload.params import count_params
    from test_memory import _model_states, gpt

    model = gpt(hidden=4096, heads=32, layers=36)
    psi = count_params(model).total
    marker = "Ψ = 7.5B, gives "
    for nth, sharding in enumerate(("none", "zero1", "zero2", "zero3")):
        assert_quotes(doc("docs/memory.md"), marker, _model_states(model, sharding, 64) / psi * 7.5e9 / 1e9, nth=nth)


def test_dp_scaling_expected_maximum_table() -> None:
    """e(N), the expected maximum of N standard normals, as perf/dp_scaling.py computes it."""
    from gpufleet.perf.dp_scaling import expected_max_normal

    text = doc("docs/dp-scaling.md")
    counts = [int(cell.replace(",", "")) for cell in table_row(text, "N")[1:]]
    for cell, n in zip(table_row(text, "e(N)")[1:], counts, strict=True):
        assert_cell(cell, expected_max_normal(n))


# ---- README.md: the figures tests/test_docs_live*.py left out -------------------------------------------------

VTRAIN = ("validate", "--runs", str(RUNS / "vtrain_runs.yaml"), "--catalog", str(ROOT / "tests" / "data" /
                                                                                  "vtrain_cluster.yaml"),
          "--node", "vtrain-a100-node", "--no-dp-overlap", "--rank")


def test_readme_vtrain_and_ranking() -> None:
    """vTrain's 109 runs (median and worst error) and the layout ranking of its four groups (`validate --rank`):
    Spearman, the pick's regret and the smooth reference model's ceiling, group by group."""
    data = command_json(*VTRAIN)
    readme = doc("README.md")
    row = table_row(readme, "vTrain's 109 A100 runs (in no fit's set)")
    assert_cell(row[0], data["summary"]["all"]["runs"])
    assert_cell(row[1], data["summary"]["all"]["median_abs_error"], scale=100)
    assert_cell(row[1].split("worst")[1], data["summary"]["all"]["worst_abs_error"], scale=100)
    groups = data["ranking"]["groups"]
    assert "ranking on vTrain's four groups" in readme and len(groups) == 4
    for nth, group in enumerate(groups):
        assert_quotes(readme, "groups has Spearman ", group["spearman"], nth=nth)
        assert_quotes(readme, "The planner's pick comes\nwithin ", group["regret"], nth=nth, scale=100)
        assert_quotes(readme, "to the measurements themselves, reaches ", group["smooth_model_ceiling"], nth=nth)
    below = [group["group"] for group in groups if group["smooth_model_ceiling"] < 0.9]
    assert len(below) == 1 and below[0].startswith("GPT 18.4B"), below  # "the 18.4B group's scatter"


def test_readme_memory_peaks() -> None:
    """torchtitan's seven peaks: the worst |error| of the 8B runs and of the 70B run (`memory --stack torchtitan`)."""
    errors = {cell: torchtitan_memory(cell)[0] / measured - 1 for cell, (_, measured) in TORCHTITAN_ROWS.items()}
    readme = doc("README.md")
    assert_quotes(readme, "torchtitan's seven published peaks within ",
                  max(abs(e) for cell, e in errors.items() if " 8B" in cell), scale=100)
    assert_quotes(readme, "torchtitan's seven published peaks within 3 % for 8B and ",
                  max(abs(e) for cell, e in errors.items() if " 70B" in cell), scale=100)
    assert len(errors) == 7


def test_readme_input_limits() -> None:
    """The input limits the README states are the ones the readers enforce."""
    from gpufleet.bounded_yaml import MAX_NESTING_LEVELS
    from gpufleet.errors import MAX_QUOTED_CHARS
    from gpufleet.input_files import MAX_INPUT_BYTES

    readme = doc("README.md")
    assert_quotes(readme, "regular files of at most ", MAX_INPUT_BYTES / 2**20)
    assert_quotes(readme, "with lists and mappings nested at most ", MAX_NESTING_LEVELS)
    assert_quotes(readme, "A value over ", MAX_QUOTED_CHARS)


# ---- docs/plan-defaults-and-speed.md: the pipeline warning and the HBM allowance ------------------------------

def test_plan_defaults_pipeline_warning_and_allowance() -> None:
    """The quoted warning is what the quoted `plan` prints for plan #1; the allowance is the recorded fits' (fixed
    GiB + fraction of the rest), and the 79.5 GiB example's share of it follows from them."""
    text = doc("docs/plan-defaults-and-speed.md")
    command = "plan -m llama3-405b -n 128 --tp 8 --pp 16 --global-batch 4 --micro-batch 1"
    assert f"`{command}`:" in text
    plans = command_json(*command.split())["plans"]
    quoted = re.search(r"```\n(warning: plan #1 .*?)\n```", text, re.S)
    assert quoted, "the quoted warning"
    assert " ".join(quoted.group(1).split()) == f"warning: {plans[0]['warnings'][0]}"
    fixed = command_json("catalog", "show", "memory-overhead-fixed-gib")["value"]
    fraction = command_json("catalog", "show", "memory-overhead-fraction")["value"]
    assert_quotes(text, "That prediction already carries a margin on top of what the memory model counts: **", fixed)
    assert_quotes(text, "fixed** (CUDA context, cuBLAS/cuDNN workspaces, NCCL channel buffers) **plus ", fraction,
                  scale=100)
    rest = (79.5 - fixed) / (1 + fraction)
    assert_quotes(text, "so a plan shown at 79.5 of 80 GiB leaves about ", fixed + fraction * rest)
    assert_quotes(text, "to allowances, not to tensors (1.5 + 0.1 × ", rest)


# ---- docs/runs.md -------------------------------------------------------------------------------------------

def test_runs_shipped_file_counts_and_the_example() -> None:
    """The two shipped files' run counts (`validate --runs FILE`) and the example's "~40 % MFU"."""
    text = doc("docs/runs.md")
    published = command_json("validate", "--runs", str(RUNS / "published_runs.yaml"))["runs"]
    vtrain = command_json("validate", "--runs", str(RUNS / "vtrain_runs.yaml"))["runs"]
    assert_quotes(text, "`src/gpufleet/catalog/runs/published_runs.yaml`\n(", len(published))
    assert_quotes(text, "`vtrain_runs.yaml` (vTrain's ", len(vtrain))


def test_runs_example_mfu(tmp_path: Path) -> None:
    example = re.search(r"```yaml\n(.*?)```", doc("docs/runs.md"), re.S)
    assert example
    path = tmp_path / "example.yaml"
    path.write_text(example.group(1), encoding="utf-8")
    (row,) = command_json("validate", "--runs", str(path))["runs"]
    mfu = row["measured_mfu"]
    assert abs(mfu - 0.40) < 0.05, mfu  # "~40 % MFU": the measured tokens/s at gpufleet's MFU convention
    assert_quotes(doc("docs/runs.md"), "this\n                                   # example is illustrative: ~",
                  round(mfu, 1), scale=100)


# ---- docs/economics.md --------------------------------------------------------------------------------------

#: The defaults table's first cell -> (`catalog show default` key, scale to the doc's unit, which number in the cell).
FACILITY_DEFAULTS = {
    "PUE": [("pue", 1, 0)],
    "electricity": [("usd_per_kwh", 1, 0)],
    "rack power": [("rack_kw", 1, 0)],
    "usable rack units": [("rack_units_usable", 1, 0)],
    "air / rear-door limits": [("air_max_kw_per_rack", 1, 0), ("rear_door_max_kw_per_rack", 1, 1)],
    "switch power": [("switch_power_w", 1, 0)],
    "storage": [("storage_tb_per_gpu", 1, 0), ("storage_w_per_tb", 1, 1)],
    "node idle power": [("node_idle_fraction", 100, 0)],
    "typical MFU": [("typical_mfu", 1, 0)],
    "amortization": [("amortization_years", 1, 0)],
    "fleet utilization": [("fleet_utilization", 1, 0)],
    "staff": [("gpus_per_engineer", 1, 1), ("usd_per_engineer_year", 1e-3, 2)],
    "maintenance": [("maintenance_fraction_per_year", 100, 0)],
    "colocation": [("colocation_usd_per_kw_month", 1, 0), ("facility_upgrade_usd_per_kw", 1, 1)],
}


def cell_number(cell: str, nth: int) -> tuple[float, int]:
    found = re.findall(r"\d[\d,]*(?:\.\d+)?", cell)
    assert len(found) > nth, cell
    raw = found[nth].replace(",", "")
    return float(raw), len(raw.split(".")[1]) if "." in raw else 0


@pytest.mark.parametrize("first_cell", list(FACILITY_DEFAULTS))
def test_economics_facility_defaults(first_cell: str) -> None:
    """The judgement-call table's facility values are the shipped `facility_defaults: default` record."""
    record = command_json("catalog", "show", "default")
    assert record["kind"] == "facility_defaults"
    cell = table_row(doc("docs/economics.md"), first_cell)[1]
    for key, scale, nth in FACILITY_DEFAULTS[first_cell]:
        quoted, decimals = cell_number(cell, nth)
        assert quoted == pytest.approx(round(record[key] * scale, decimals)), (first_cell, key, cell, record[key])


def test_economics_reliability_defaults() -> None:
    """restart, checkpoint write and size, and the failure rate: what `gpufleet reliability` computes with them."""
    text = doc("docs/economics.md")
    big = command_json("reliability", "--gpus", "16384", "--params", "1B")
    node = command_json("reliability", "--gpus", "8", "--params", "1B")
    assert_cell(table_row(text, "restart")[1], big["restart_min"])
    assert_cell(table_row(text, "checkpoint size")[1], big["checkpoint_gb"])  # 1B parameters: GB = B/param
    write = table_row(text, "checkpoint write")[1]
    assert cell_number(write, 0)[0] == pytest.approx(node["write_gbps"])  # one node of 8 GPUs
    assert cell_number(write, 1)[0] == pytest.approx(big["write_gbps"])  # 2,048 nodes: the cap
    # 419 interruptions over 16,384 GPUs x 54 days: the job of 16,384 GPUs sees 419 / 54 a day
    assert_quotes(text, "(Llama 3 405B: ", big["interruptions_per_day"] * 54)


def test_economics_capacity_table() -> None:
    """`max_gpus` and `beyond` of each offer class, as the catalog's offers carry them."""
    text = doc("docs/economics.md")
    offers = {name: command_json("catalog", "show", name) for name in (
        "aws-p5-on-demand", "azure-nd-h100-v5-reserved-1y", "gcp-a3-highgpu-flex-start", "coreweave-h100-on-demand",
        "aws-p5-spot", "lambda-h100-on-demand", "vast-h100-marketplace")}
    rows = {"hyperscaler and neocloud on-demand, reserved, flex-start": ("aws-p5-on-demand",
                                                                        "azure-nd-h100-v5-reserved-1y",
                                                                        "gcp-a3-highgpu-flex-start",
                                                                        "coreweave-h100-on-demand"),
            "spot": ("aws-p5-spot",), "Lambda on-demand": ("lambda-h100-on-demand",),
            "Vast.ai marketplace": ("vast-h100-marketplace",)}
    for first, names in rows.items():
        row = table_row(text, first)
        for name in names:
            capacity = offers[name]["capacity"]
            assert_cell(row[1], capacity["max_gpus"])
            assert row[2] == capacity["beyond"], (first, name)


def test_economics_fabric_and_rack_scale_figures() -> None:
    """The SuperPOD switch counts the fat-tree sizing reproduces (`facility --json`: switches, all tiers together)
    and the NVL72 rack's power (`catalog show gb200-nvl72`)."""
    text = doc("docs/economics.md")
    for marker, gpus in (("(1,016 GPUs: ", "1016"), ("4,096 GPUs:\n  ", "4096")):
        start = text.index(marker) + len(marker)
        tiers = [float(n) for n in re.findall(r"\d+", re.split(r"[;)]", text[start:], maxsplit=1)[0])]
        assert sum(tiers) == command_json("facility", "--gpus", gpus, "--node", "dgx-h100")["switches"], marker
    rack = command_json("catalog", "show", "gb200-nvl72")
    assert rack["rack_scale"] is True
    assert_quotes(text, "(`rack_scale: true`: GB200 NVL72, a ", rack["max_power_w"], scale=1e-3)


def test_report_fleet_utilization_and_scaling_points() -> None:
    """docs/report.md's cost curve quotes the shipped fleet utilization; its scaling chart the factors and
    oversubscriptions the report draws."""
    from gpufleet.report.plan_figures import SCALING_FACTORS, SCALING_OVERSUBSCRIPTIONS

    text = doc("docs/report.md")
    record = command_json("catalog", "show", "default")
    assert_quotes(text, "the facility defaults' fleet utilization (", record["fleet_utilization"], scale=100)
    words = {0.25: "¼", 0.5: "½", 2.0: "2", 4.0: "4"}
    factors = ", ".join(words[f] for f in SCALING_FACTORS if f != 1.0)
    assert "degree to {} times the count".format(factors.replace(", 4", " and 4")) in text
    ratios = " and ".join(", ".join(f"{r:g}:1" for r in SCALING_OVERSUBSCRIPTIONS).rsplit(", ", 1))
    assert f"at the request's oversubscription and at {ratios}." in text


# ---- docs/launch.md: the worked example ---------------------------------------------------------------------

def test_launch_worked_example(tmp_path: Path) -> None:
    """The worked example's plan line, start line and `launch --check` verdict, as those commands print them."""
    text = doc("docs/launch.md")
    out = tmp_path / "run"
    args = ("launch", "-m", "llama3-8b", "-t", "1T", "-n", "64", "--target", "megatron", "--target", "torchtitan",
            "--target", "deepspeed")
    assert f"$ gpufleet {' '.join(args)} --out run\n" in text
    done = run_gpufleet(*args, "--out", str(out))
    assert done.returncode == 0, done.stderr
    plan_line = done.stdout.splitlines()[0]
    assert f"    {plan_line}\n" in text, plan_line
    # the start line, which the terminal wraps: its pieces joined again
    start = " ".join(part.strip() for part in done.stdout[done.stdout.index("start: "):].splitlines())
    quoted = re.search(r"\n    (start: torchrun [^\n]*?) … ([^\n]*)\n", text)
    assert quoted, "the quoted start line"
    assert start.startswith(quoted.group(1)) and start.endswith(quoted.group(2)), start
    files = [str(out / "megatron" / "pretrain_gpt.args"), str(out / "deepspeed" / "ds_config.json"),
             str(out / "torchtitan" / "gpufleet_torchtitan.py")]
    check = run_gpufleet("launch", "--check", *files, "--gpus", "64", "--model", "llama3-8b")
    assert check.returncode == 0, check.stderr
    expected = next(line for line in check.stdout.splitlines() if line.startswith("expected on "))
    assert f"    {expected}\n    consistent\n" in text, expected
    data = json.loads(run_gpufleet("launch", "--check", *files, "--gpus", "64", "--model", "llama3-8b",
                                   "--json").stdout)["expected"]
    assert_quotes(text, "expected on 64 x h100-sxm: ", data["peak_memory_bytes"] / GIB)


def test_launch_seed_deepspeed_example() -> None:
    """The seeds' DeepSpeed example on its 2,048 GPUs: the GPU count and the micro-batch the check's problems name."""
    text = doc("docs/launch.md")
    done = run_gpufleet("launch", "--check", str(ROOT / "tests" / "data" / "seed_deepspeed.json"), "--gpus", "2048",
                        "--json")
    assert done.returncode == 1, done.stderr
    problems = json.loads(done.stdout)["problems"]
    gpus = re.search(r"degrees multiply to ([\d,]+) GPUs", " ".join(problems))
    assert gpus, problems
    assert_quotes(text, "gets five problems: the degrees make ", float(gpus.group(1).replace(",", "")))
    micro = re.search(r"works out to ([\d,]+) / \((\d+) × ([\d,]+) dp\) = ([\d.]+)", " ".join(problems))
    assert micro, problems
    quoted = "the micro-batch works out to {} / ({} × {}) = {}".format(
        *(part.replace(",", "") for part in micro.groups()))
    assert quoted in text, quoted
    if importlib.util.find_spec("deepspeed") is not None:  # the config-class problem needs DeepSpeed itself
        assert len(problems) == 5


def test_launch_seed_megatron_example(tmp_path: Path) -> None:
    """The seeds' Megatron example (docs/seed-claims.md's megatron_seed002.args): exit 1, and the micro-batch
    arithmetic the check prints."""
    body = next(m["body"] for m in SEED_FILE.finditer(SEED_CLAIMS.read_text(encoding="utf-8"))
                if m["name"] == "megatron_seed002.args")
    args = tmp_path / "megatron_seed002.args"
    args.write_text(body, encoding="utf-8")
    done = run_gpufleet("launch", "--check", str(args), "--gpus", "128", "--json")
    assert done.returncode == 1, done.stderr
    problems = " ".join(json.loads(done.stdout)["problems"])
    found = re.search(r"= ([\d,]+) / \((\d+) × (\d+)\) = (\d+) micro-batches per step", problems)
    assert found, problems
    quoted = "Megatron-LM runs {} / ({} × {}) = {}\nmicro-batches per step".format(*found.groups())
    assert quoted in doc("docs/launch.md"), quoted


# ---- docs/launch-targets.md: rack-scale nodes as hosts --------------------------------------------------------

def test_launch_targets_rack_scale_hosts(tmp_path: Path) -> None:
    """144 GB200 GPUs: the plan's racks and the sbatch's hosts and GPUs per host; 142 GPUs refused per rack share."""
    text = doc("docs/launch-targets.md")
    done = run_gpufleet("launch", "-m", "llama3-70b", "-t", "1T", "-n", "144", "-g", "gb200", "--target", "slurm",
                        "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    racks = re.search(r"on 144 GPUs \((\d+) x 72\)", done.stdout)
    sbatch = (tmp_path / "run" / "job.sbatch").read_text(encoding="utf-8")
    hosts = re.search(r"#SBATCH --nodes=(\d+)", sbatch)
    per_host = re.search(r"#SBATCH --gpus-per-node=(\d+)", sbatch)
    assert racks and hosts and per_host, done.stdout
    assert_quotes(text, "each its own host with ", float(per_host.group(1)))
    assert_quotes(text, "GB200 GPUs are ", float(racks.group(1)))
    assert_quotes(text, "GB200 GPUs are 2 racks, ", float(hosts.group(1)))
    refused = run_gpufleet("launch", "-m", "llama3-70b", "-t", "1T", "-n", "142", "-g", "gb200", "--target", "slurm",
                           "--out", str(tmp_path / "odd"))
    assert refused.returncode == 2 and "71 GPUs per gb200-nvl72 rack" in refused.stderr, refused.stderr
    assert "(142 GPUs = 2 x 71) is\nrefused" in text


def test_launch_targets_signal_lead_and_time_limit(tmp_path: Path) -> None:
    """The sbatch's signal lead is 120 s plus twice the plan's checkpoint write time (`plan --json`), and the
    figures the page gives for the lead and the time limit are the emitter's."""
    import math

    from gpufleet.emit import slurm

    text = doc("docs/launch-targets.md")
    args = ("-m", "llama3-70b", "-t", "15T", "-n", "1024")
    write_s = command_json("plan", *args)["plans"][0]["reliability"]["checkpoint_write_s"]
    done = run_gpufleet("launch", *args, "--target", "slurm", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    lead = re.search(r"#SBATCH --signal=B:USR1@(\d+)", (tmp_path / "run" / "job.sbatch").read_text(encoding="utf-8"))
    assert lead and int(lead.group(1)) == math.ceil(slurm.SIGNAL_MARGIN_S + 2 * write_s), lead
    assert_quotes(text, "tells the batch shell `lead` seconds early (", slurm.SIGNAL_MARGIN_S)
    assert_quotes(text, "twice the planned checkpoint write time, or ", slurm.DEFAULT_SIGNAL_LEAD_S)
    assert_quotes(text, "asks for the predicted training time plus ", slurm.ALLOCATION_HEADROOM - 1, scale=100)
    assert_quotes(text, "(at least the signal lead plus ", slurm.MIN_WORK_S / 60)
    assert slurm.MAX_ALLOCATION_S == 24 * 3600 and "at most a day per\n  allocation" in text


# ---- docs/measure.md and docs/monitoring.md: the catalog and defaults they quote ------------------------------

def test_measure_quoted_defaults() -> None:
    """The recorded MoE host fit, the checkpoint bandwidth per node, and the bench's shortfall fraction."""
    from gpufleet.runtime.bench.busbw import SHORTFALL_FRACTION

    text = doc("docs/measure.md")
    fit = command_json("catalog", "show", "moe-host-seconds-per-kernel")
    assert_quotes(text, "`catalog/data/fits.yaml`, ", fit["value"], scale=1e6)
    node = command_json("reliability", "--gpus", "8", "--params", "1B")
    assert_quotes(text, "the measured figure replaces the per-node default (", node["write_gbps"])
    assert_quotes(text, "`shortfall` when the measured busbw is below ", SHORTFALL_FRACTION)
    help_text = run_gpufleet("doctor", "--help").stdout
    assert re.search(r"--outlier-fraction[\s\S]*?default:\s*0\.8\b", help_text), "doctor's --outlier-fraction"
    assert_quotes(text, "below `--outlier-fraction` (default ", 0.8)


def test_measure_gpu_check_settings() -> None:
    """scripts/gpu-check's step timeouts (results.json's `timeout_s`) and its nvml-vs-nvidia-smi tolerances."""
    pytest.importorskip("prometheus_client")
    from gpufleet.runtime.gpucheck.exporter_check import MIB, READINGS
    from gpufleet.runtime.gpucheck.runner import STEPS

    text = doc("docs/measure.md")
    timeouts = {step.name: step.timeout_s for step in STEPS}
    marker = "The step timeouts (loop-dense "
    for nth, name in enumerate(("loop-dense", "burnin-kill-resume", "loop-moe")):
        assert_quotes(text, marker, timeouts[name], nth=nth)
    assert_quotes(text, marker + "90 s, burnin-kill-resume 75 s, loop-moe 70 s) were\nset to keep the sum at ",
                  sum(timeouts.values()))
    readings = {reading.metric: reading for reading in READINGS}
    units = {"°C": 1.0, "W": 1.0, "MiB": MIB, "MHz": 1e6, "points": 0.01}
    rows = [cells for cells in ([cell.strip() for cell in line.strip().strip("|").split("|")]
                                for line in text.splitlines() if line.startswith("| "))
            if len(cells) == 4 and cells[1].strip("`") in readings]
    assert len(rows) == len(READINGS)
    for cells in rows:
        reading = readings[cells[1].strip("`")]
        absolute = re.match(r"([\d.]+) (°C|W|MiB|MHz|points)", cells[3])
        assert absolute, cells
        assert float(absolute.group(1)) * units[absolute.group(2)] == pytest.approx(reading.absolute), cells
        relative = re.search(r"or ([\d.]+) %", cells[3])
        assert (float(relative.group(1)) / 100 if relative else 0.0) == pytest.approx(reading.relative), cells


def test_monitoring_fake_thermal_event() -> None:
    """`exporter --fake-gpus 8 --fake-event 2:hw_thermal --once`: GPU 2's SM clock and temperature as quoted."""
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from gpufleet.runtime.monitor.straggler import DEFAULT_THRESHOLD

    done = run_gpufleet("exporter", "--fake-gpus", "8", "--fake-event", "2:hw_thermal", "--once")
    assert done.returncode == 0, done.stderr
    readings = {family.name: sample.value for family in text_string_to_metric_families(done.stdout)
                for sample in family.samples if sample.labels.get("gpu") == "2"}
    text = doc("docs/monitoring.md")
    assert_quotes(text, "also\ndrops the SM clock to ", readings["gpufleet_gpu_sm_clock_hertz"], scale=1e-6)
    assert_quotes(text, "and heats the GPU to ", readings["gpufleet_gpu_temperature_celsius"])
    assert_quotes(text, "A rank scoring below **", DEFAULT_THRESHOLD)


def test_monitoring_example_log_lines() -> None:
    """The two log lines the page shows are what StepMonitor and the straggler report print for those figures."""
    pytest.importorskip("prometheus_client")
    from gpufleet.runtime.monitor.step_monitor import StepSummary
    from gpufleet.runtime.monitor.straggler import RankStats, describe, score_ranks

    text = " ".join(doc("docs/monitoring.md").split())
    summary = StepSummary(steps=50, step_s=8.016, compute_s=None, tokens_per_s=8176, mfu=0.399, plan_ratio=0.83)
    assert f"`rank 0: {summary.line()}`" in text, summary.line()
    report = score_ranks([RankStats(0, 0.0221), RankStats(1, 0.0221), RankStats(2, 0.0661, gpu_slowed=True),
                          RankStats(3, 0.0221)])
    (line,) = describe(report, ["node014", "node015", "node017", "node018"])
    assert f"`{line}`" in text, line


# ---- docs/checkpoint.md: the limits and defaults it quotes ---------------------------------------------------
# (its crash-point counts are what tests/runtime/test_crashpoints.py counts: that test checks them against the page)

def test_checkpoint_quoted_limits_and_defaults() -> None:
    """The manifest limits, the store's proof rounds and retry back-off, close()'s wait and `ckpt upload
    --deadline`'s default, as the code and `--help` give them."""
    pytest.importorskip("torch")
    from gpufleet.runtime.checkpoint.manager import CLOSE_UPLOAD_TIMEOUT_S
    from gpufleet.runtime.checkpoint.manifest import MAX_JSON_DEPTH, MAX_MANIFEST_BYTES
    from gpufleet.runtime.checkpoint.store import PROOF_ROUNDS, TransferPolicy

    text = doc("docs/checkpoint.md")
    assert_quotes(text, "`MAX_MANIFEST_BYTES` (", MAX_MANIFEST_BYTES / 2**20)
    assert_quotes(text, "`MAX_JSON_DEPTH` (", MAX_JSON_DEPTH)
    assert_quotes(text, "(up to `PROOF_ROUNDS`, ", PROOF_ROUNDS)
    policy = TransferPolicy()
    assert_quotes(text, "has passed (`retry_after_s`, ", policy.retry_after_s)
    assert_quotes(text, "doubling up to `retry_max_s`, ", policy.retry_max_s)
    assert_quotes(text, "for up to `close(upload_timeout_s=", CLOSE_UPLOAD_TIMEOUT_S)
    help_text = " ".join(run_gpufleet("ckpt", "upload", "--help").stdout.split())
    default = re.search(r"--deadline SECONDS .*?\[default: ([\d.]+)\]", help_text)
    assert default, "ckpt upload --deadline's default"
    assert_quotes(text, "for `--deadline` seconds (default ", float(default.group(1)))


def alert_values(rule: dict[str, Any]) -> set[float]:
    """The thresholds and durations (in seconds) a shipped alert rule holds: its `for:`, its expression's ranges,
    products and numbers."""
    seconds = {"s": 1, "m": 60, "h": 3600}
    text = f"{rule['expr']} for {rule.get('for', '0s')}"
    values = {float(n) * seconds[unit] for n, unit in re.findall(r"\b(\d+)([smh])\b", text)}
    values |= {float(a) * float(b) for a, b in re.findall(r"(\d+)\s*\*\s*(\d+)", text)}
    values |= {float(n) for n in re.findall(r"(?<![\w.])(\d+(?:\.\d+)?)(?![\w.])", rule["expr"])}
    return values


def test_monitoring_alert_table_is_the_shipped_rules() -> None:
    """Each "fires when" of docs/monitoring.md's alert table: its durations and thresholds are in that alert's rule
    in the shipped alerts.yml (the straggler's score threshold is the monitor's, which sets the flag the rule reads)."""
    import yaml

    from gpufleet.runtime.monitor.straggler import DEFAULT_THRESHOLD

    rules_path = ROOT / "src" / "gpufleet" / "runtime" / "monitor" / "assets" / "alerts.yml"
    rules = {rule["alert"]: rule for group in yaml.safe_load(rules_path.read_text(encoding="utf-8"))["groups"]
             for rule in group["rules"] if "alert" in rule}
    text = doc("docs/monitoring.md")
    rows = [line for line in text.splitlines() if line.startswith("| `Gpufleet")]
    assert {re.match(r"\| `(\w+)`", row).group(1) for row in rows} == set(rules)  # type: ignore[union-attr]
    unit_s = {"min": 60, "h": 3600}
    for row in rows:
        name, fires_when = (cell.strip() for cell in row.strip("|").split("|")[:2])
        values = alert_values(rules[name.strip("`")]) | {DEFAULT_THRESHOLD}
        quoted = [float(n) * unit_s[unit] for n, unit in re.findall(r"(\d+) (min|h)\b", fires_when)]
        quoted += [float(n) for n in re.findall(r"\b(0\.\d+)\b", fires_when)]
        for value in quoted:
            assert any(value == pytest.approx(v) for v in values), (name, value, sorted(values))


# ---- docs/residuals.md: the study's configurations as `validate` flags ------------------------------------------

def signed_numbers(cell: str) -> list[tuple[float, int]]:
    """The signed figures of a cell ("+5.5 / −34.9 %", "0.2–0.8"), each with its decimals; − is a minus sign."""
    found = re.findall(r"(?<![\d.])[+-]?\d+(?:\.\d+)?", cell.replace("−", "-").replace("–", " – ").replace("…", " "))
    return [(float(raw), len(raw.split(".")[1]) if "." in raw else 0) for raw in found]


def assert_signed(cell: str, values: list[float], *, scale: float = 100) -> None:
    quoted = signed_numbers(cell)
    assert len(quoted) >= len(values), (cell, values)
    for (number, decimals), value in zip(quoted, values, strict=False):
        assert number == pytest.approx(round(value * scale, decimals), abs=0.51 * 10 ** -decimals), (cell, values)


def errors_by_id(*flags: str) -> dict[str, float]:
    return {run["id"]: run["error"] for run in command_json("validate", *flags)["runs"] if run["error"] is not None}


#: The FSDP2 table's first cell -> the runs it quotes, in order.
FSDP2_ROWS = {
    "torchtitan Llama 3.1 8B, 8 GPUs, eager / compile / fp8": (
        "torchtitan-8b-8gpu-fsdp-eager", "torchtitan-8b-8gpu-fsdp-compile", "torchtitan-8b-8gpu-fsdp-compile-fp8"),
    "torchtitan Llama 3.1 8B, 128 GPUs, eager / fp8": (
        "torchtitan-8b-128gpu-fsdp-eager", "torchtitan-8b-128gpu-fsdp-compile-fp8"),
    "torchtitan Llama 3.1 8B on H200 (Trainy), 32 / 64 GPUs": (
        "torchtitan-trainy-8b-h200-32gpu", "torchtitan-trainy-8b-h200-64gpu"),
    "NeMo AutoModel Llama 3 70B, 64 H100 (tp 1, 4 micro-batches)": ("automodel-h100-llama3-70b-64gpu",),
    "NeMo AutoModel DeepSeek-V3 1,024 / 256, Qwen3-30B": (
        "automodel-h100-deepseek-v3-1024gpu", "automodel-h100-deepseek-v3-256gpu", "automodel-h100-qwen3-30b-a3b-8gpu"),
}

#: The contention table's first cell -> the runs it quotes, in order.
CONTENTION_ROWS = {
    "MPT-7B, 8 / 128 / 512 GPUs": (
        "mpt-7b-h100-8gpu-s2048-bf16", "mpt-7b-h100-128gpu-s2048-bf16", "mpt-7b-h100-512gpu-s2048-bf16"),
    "MPT-1B, 512 GPUs (ZeRO-2)": ("mpt-1b-h100-512gpu-s2048-bf16",),
    "torchtitan 8B, 128 GPUs, fp8": ("torchtitan-8b-128gpu-fsdp-compile-fp8",),
    "Megatron-Core weak scaling 1.7B / 7.1B (tp 1 / 2)": ("mcore-h100-weak-1.7b", "mcore-h100-weak-7.1b"),
    "Megatron-Core weak scaling 32B (tp 8, `--tp-comm-overlap`)": ("mcore-h100-weak-32b",),
    "DeepSeek-V3 on 2,048 H800 (DualPipe hides the all-to-all)": ("deepseek-v3-2048xh800",),
}


#: The study's first two configurations price hidden collectives as free; the third is the shipped model.
NO_CONTENTION = ("--overlap-contention", "off")
BEFORE_STUDY = ("--no-fsdp2-copies", *NO_CONTENTION)


def test_residuals_configurations_in_sample() -> None:
    """The results table's in-sample column for the configuration before the study (`validate --no-fsdp2-copies
    --overlap-contention off`) and as shipped (contention on), vTrain's median for the shipped configuration (whose
    refit equals the recorded fits), and the recorded values the refit reproduces."""
    text = doc("docs/residuals.md")
    _, _, *before = split_medians(command_json("validate", *BEFORE_STUDY)["runs"])
    _, _, *contend = split_medians(command_json("validate")["runs"])
    assert_signed(table_row(text, "before this study")[1], before)
    assert_signed(table_row(text, "+ overlap contention (**shipped**)")[1], contend)
    vtrain = command_json(*VTRAIN)["summary"]["all"]["median_abs_error"]
    assert_signed(table_row(text, "+ overlap contention (**shipped**)")[4], [vtrain])
    fits = [command_json("catalog", "show", name)["value"] for name in (
        "in-training-fraction", "hopper-cudnn-attention-fraction", "blackwell-sustained-gemm-fraction",
        "moe-host-seconds-per-kernel")]
    marker = "With contention on, as shipped, the refit reproduces the recorded values: "
    for nth, value in enumerate(fits[:3]):
        assert_quotes(text, marker, value, nth=nth)
    assert_quotes(text, marker, fits[3], nth=3, scale=1e6)
    assert_quotes(text, "### What the MoE LOSO gap actually is: one fit identified by one source family\n\n"
                  "The host term (`moe-host-seconds-per-kernel`, ", fits[3], scale=1e6)


def test_residuals_run_tables() -> None:
    """The FSDP2 copies' before/after table (both without contention) and the contention off/on table (off / shipped),
    run by run, and the MPT-7B weak-scaling ratios."""
    text = doc("docs/residuals.md")
    shipped, before = errors_by_id(*NO_CONTENTION), errors_by_id(*BEFORE_STUDY)  # shipped: the FSDP2 copies' "after"
    contend = errors_by_id()
    for first, ids in FSDP2_ROWS.items():
        row = table_row(text, first)
        assert_signed(row[1], [before[i] for i in ids])
        assert_signed(row[2], [shipped[i] for i in ids])
    big = [i for i in shipped if i.startswith("torchtitan") and ("70b" in i or "405b" in i)]
    long_cp = [i for i in big if i.endswith("cp8-256k")]
    rest = [i for i in big if i not in long_cp]
    row = table_row(text, "torchtitan 70B / 405B (tp 8: 1/8 of the parameters per GPU)")
    assert_signed(row[1], [min(before[i] for i in rest), max(before[i] for i in rest), before[long_cp[0]]])
    slower = [(shipped[i] - before[i]) for i in big]
    assert_signed(row[2], [min(shipped[i] for i in rest), max(shipped[i] for i in rest), shipped[long_cp[0]],
                           -max(slower), -min(slower)])
    for first, ids in CONTENTION_ROWS.items():
        row = table_row(text, first)
        assert_signed(row[1], [shipped[i] for i in ids])
        assert_signed(row[2], [contend[i] for i in ids])
    targets = {run["id"]: run for run in command_json("validate")["runs"]}
    mpt = CONTENTION_ROWS["MPT-7B, 8 / 128 / 512 GPUs"]
    measured = [targets[i]["target_tokens_per_s_per_gpu"] for i in mpt]
    assert_quotes(text, "The measured ratios are 1 → ", measured[1] / measured[0], nth=0)
    assert_quotes(text, "The measured ratios are 1 → ", measured[2] / measured[0], nth=1)
    for nth, errors in ((0, shipped), (2, contend)):
        predicted = [(1 + errors[i]) * target for i, target in zip(mpt, measured, strict=True)]
        assert_quotes(text, "the model goes from ", predicted[1] / predicted[0], nth=nth)
        assert_quotes(text, "the model goes from ", predicted[2] / predicted[0], nth=nth + 1)


def test_residuals_early_stop_paragraph() -> None:
    """The cuDNN section's early-stop paragraph: where the PyTorch-native families' rows sit now (the "from" figures
    are the files before the change: history, not checked), from `validate --json`'s rows and layouts."""
    text = " ".join(doc("docs/residuals.md").split("One piece of what it hid is now found.", 1)[1].split())
    runs = {run["id"]: run for run in command_json("validate")["runs"] if run["error"] is not None}

    def full(run: dict[str, Any]) -> bool:
        return "full-rc" in run["layout"]

    titan_tp8 = [run for run in runs.values() if run["stack"] == "torchtitan@0.1" and full(run)
                 and ("70b" in run["id"] or "405b" in run["id"]) and not run["id"].endswith("256k")]
    vanilla = runs["torchtitan2025-70b-256gpu-fsdp32-tp8-bf16-vanillatp"]
    rest = [run["error"] for run in titan_tp8 if run is not vanilla]
    assert len(rest) == 6
    assert_signed(text.split("−7.1 … −1.8 % to ", 1)[1], [min(rest), max(rest)])
    assert_signed(text.split("(+6.3 → ", 1)[1], [vanilla["error"]])
    assert_signed(text.split("32k-token row goes +12.1 → ", 1)[1], [runs["torchtitan-8b-8gpu-cp1-32k"]["error"]])
    mpt = [run for run in runs.values() if run["id"].startswith("mpt-") and "-h100-" in run["id"]]
    at_2k = [run["error"] for run in mpt if full(run) and run["id"].endswith("s2048-bf16")]
    assert len(at_2k) == 5
    assert_signed(text.split("−4.1 … +0.9 % to ", 1)[1], [min(at_2k), max(at_2k)])
    assert_signed(text.split("13B row −11.6 → ", 1)[1], [runs["mpt-13b-h100-8gpu-s32768-bf16"]["error"]])
    no_recompute = [run["error"] for run in mpt if not full(run) and run["id"].endswith("-bf16")]
    assert_signed(text.split("without recompute (", 1)[1], [min(no_recompute), max(no_recompute)])


#: The dropless Qwen3-30B rows the MoE-gap paragraph follows (Megatron-Bridge 25.11 and 26.02, micro-batch 1).
DROPLESS_QWEN30 = ("mbridge-2511-b200-qwen3-30b-a3b-8gpu", "mbridge-2602-b200-qwen3-30b-a3b-8gpu",
                   "mbridge-2602-h100-qwen3-30b-a3b-16gpu")


def test_residuals_moe_fold_in_sample() -> None:
    """The Qwen3 rows' in-sample errors in the MoE-gap table (their LOSO column is the slow test's)."""
    text = doc("docs/residuals.md")
    shipped = errors_by_id()
    for run_id in (*DROPLESS_QWEN30, "mbridge-2511-b200-qwen3-235b-a22b-64gpu"):
        assert_signed(table_row(text, run_id)[1], [shipped[run_id]])
    qwen30 = [shipped[run_id] for run_id in DROPLESS_QWEN30]
    assert_signed(text.split("The Qwen3-30B rows then go from ", 1)[1][:12], [min(qwen30), max(qwen30)])


@pytest.mark.slow
def test_residuals_moe_fold_out_of_sample() -> None:
    """`validate --cross-validate` (about 30 s of CPU): the Qwen3 rows left out with Megatron-Bridge, and what that
    fold refits the host cost, cuDNN attention and Blackwell's GEMM fraction to."""
    import math

    text = doc("docs/residuals.md")
    folds = command_json("validate", "--cross-validate")["cross_validated"]
    left_out = {r["id"]: math.expm1(r["log_error"]) for r in folds["residuals"]}
    for run_id in ("mbridge-2511-b200-qwen3-30b-a3b-8gpu", "mbridge-2602-b200-qwen3-30b-a3b-8gpu",
                   "mbridge-2602-h100-qwen3-30b-a3b-16gpu", "mbridge-2511-b200-qwen3-235b-a22b-64gpu"):
        assert_signed(table_row(text, run_id)[2], [left_out[run_id]])
    qwen30 = [left_out[run_id] for run_id in DROPLESS_QWEN30]
    assert_signed(text.split("in-sample to **", 1)[1][:16], [min(qwen30), max(qwen30)])
    fitted = folds["by_source"]["megatron-bridge"]["fitted"]
    assert_quotes(text, "so the fit drops to **", fitted["moe-host-seconds-per-kernel"], scale=1e6)
    assert_quotes(text, "The same fold moves cuDNN attention to ", fitted["hopper-cudnn-attention-fraction"])
    assert_quotes(text, "and Blackwell to ", fitted["blackwell-sustained-gemm-fraction"])


# ---- docs/residuals.md: the study's refits and leave-one-source-out, from its committed output -------------------
# scripts/residuals_study.py takes about 1.5 min of CPU (three configurations, each refitted and cross-validated):
# its full output is committed as docs/data/residuals_study.txt (and --frozen-host's as
# residuals_study_frozen_host.txt); the page is checked against those here, they are checked against `validate` for
# what `validate` can say, and a slow test re-runs the study's --quick part against the committed lines.

STUDY = ROOT / "docs" / "data" / "residuals_study.txt"
FROZEN = ROOT / "docs" / "data" / "residuals_study_frozen_host.txt"
STUDY_LINE = re.compile(r"^(?P<name>\w+)\s+(?P<what>in-sample, recorded fits|in-sample, refitted|"
                        r"leave-one-source-out|vTrain)(?: \((?P<values>[^)]*)\))?[^:]*: all\s+(?P<all>[\d.]+)%"
                        r".*?(?:dense\s+(?P<dense>[\d.]+)%.*?MoE\s+(?P<moe>[\d.]+)%.*)?$", re.M)


def study_figures() -> dict[tuple[str, str], re.Match[str]]:
    return {(m["name"], m["what"]): m for m in STUDY_LINE.finditer(STUDY.read_text(encoding="utf-8"))}


def three(match: re.Match[str]) -> list[float]:
    return [float(match[key]) / 100 for key in ("all", "dense", "moe")]


def test_residuals_study_output_is_todays_in_sample() -> None:
    """The committed study output's recorded-fit lines are what `validate` gives today for each configuration."""
    figures = study_figures()
    for name, flags in (("before", BEFORE_STUDY), ("fsdp2", NO_CONTENTION), ("contend", ())):
        _, _, *medians = split_medians(command_json("validate", *flags)["runs"])
        assert three(figures[(name, "in-sample, recorded fits")]) == pytest.approx(medians, abs=0.0005), name


def test_residuals_table_from_the_study() -> None:
    """The results table's refitted, LOSO and vTrain columns and the prose and summary rows built on them."""
    text = doc("docs/residuals.md")
    figures = study_figures()
    for first, name in (("before this study", "before"), ("+ FSDP2 copies", "fsdp2"),
                        ("+ overlap contention (**shipped**)", "contend")):
        row = table_row(text, first)
        assert_signed(row[2], three(figures[(name, "in-sample, refitted")]))
        assert_signed(row[3].replace("*", ""), three(figures[(name, "leave-one-source-out")]))
        assert_signed(row[4], [float(figures[(name, "vTrain")]["all"]) / 100])
    refit = dict(item.rsplit(" ", 1) for item in figures[("fsdp2", "in-sample, refitted")]["values"].split(", "))
    marker = "Without contention, the refit moves `in_training_fraction` to "
    assert_quotes(text, marker, float(refit["in-training-fraction"]))
    assert_quotes(text, marker, float(refit["hopper-cudnn-attention-fraction"]), nth=1)
    assert_quotes(text, marker, float(refit["moe-host-seconds-per-kernel"]), nth=2, scale=1e6)
    loso = {name: three(figures[(name, "leave-one-source-out")]) for name in ("before", "fsdp2", "contend")}
    vtrain = {name: float(figures[(name, "vTrain")]["all"]) / 100 for name in ("before", "fsdp2", "contend")}
    assert_signed(text.split("vTrain's\n109 out-of-sample runs improve from ", 1)[1][:12],
                  [vtrain["fsdp2"], vtrain["contend"]])
    verdict = text.split("**Verdict: on by default.** LOSO overall (", 1)[1][:200]
    assert_signed(verdict, [loso["fsdp2"][0], loso["contend"][0], loso["fsdp2"][2], loso["contend"][2],
                            loso["contend"][1], loso["fsdp2"][1]])
    assert_signed(text.split("the term improves LOSO overall (", 1)[1][:40], [loso["before"][0], loso["fsdp2"][0],
                                                                             loso["before"][1], loso["fsdp2"][1]])
    summary = table_row(text, "compute slowed under hidden collectives")[2]
    assert_signed(summary.split("LOSO ", 1)[1], [loso["fsdp2"][0], loso["contend"][0], loso["fsdp2"][2],
                                                 loso["contend"][2], vtrain["fsdp2"], vtrain["contend"]])
    summary = table_row(text, "FSDP2 copy-out / copy-in on the compute stream")[2]
    assert_signed(summary.split("LOSO ", 1)[1], [loso["before"][0], loso["fsdp2"][0], loso["before"][1],
                                                 loso["fsdp2"][1]])


def test_residuals_frozen_host_diagnostic() -> None:
    """--frozen-host: the shipped MoE LOSO median (the study's) and what the diagnostic lowers it to, the Qwen3-30B
    rows' range and the worst run, as the page quotes them."""
    import statistics

    rows = re.findall(r"^\s+(\S+)\s+(\S+)\s+leave-one-source-out\s+([-+][\d.]+)%", FROZEN.read_text(encoding="utf-8"),
                      re.M)
    errors = {run_id: float(value) / 100 for run_id, _, value in rows}
    text = doc("docs/residuals.md")
    median = statistics.median(abs(e) for e in errors.values())
    shipped_moe_loso = three(study_figures()[("contend", "leave-one-source-out")])[2]
    for marker in ("The MoE LOSO median then falls from **", "brings MoE LOSO from ",
                   "frozen at a sourced 15 µs, MoE LOSO "):
        assert_quotes(text, marker, shipped_moe_loso, scale=100)
        assert_quotes(text, marker, median, nth=1, scale=100)
    qwen30 = [errors[run_id] for run_id in DROPLESS_QWEN30]
    assert_signed(text.split("The Qwen3-30B rows move to\n", 1)[1][:20], [min(qwen30), max(qwen30)])
    *_, moe = split_medians(command_json("validate")["runs"])
    assert_quotes(text, "The MoE LOSO median then falls from **", moe, nth=2, scale=100)  # "still above the in-sample"
    worst = min(errors, key=errors.__getitem__)
    assert_quotes(text, "and no run is worse than −", -errors[worst], scale=100)
    assert worst == "mbridge-2511-gb200-qwen3-235b-a22b-256gpu"  # "(Megatron-Bridge 25.11's Qwen3-235B on 256 GB200s)"


@pytest.mark.slow
def test_residuals_study_quick_rerun(monkeypatch: pytest.MonkeyPatch) -> None:
    """scripts/residuals_study.py --quick (the recorded-fit half, about 20 s of CPU) prints the committed lines: the
    in-sample figures of each configuration and every run that changes between them."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # the study imports its sibling dp_scaling_study
    script = load_script("residuals_study")
    argv = sys.argv
    sys.argv = ["residuals_study.py", "--quick"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            script.main()
    finally:
        sys.argv = argv
    committed = STUDY.read_text(encoding="utf-8").splitlines()
    quick = [line for line in out.getvalue().splitlines() if "vTrain" not in line]
    for line in quick:
        assert line in committed, line


# ---- docs/dp-scaling.md: the series table (per-GPU throughput relative to the smallest dp) ----------------------

#: The series table's first cell -> its runs, smallest dp first.
DP_SERIES = {
    "MPT-7B, H100, FSDP": ("mpt-7b-h100-8gpu-s2048-bf16", "mpt-7b-h100-128gpu-s2048-bf16",
                           "mpt-7b-h100-512gpu-s2048-bf16"),
    "MPT-70B, H100, FSDP": ("mpt-70b-h100-128gpu-s2048-bf16", "mpt-70b-h100-512gpu-s2048-bf16"),
    "torchtitan Llama 3.1 8B, eager": ("torchtitan-8b-8gpu-fsdp-eager", "torchtitan-8b-128gpu-fsdp-eager"),
    "torchtitan Llama 3.1 8B, fp8": ("torchtitan-8b-8gpu-fsdp-compile-fp8", "torchtitan-8b-128gpu-fsdp-compile-fp8"),
    "torchtitan Llama 3.1 8B, H200 (Trainy)": ("torchtitan-trainy-8b-h200-32gpu", "torchtitan-trainy-8b-h200-64gpu"),
    "MT-NLG 530B, tp8 pp35": ("mtnlg-530b-2240", "mtnlg-530b-2800", "mtnlg-530b-3360"),
    "Llama 3.1 405B, tp8 pp16": ("llama3-405b-8192xh100-8k", "llama3-405b-16384xh100-8k"),
}


@pytest.mark.parametrize("series", list(DP_SERIES))
def test_dp_scaling_series(series: str) -> None:
    """Measured, off (shipped) and on ("job", `validate --stragglers 0.015`) ratios of each series' per-GPU tokens/s to
    its smallest dp's."""
    row = table_row(doc("docs/dp-scaling.md"), series)
    ids = DP_SERIES[series]
    for cell, flags, key in ((row[3], (), "target_tokens_per_s_per_gpu"),
                             (row[4], (), "predicted_tokens_per_s_per_gpu"),
                             (row[5], ("--stragglers", "0.015", "--straggler-scope", "job"),
                              "predicted_tokens_per_s_per_gpu")):
        runs = {run["id"]: run for run in command_json("validate", *flags)["runs"]}
        values = [runs[i][key] / runs[ids[0]][key] for i in ids]
        assert_signed(cell.replace("*", ""), values, scale=1)


# ---- docs/seed-claims.md: every "`gpufleet …` → `output`" quote ---------------------------------------------

SEED_CLAIMS = ROOT / "docs" / "seed-claims.md"
QUOTE = re.compile(r"`(gpufleet [^`]+)` → `([^`]+)`")
SEED_FILE = re.compile(r"<!-- seed-file: (?P<name>[\w.-]+) -->\n```[a-z]*\n(?P<body>.*?)```", re.S)
QUOTED_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
#: Quotes whose output depends on the machine the test runs on, not on gpufleet: checked by their own tests.
MACHINE_DEPENDENT = ("gpufleet doctor",)
#: Commands of more than a few seconds each (searches over 1,024 GPUs, a large flow simulation).
SLOW_QUOTES = ("gpufleet plan ", "--size 200GB")


def seed_quotes() -> list[Any]:
    quotes = sorted({(m.group(1), m.group(2)) for m in QUOTE.finditer(SEED_CLAIMS.read_text(encoding="utf-8"))
                     if not m.group(1).startswith(MACHINE_DEPENDENT)})
    return [pytest.param(command, output, id=f"{command} -> {output}"[:90],
                         marks=[pytest.mark.slow] if any(s in command for s in SLOW_QUOTES) else [])
            for command, output in quotes]


def fragment_pattern(quoted: str) -> tuple[re.Pattern[str], list[str]]:
    """A pattern for a quoted output fragment: "…" stands for anything, white space for any white space, and each
    number for a number (captured, to compare within the quote's rounding); and the quoted numbers in order."""
    parts: list[str] = []
    numbers: list[str] = []
    for piece in re.split(r"(\s*…\s*|\s+|(?<![\w.])-?\d[\d,]*(?:\.\d+)?)", quoted):  # digits in a name are text
        if not piece:
            continue
        if piece.strip() == "…":
            parts.append(r"[\s\S]*?")
        elif piece.isspace():
            parts.append(r"[\s│┃]*")  # white space, or a table's column rule
        elif QUOTED_NUMBER.fullmatch(piece):
            parts.append(r"(-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?)")
            numbers.append(piece)
        else:
            parts.append(r"\s*".join(re.escape(char) for char in piece if not char.isspace()))
    return re.compile("".join(parts)), numbers


def quote_matches(output: str, quoted: str) -> bool:
    pattern, numbers = fragment_pattern(quoted)
    for match in pattern.finditer(output):
        if all(_same_figure(found, said) for found, said in zip(match.groups(), numbers, strict=True)):
            return True
    return False


def _same_figure(found: str, said: str) -> bool:
    value, quoted = float(found.replace(",", "")), float(said.replace(",", ""))
    decimals = len(said.split(".")[1]) if "." in said else 0
    return abs(round(value, decimals) - quoted) <= 0.51 * 10 ** -decimals or value == quoted


@pytest.mark.parametrize(("command", "quoted"), seed_quotes())
def test_seed_claims_quotes(command: str, quoted: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command, run in a folder holding the page's seed files, prints the quoted fragment (its stdout, or a file
    it writes under --out), each number within the quote's rounding."""
    import shlex

    for match in SEED_FILE.finditer(SEED_CLAIMS.read_text(encoding="utf-8")):
        (tmp_path / match["name"]).write_text(match["body"], encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    done = run_gpufleet(*shlex.split(command)[1:])
    written = "".join(path.read_text(encoding="utf-8", errors="replace") for path in sorted(tmp_path.rglob("*"))
                      if path.is_file() and path.parent != tmp_path)
    output = done.stdout + done.stderr + written
    assert quote_matches(output, quoted), f"{command}: {quoted!r} not in\n{output[:3000]}"


# ---- docs/fabric-study.md: the study script's own output ------------------------------------------------------

def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_docs_{name}", ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fabric_study_is_what_the_script_writes() -> None:
    """scripts/fabric_study.py regenerates the whole page (under a second): the page is its output, line for line."""
    study = load_script("fabric_study")

    class Capture:
        text = ""

        def write_text(self, text: str) -> None:
            Capture.text = text

    study.OUT = Capture()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        study.main()
    expected, quoted = Capture.text.splitlines(), doc("docs/fabric-study.md").splitlines()
    assert len(expected) == len(quoted)
    for want, have in zip(expected, quoted, strict=True):
        assert have == want


# ---- docs/two-sites.md: the rows only scripts/two_sites.py prints ----------------------------------------------

def test_two_sites_cost_walkthrough() -> None:
    """The DP-across and PP-across walk-through: Llama 3 70B's parameters, layers and hidden size (`catalog show`),
    the gradient bytes the `comm.wan` link names, the bucket latencies and the per-step boundary activations."""
    text = doc("docs/two-sites.md")
    model = command_json("catalog", "show", "llama3-70b")
    params = model["params_total"]
    assert_quotes(text, "reduction sends ", params, scale=1e-9)
    assert_quotes(text, "reduction sends 70.6 B × 4 B = ", params * 4, scale=1e-9)
    assert_quotes(text, "reduction sends 70.6 B × 4 B = 282 GB (", params * 4 / 2**30)
    assert_quotes(text, "each way. That is ", params * 4 / 25e9)
    assert_quotes(text, "Llama 3 70B under ZeRO-3 has ", model["layers"])
    assert_quotes(text, "the 5 ms link adds 80 × 2 × 5 ms = ", model["layers"] * 2 * 5e-3)
    wan = two_sites()["plans"][0]["parts"]["comm.wan"]["link"]
    assert_quotes(text, "263 GiB each way per step in\n", model["layers"])  # the link's bucket count
    assert f"in {model['layers']} buckets" in wan
    request = command_json(*SEED_JOB)["job"]
    assert_quotes(text, "sequences × tokens × hidden × 2 B = ",
                  request["global_batch"] * request["seq_len"] * model["hidden"] * 2 / 2**30)


def test_two_sites_site_limit() -> None:
    """`--sites` beyond the limit is one line naming the largest count allowed, the one the page gives."""
    from clirun import one_error_line

    line = one_error_line(run_gpufleet("plan", "-m", "llama3-70b", "-n", "2048", "--sites", "99", "--wan-gbps", "200",
                                       "--wan-latency", "5ms"))
    largest = re.search(r"at most (\d+)", line)
    assert largest, line
    text = doc("docs/two-sites.md")
    assert_quotes(text, "- `--sites`: 1 to ", float(largest.group(1)))
    assert_quotes(text, "The limit of ", float(largest.group(1)))


@pytest.mark.slow
def test_two_sites_script_rows() -> None:
    """The best PP-across plan, the seed's own tp8 pp2 layout and DP across with bf16 gradient reduction: no `plan`
    flag gives these (the script searches one arrangement, or prices one layout), so this re-runs those three parts
    of scripts/two_sites.py (the whole script takes minutes; `plan --sites` covers the other rows, in
    tests/test_docs_live_more.py) and compares the rows and the prose the page quotes from them."""
    from dataclasses import replace

    from gpufleet.catalog.registry import load_catalog
    from gpufleet.parallel.memory import MemoryAssumptions
    from gpufleet.perf.step import StepOptions, estimate_step
    from gpufleet.perf.wan import pp_across_sites, with_wan
    from gpufleet.planner.plan import build_cluster, build_job
    from gpufleet.planner.published_runs import stack_calibration
    from gpufleet.planner.search import Candidate, evaluate
    from gpufleet.planner.sites import search_sites

    script = load_script("two_sites")
    catalog = load_catalog()
    cluster, job = build_cluster(script.REQUEST, catalog), build_job(script.REQUEST, catalog)
    calibration = stack_calibration(catalog.calibration(cluster.gpu.id), None)
    single_s = command_json(*SEED_JOB)["plans"][0]["step_s"]
    pp = search_sites(job, cluster, calibration, sites=2, link=script.LINK, across=("pp",)).feasible[0]
    fitted = evaluate(job, script.SEED_LAYOUT, cluster, calibration)
    assert isinstance(fitted, Candidate)
    seed = replace(fitted, step=with_wan(fitted.step, pp_across_sites(fitted.step, job, script.SEED_LAYOUT, cluster,
                                                                      script.LINK, 2),
                                         tokens_per_step=fitted.step.tokens_per_step, gpus=cluster.gpus))
    bf16 = StepOptions(memory=MemoryAssumptions(grad_dtype="bf16"))
    half = search_sites(job, cluster, calibration, sites=2, link=script.LINK, options=bf16, across=("dp",)).feasible[0]
    text = doc("docs/two-sites.md")
    lines = text.splitlines()
    for label, candidate in (("two sites, best PP across", pp), ("two sites, the seed's tp8 pp2 (PP across)", seed),
                             ("two sites, DP across, gradients reduced in bf16", half)):
        assert script.row(label, candidate, single_s) in lines, label
    assert_quotes(text, "At 200 Gb/s, DP across beats PP across, 17.0 s against ", pp.step.step_s)
    assert_quotes(text, "is slower still (", seed.step.step_s)
    seed_link = seed.step.parts["comm.wan"].link
    hop = re.search(r"\(([\d.]+) ms; (\d+) micro-batches", seed_link)
    assert hop, seed_link
    assert_quotes(text, "is slower still (23.9 s): ", float(hop.group(2)))
    assert_quotes(text, "micro-batches, each waiting ", float(hop.group(1)))
    assert_quotes(text, "and the two-site step falls to\n", half.step.step_s)
    assert_quotes(text, "and the two-site step falls to\n", half.step.step_s / single_s, nth=1)
    alone = estimate_step(job, pp.layout, cluster, calibration)
    busy_s = pp_across_sites(alone, job, pp.layout, cluster, script.LINK, 2).total_s
    assert_quotes(text, "would still be bound by the link: at least ", busy_s)
    assert_quotes(text, "per step of link time, against ", alone.step_s)
    assert_quotes(text, "each way per micro-batch. That takes 8 GiB /\n    25 GB/s + 5 ms = ", float(hop.group(1)))
    # the layout a very fast link picks, priced on one site without the WAN
    fast = search_sites(job, cluster, calibration, sites=2, link=replace(script.LINK, gbps=6400)).feasible[0]
    assert_quotes(text, "That forces a\nlayout that is slower on its own than the one-site best (",
                  estimate_step(job, fast.layout, cluster, calibration).step_s)
    assert_quotes(text, "That forces a\nlayout that is slower on its own than the one-site best (8.39 s against ",
                  single_s)


# ---- docs/validation.md: the published runs' section, and the whole page from its script -----------------------

@cache
def published() -> Any:
    return command_json("validate", "--runs", str(RUNS / "published_runs.yaml"))


def validation_rows() -> dict[str, list[str]]:
    """The published_runs.yaml section's run table of docs/validation.md: run id -> its cells."""
    text = doc("docs/validation.md")
    section = text.split("## published_runs.yaml", 1)[1].split("\n## ", 1)[0]
    return {cells[0]: cells for cells in ([c.strip() for c in line.strip().strip("|").split("|")]
                                          for line in section.splitlines() if line.startswith("| "))}


def test_validation_published_summary() -> None:
    """The by-quality summary of published_runs.yaml: runs, median and worst |error|, worst run."""
    summary = published()["summary"]
    rows = validation_rows()
    for quality in ("high", "medium", "high+medium", "low", "all"):
        row, stats = rows[quality], summary[quality]
        assert_cell(row[1], stats["runs"])
        assert_cell(row[2], stats["median_abs_error"], scale=100)
        assert_cell(row[3], stats["worst_abs_error"], scale=100)
        assert row[4] == stats["worst_id"]
    assert_quotes(doc("docs/validation.md"), "Published layouts the memory model rejects (predicted anyway, "
                  "counted in the figures): ", summary["memory_rejected"]["runs"])


def test_validation_published_run_table() -> None:
    """Every run row: layout, predicted and target tokens/s per GPU, error."""
    rows = validation_rows()
    runs = published()["runs"]
    assert {run["id"] for run in runs} <= set(rows)
    for run in runs:
        row = rows[run["id"]]
        assert row[1] == run["quality"]
        if run["status"] != "ok":
            assert row[3] == "–"
            continue
        assert row[2] == run["layout"], run["id"]
        assert_cell(row[3], run["predicted_tokens_per_s_per_gpu"])
        assert_cell(row[4], run["target_tokens_per_s_per_gpu"])
        assert_cell(row[5].replace("−", "-"), run["error"], scale=100)


@pytest.mark.slow
def test_validation_page_is_what_its_script_writes(tmp_path: Path) -> None:
    """scripts/validation_report.py (about 30 s of CPU: cross-validation and vTrain's ranking) writes the page the
    repository holds, line for line; the pictures are not compared."""
    out = tmp_path / "validation.md"
    script = load_script("validation_report")
    argv = sys.argv
    sys.argv = ["validation_report.py", "--out", str(out)]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            script.main()
    finally:
        sys.argv = argv
    expected, quoted = out.read_text(encoding="utf-8").splitlines(), doc("docs/validation.md").splitlines()
    for want, have in zip(expected, quoted, strict=True):
        assert have == want


# ---- measured figures: timings and ratios on a shared machine say when, where and with what -------------------

#: (doc, the words that open a passage of measured figures): within the passage, a date and the word "measured".
MEASURED_PASSAGES = [
    ("docs/memory.md", "15 µs per call"),
    ("docs/burnin.md", "### On this repository's CI machine (what the test checks)"),
    ("docs/burnin.md", "the plan came out at 0.77-0.98"),  # covered by the section's opening sentence
    ("docs/burnin.md", "In wall seconds on this shared machine"),
    ("docs/burnin.md", "gave plan/burn-in"),
    ("docs/measure.md", "| collectives overhead |"),
    ("docs/measure.md", "2.2–3.3 µs per op"),
    ("docs/measure.md", "the dry path took 129 s"),
    ("docs/monitoring.md", "one scrape of 8 fake GPUs over HTTP"),
    ("docs/report.md", "plan 2.60 s"),
    ("docs/launch-targets.md", "took 8.4 s"),
    ("docs/design.md", "takes about a second"),
    ("docs/checkpoint.md", "~0.06 and ~0.10 s for 2 GiB"),
    ("README.md", "H100s in 0.8–0.9 s on 2 cores"),
]


@pytest.mark.parametrize(("name", "passage"), MEASURED_PASSAGES)
def test_measured_figures_say_when_and_where(name: str, passage: str) -> None:
    """A measured figure is not checked literally; the doc marks it measured, with a date, within 400 characters
    before or 300 after it (the machine and the command are in the same sentence)."""
    text = doc(name)
    at = text.find(passage)
    assert at >= 0, passage
    if passage == "the plan came out at 0.77-0.98":
        at = text.find("### On this repository's CI machine")
    window = text[max(0, at - 400):at + len(passage) + 300]
    assert re.search(r"[Mm]easured[^.]*?\b20\d\d-\d\d-\d\d\b|\b20\d\d-\d\d-\d\d\b[^.]*?measured", window, re.S), (
        f"{name}: {passage!r} is not marked as measured with a date")
