"""`launch --check` with none of the framework extras (deepspeed, megatron, torchtitan): the checks that need no
framework (degrees against the GPU count, batch arithmetic, whole micro-batches, Megatron-LM's start-up rules, memory
and step) still run and fail with exit 1, and one line per framework (`skipped` under --json) names the framework's
own checks that did not run and the extra that runs them.

The frameworks are installed in the test environment, so each check runs in a subprocess whose import system refuses
their modules (a meta-path finder installed before gpufleet is imported), as a base-only install would.
"""

from __future__ import annotations

import ast
import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from clirun import run_gpufleet, run_gpufleet_without
from gpufleet.emit.read_torchtitan import assigned_values, not_installed

SEED_DEEPSPEED = Path(__file__).parent / "data" / "seed_deepspeed.json"
#: The framework modules a base install lacks (datasets: torchtitan's config registries import it).
FRAMEWORKS = ("deepspeed", "megatron", "torchtitan", "datasets")



def _bare(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`gpufleet ARGS` with no framework importable."""
    # the skipped line on one line of the terminal
    return run_gpufleet_without(FRAMEWORKS, *args, cwd=cwd, env={"COLUMNS": "400"})


def _bare_json(*args: str, cwd: Path) -> tuple[int, dict[str, Any], str]:
    ran = _bare(*args, "--json", cwd=cwd)
    return ran.returncode, json.loads(ran.stdout), ran.stderr


def test_the_seeds_deepspeed_config_is_checked_without_deepspeed(tmp_path: Path) -> None:
    """tests/data/seed_deepspeed.json (shared/seeds/000_*.txt), worked by hand: it states data_parallel_size 2048,
    pipeline_parallel_size 2, tensor_parallel_size 8 for 2,048 GPUs, so the degrees make 2048 × 2 × 8 = 32,768;
    train_batch_size 4096 with gradient_accumulation_steps 4 and dp 2048 leaves 4096 / (4 × 2048) = 0.5 samples per
    GPU per micro-batch; and zero_optimization.stage 3 with pp 2 is more than DeepSpeed's PipelineEngine's ZeRO-1.
    Those three need no DeepSpeed. The other two problems the full check finds (the three degree keys are no
    DeepSpeed keys; "offload_param": "cpu" is no object) are DeepSpeed's own key set and config class: skipped."""
    code, report, stderr = _bare_json("launch", "--check", str(SEED_DEEPSPEED), "--gpus", "2048", cwd=tmp_path)
    assert code == 1 and report["consistent"] is False, stderr
    assert report["problems"] == [
        "seed_deepspeed.json: ZeRO stage 3 with pipeline parallelism 2: DeepSpeed's PipelineEngine allows ZeRO-1 at "
        "most",
        "degrees multiply to 32,768 GPUs (dp 2,048 × pp 2 × tp 8 × cp 1), not 2,048",
        "seed_deepspeed.json: the micro-batch per GPU works out to 4,096 / (4 × 2,048 dp) = 0.5, not a whole number",
    ]
    assert report["files"][0]["degrees"] == {"dp": 2048, "pp": 2, "tp": 8}
    (skipped,) = report["skipped"]
    assert skipped["framework"] == "deepspeed" and skipped["files"] == ["seed_deepspeed.json"]
    assert skipped["extra"] == "deepspeed" and skipped["install"] == "pip install 'gpufleet[deepspeed]'"
    assert skipped["missing"] == "deepspeed" and any("DeepSpeedConfig" in check for check in skipped["checks"])
    assert stderr.startswith("error: 3 problem(s): ") and len(stderr.splitlines()) == 1


def test_the_skipped_line_names_the_deepspeed_extra(tmp_path: Path) -> None:
    ran = _bare("launch", "--check", str(SEED_DEEPSPEED), "--gpus", "2048", cwd=tmp_path)
    assert ran.returncode == 1
    lines = [line.strip() for line in ran.stdout.splitlines() if "skipped:" in line]
    assert lines == ["skipped: DeepSpeed's own checks not run on seed_deepspeed.json (its top-level key set; its "
                     "config class DeepSpeedConfig on the file's sections): deepspeed is not installed; to run them: "
                     "pip install 'gpufleet[deepspeed]'"]
    assert "Traceback" not in ran.stderr


def test_docs_launch_quotes_the_skipped_line_as_printed(tmp_path: Path) -> None:
    """docs/launch.md's "Without the framework extras" quotes the seed's skipped line (wrapped): it is today's."""
    ran = _bare("launch", "--check", str(SEED_DEEPSPEED), "--gpus", "2048", cwd=tmp_path)
    (line,) = (line.strip() for line in ran.stdout.splitlines() if "skipped:" in line)
    doc = (Path(__file__).parents[1] / "docs" / "launch.md").read_text(encoding="utf-8")
    quoted = doc.split("    skipped: ", 1)[1].split("\n\n", 1)[0]
    assert "skipped: " + " ".join(quoted.split()) == line


def test_with_deepspeed_installed_nothing_is_skipped() -> None:
    pytest.importorskip("deepspeed", reason="the deepspeed extra (scripts/test installs it)")
    ran = run_gpufleet("launch", "--check", str(SEED_DEEPSPEED), "--gpus", "2048", "--json")
    report = json.loads(ran.stdout)
    assert ran.returncode == 1 and len(report["problems"]) == 5 and report["skipped"] == []
    assert "skipped:" not in run_gpufleet("launch", "--check", str(SEED_DEEPSPEED), "--gpus", "2048").stdout


def test_a_consistent_deepspeed_config_gets_memory_and_step_without_deepspeed(tmp_path: Path) -> None:
    """zero3 on 16 GPUs, 1 × 4 × 16 = 64 = train_batch_size: consistent in what was checked, priced, exit 0."""
    (tmp_path / "ds.json").write_text(json.dumps({
        "train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
        "zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}))
    code, report, stderr = _bare_json("launch", "--check", "ds.json", "--gpus", "16", "--model", "llama3-8b",
                                      cwd=tmp_path)
    assert code == 0 and report["consistent"] and report["problems"] == [], stderr
    assert report["expected"]["gpus"] == 16 and report["expected"]["step_s"] > 0
    assert [skip["extra"] for skip in report["skipped"]] == ["deepspeed"]
    printed = _bare("launch", "--check", "ds.json", "--gpus", "16", cwd=tmp_path).stdout
    assert printed.rstrip().endswith("consistent in what was checked")


def test_megatron_arguments_without_megatron_core(tmp_path: Path) -> None:
    """tp 2 × pp 2 on 12 GPUs leaves dp 3, and a global batch of 16 is no whole number of micro-batches of 1 over
    3 replicas (16 / (1 × 3)): Megatron-LM's own start-up rule, which needs no megatron-core."""
    (tmp_path / "args.txt").write_text("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                                       "--micro-batch-size 1 --global-batch-size 16 --num-layers 8\n")
    code, report, stderr = _bare_json("launch", "--check", "args.txt", "--gpus", "12", cwd=tmp_path)
    assert code == 1, stderr
    assert any("16" in problem and "3" in problem for problem in report["problems"]), report["problems"]
    (skipped,) = report["skipped"]
    assert (skipped["framework"], skipped["extra"]) == ("megatron", "megatron")
    assert skipped["install"] == "pip install 'gpufleet[megatron]'"
    code, report, stderr = _bare_json("launch", "--check", "args.txt", "--gpus", "8", cwd=tmp_path)
    assert code == 0 and report["problems"] == [], stderr  # dp 2: 16 / (1 × 2) = 8 micro-batches


TITAN_JOB = textwrap.dedent("""\
    from torchtitan.models.llama3.config_registry import llama3_8b
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: F401


    def gpufleet_job():
        config = llama3_8b()
        p = config.parallelism
        t = config.training
        p.data_parallel_replicate_degree = 1
        p.data_parallel_shard_degree = 4
        p.tensor_parallel_degree = 2
        p.pipeline_parallel_degree = 1
        p.context_parallel_degree = 1
        p.expert_parallel_degree = 1
        t.local_batch_size = 2
        t.global_batch_size = 64
        t.seq_len = 4096
        config.activation_checkpoint = FullAC.Config()
        return config
    """)


def test_a_torchtitan_module_is_read_not_run_without_torchtitan(tmp_path: Path) -> None:
    """The module's literal assignments: dp 1 × 4, tp 2 = 8 GPUs; on 16 that is a problem, and 64 / (2 × 4) = 8
    accumulation steps is whole. torchtitan's ConfigManager and ParallelDims are skipped."""
    (tmp_path / "titan_job.py").write_text(TITAN_JOB)
    code, report, stderr = _bare_json("launch", "--check", "titan_job.py", "--gpus", "16", cwd=tmp_path)
    assert code == 1, stderr
    assert report["problems"] == ["degrees multiply to 8 GPUs (dp 4 × pp 1 × tp 2 × cp 1), not 16"]
    assert report["files"][0]["degrees"] == {"tp": 2, "pp": 1, "cp": 1, "ep": 1, "dp": 4}
    assert report["files"][0]["micro_batch"] == 2 and report["files"][0]["global_batch"] == 64
    (skipped,) = report["skipped"]
    assert (skipped["framework"], skipped["extra"]) == ("torchtitan", "torchtitan")
    assert "pip install --no-deps torchtitan==0.3.0 datasets==4.7.0" in skipped["install"] or \
        skipped["install"] == "pip install 'gpufleet[torchtitan]'"  # beside the runtime extra's fsspec, or alone
    code, report, stderr = _bare_json("launch", "--check", "titan_job.py", "--gpus", "8", "--model", "llama3-8b",
                                      cwd=tmp_path)
    assert code == 0 and report["expected"]["gpus"] == 8, stderr


def _function(text: str) -> ast.FunctionDef:
    node = ast.parse(textwrap.dedent(text)).body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


def test_only_what_the_returned_config_surely_gets_is_read() -> None:
    """A value assigned in a branch, by an augmented assignment or from an expression is not known; neither is an
    assignment to another object or through a name rebound to something else."""
    values = assigned_values(_function("""
        def job(flag):
            config = base()
            other = base()
            p = config.parallelism
            p.tensor_parallel_degree = 4
            config.parallelism.pipeline_parallel_degree = 2
            if flag:
                p.pipeline_parallel_degree = 4
            config.training.steps = 10
            config.training.steps += 1
            config.training.seq_len = 2 ** 12
            other.parallelism.context_parallel_degree = 2
            p = something
            p.expert_parallel_degree = 8
            return config
        """))
    assert values == {("parallelism", "tensor_parallel_degree"): 4}


def test_a_package_torchtitan_imports_that_is_not_installed_is_a_skip_not_a_problem() -> None:
    """ConfigManager says only that it cannot import the module; the module's own import names what is missing. A
    package not installed at all (torchtitan's config registries import triton and datasets) means torchtitan
    cannot run here; a missing module of an installed package is the file's own mistake."""
    assert not_installed(ModuleNotFoundError("No module named 'no_such_pkg'", name="no_such_pkg.sub")) == "no_such_pkg"
    assert not_installed(ModuleNotFoundError("No module named 'json.nosuch'", name="json.nosuch")) is None
    assert not_installed(ImportError("cannot import name 'x'")) is None and not_installed(None) is None


@pytest.mark.framework
def test_torchtitan_without_triton_reads_the_module_and_names_the_extra(tmp_path: Path) -> None:
    """torchtitan 0.3.0 installed without triton (pip install --no-deps, or an extra that lacked it): its config
    registry cannot import, so the module is read statically and the skipped line names the torchtitan extra."""
    pytest.importorskip("torchtitan", reason="the torchtitan extra (scripts/test installs it)")
    (tmp_path / "titan_job.py").write_text(TITAN_JOB)
    ran = run_gpufleet_without(["triton"], "launch", "--check", "titan_job.py", "--gpus", "8", "--json", cwd=tmp_path,
                               timeout_s=300)
    report = json.loads(ran.stdout)
    assert ran.returncode == 0 and report["problems"] == [], ran.stderr
    assert report["files"][0]["degrees"] == {"tp": 2, "pp": 1, "cp": 1, "ep": 1, "dp": 4}
    (skipped,) = report["skipped"]
    assert (skipped["extra"], skipped["missing"]) == ("torchtitan", "triton")
