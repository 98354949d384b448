"""`launch --check` on Megatron-LM argument lists: the rules Megatron-LM enforces at start-up (emit/megatron_rules.py,
read from Megatron-LM core_v0.16.1) are problems naming the flag to change."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from clirun import run_gpufleet
from gpufleet.catalog.registry import load_catalog
from gpufleet.emit.build import launch_spec
from gpufleet.emit.megatron import megatron_args
from gpufleet.emit.megatron_rules import batch_rules, file_rules
from gpufleet.planner.plan import PlanRequest, make_plan
from gpufleet.planner.search import SearchSpace

pytestmark = pytest.mark.timeout(300)
DOC = Path(__file__).parents[1] / "docs" / "seed-claims.md"


def _seed_megatron_args() -> str:
    """The seed's Megatron example as docs/seed-claims.md spells it in flags (its seed-file block)."""
    found = re.search(r"<!-- seed-file: megatron_seed002.args -->\n```\n(.*?)```", DOC.read_text(), re.S)
    assert found
    return found.group(1)


def _check(path: Path, *more: str) -> tuple[int, dict]:
    ran = run_gpufleet("launch", "--check", str(path), *more, "--json")
    return ran.returncode, json.loads(ran.stdout)


def test_the_seeds_megatron_example_fails_on_its_micro_batch_arithmetic(tmp_path: Path) -> None:
    path = tmp_path / "megatron_seed002.args"
    path.write_text(_seed_megatron_args())
    code, report = _check(path, "--gpus", "128")
    assert code == 1 and not report["consistent"]
    problems = "\n".join(report["problems"])
    # tp 8 x pp 16 on 128 GPUs leaves dp 1: Megatron runs 1,024 / (4 x 1) = 256 micro-batches, not 32
    assert "micro-batch arithmetic: --num-microbatches 256 and --gradient-accumulation-steps 32 disagree" in problems
    assert "1,024 / (4 × 1) = 256 micro-batches" in problems and "drop --gradient-accumulation-steps" in problems
    for flag in ("--num-microbatches", "--gradient-accumulation-steps", "--recompute-interval"):
        assert f"{flag} is not a Megatron-LM flag" in problems
    # on 1,024 GPUs (dp 8) the count is 32: the 256 is the one that disagrees
    code, report = _check(path, "--gpus", "1024")
    assert code == 1 and "drop --num-microbatches and set" in "\n".join(report["problems"])


def _fsdp_args() -> list[str]:
    result = make_plan(PlanRequest(model="llama3-8b", tokens=1e11, gpus=64, top=5,
                                   search_space=SearchSpace(shardings=("zero3",))), load_catalog([]))
    return megatron_args(launch_spec(result, 1))


def test_emitted_fsdp_arguments_pass_and_fail_without_their_checkpoint_format(tmp_path: Path) -> None:
    args = _fsdp_args()
    assert "--use-megatron-fsdp" in args and "--ckpt-format=fsdp_dtensor" in args
    path = tmp_path / "pretrain_gpt.args"
    path.write_text("\n".join(args) + "\n")
    code, report = _check(path, "--gpus", "64")
    assert code == 0 and report["consistent"], report["problems"]
    path.write_text("\n".join(arg for arg in args if not arg.startswith("--ckpt-format")) + "\n")
    code, report = _check(path, "--gpus", "64")
    assert code == 1
    assert any("--use-megatron-fsdp needs --ckpt-format=fsdp_dtensor" in p for p in report["problems"])


@pytest.mark.parametrize(("flags", "wanted"), [
    ({"context_parallel_size": "4", "seq_length": "4100"}, "not a multiple of 2 × --context-parallel-size 4 = 8"),
    ({"tp_comm_overlap": True, "tensor_model_parallel_size": "2"}, "--tp-comm-overlap needs --sequence-parallel"),
    ({"sequence_parallel": True}, "--sequence-parallel with --tensor-model-parallel-size 1"),
    ({"num_virtual_stages_per_pipeline_rank": "2", "pipeline_model_parallel_size": "2",
      "no_overlap_p2p_communication": True}, "interleaved schedule needs --pipeline-model-parallel-size ≥ 3"),
    ({"num_virtual_stages_per_pipeline_rank": "2"}, "interleaved schedule needs --pipeline-model-parallel-size ≥ 2"),
    ({"num_layers": "30", "pipeline_model_parallel_size": "4"}, "--num-layers 30 is not divisible"),
    ({"overlap_param_gather": True, "overlap_grad_reduce": True}, "--overlap-param-gather needs --use-distributed"),
    ({"cpu_offloading": True}, "--cpu-offloading is not a Megatron-LM flag"),
    ({"ckpt_format": "fsdp_dtensor"}, "--ckpt-format=fsdp_dtensor is for Megatron FSDP only"),
])
def test_each_start_up_rule_names_the_flag(flags: dict[str, object], wanted: str) -> None:
    problems = file_rules("f.args", flags)
    assert len(problems) == 1 and wanted in problems[0], problems
    assert "core_v0.16.1" in problems[0]


def test_rules_hold_quiet_on_what_megatron_accepts() -> None:
    fine = {"context_parallel_size": "4", "seq_length": "4096", "tensor_model_parallel_size": "2",
            "sequence_parallel": True, "tp_comm_overlap": True, "pipeline_model_parallel_size": "4",
            "num_virtual_stages_per_pipeline_rank": "2", "num_layers": "32", "no_overlap_p2p_communication": True,
            "use_distributed_optimizer": True,
            "overlap_param_gather": True, "overlap_grad_reduce": True, "micro_batch_size": "2",
            "global_batch_size": "256"}
    assert file_rules("f.args", fine) == []
    stated = {**fine, "num_microbatches": "16"}
    assert batch_rules("f.args", stated, 8) == []  # 256 / (2 x 8) = 16
    assert "= 32 micro-batches" in batch_rules("f.args", stated, 4)[0]


def test_the_uneven_405b_file_launch_writes_is_consistent_and_priced_as_planned(tmp_path: Path) -> None:
    # Llama 3.1 405B on 16,384 H100: 126 layers on pp 32 x vpp 4, written as --pipeline-model-parallel-layout (the
    # check refused it as 'not divisible by --pipeline-model-parallel-size' and priced it at vpp 1)
    planned = run_gpufleet("plan", "-m", "llama3-405b", "-t", "15T", "-n", "16384", "--top", "1", "--json")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)["plans"][0]
    layout = plan["layout"]
    assert 126 % (layout["pp"] * layout["vpp"]), "the case needs the uneven split it was chosen for"
    (tmp_path / "plan.json").write_text(planned.stdout)
    wrote = run_gpufleet("launch", "--plan", str(tmp_path / "plan.json"), "--target", "megatron", "--out",
                         str(tmp_path / "run"))
    assert wrote.returncode == 0, wrote.stderr
    args = tmp_path / "run" / "megatron" / "pretrain_gpt.args"
    assert "--pipeline-model-parallel-layout=" in args.read_text()
    code, report = _check(args, "--gpus", "16384", "--model", "llama3-405b")
    assert code == 0 and report["consistent"], report
    assert report["expected"]["step_s"] == pytest.approx(plan["step_s"], rel=1e-9)
