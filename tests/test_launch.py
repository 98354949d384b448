"""`gpufleet launch`: files written atomically from a plan, bad input refused in one line, `--check` arithmetic.

These tests need no framework installed; test_launch_frameworks.py feeds the files to the frameworks' own parsers.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from clirun import one_error_line, run_gpufleet
from gpufleet import __version__
from gpufleet.catalog.registry import load_catalog
from gpufleet.emit.build import launch_spec
from gpufleet.emit.deepspeed import DEEPSPEED
from gpufleet.emit.registry import available_targets, resolve_targets
from gpufleet.emit.spec import EmittedFile, TargetCannotExpress
from gpufleet.emit.write import write_files
from gpufleet.errors import InputError
from gpufleet.planner.plan import PlanRequest, make_plan

pytestmark = pytest.mark.timeout(300)
PLAN = ["-m", "llama3-8b", "-t", "100B", "-n", "16"]


def _launch(tmp_path: Path, *args: str) -> dict:
    result = run_gpufleet("launch", *PLAN, "--target", "megatron", "--out", str(tmp_path / "run"), "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_launch_writes_the_plan_and_its_batch_arithmetic_holds(tmp_path: Path) -> None:
    data = _launch(tmp_path)
    layout = data["layout"]
    assert data["gpus"] == 16 == layout["tp"] * layout["pp"] * layout["dp"] * layout["cp"]
    assert layout["global_batch"] == layout["micro_batch"] * layout["gradient_accumulation"] * layout["dp"]
    args = (tmp_path / "run" / "megatron" / "pretrain_gpt.args").read_text().split()
    assert f"--tensor-model-parallel-size={layout['tp']}" in args
    assert f"--micro-batch-size={layout['micro_batch']}" in args
    assert f"--global-batch-size={layout['global_batch']}" in args
    # 100B tokens at global batch x 4096 tokens per step: the iterations, rounded up
    tokens_per_step = layout["global_batch"] * 4096
    assert f"--train-iters={-(-100_000_000_000 // tokens_per_step)}" in args
    assert data["files"] == [str(tmp_path / "run" / "megatron" / "pretrain_gpt.args")]
    assert data["start"].startswith("torchrun --nnodes=2 --nproc-per-node=8 ")
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no staging folder left beside it


def test_a_non_empty_folder_is_refused_without_force_and_replaced_with_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    refused = run_gpufleet("launch", *PLAN, "--target", "megatron", "--out", str(out))
    assert "not empty" in one_error_line(refused) and "--force" in refused.stderr
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    _launch(tmp_path, "--force")
    assert sorted(p.name for p in out.iterdir()) == ["megatron"]


@pytest.mark.parametrize(("args", "words"), [
    (["--target", "fortran"], "unknown --target 'fortran'"),
    (["--target", "megatron", "--rank", "100000", "-n", "16"], "--rank 100000 is beyond the plans found"),
    (["--target", "megatron", "--gpus", "16,32"], "--gpus"),
])
def test_bad_input_is_one_line_and_no_folder(tmp_path: Path, args: list[str], words: str) -> None:
    result = run_gpufleet("launch", "-m", "llama3-8b", "-t", "100B", *args, "--out", str(tmp_path / "run"))
    assert words in one_error_line(result)
    assert list(tmp_path.iterdir()) == []


def test_a_plan_file_launches_the_rank_it_lists(tmp_path: Path) -> None:
    planned = run_gpufleet("plan", *PLAN, "--json")
    assert planned.returncode == 0, planned.stderr
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(planned.stdout)
    second = json.loads(planned.stdout)["plans"][1]["layout"]
    result = run_gpufleet("launch", "--plan", str(plan_file), "--rank", "2", "--target", "megatron", "--out",
                          str(tmp_path / "run"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["layout"]["label"] == second["label"]


def test_a_plan_with_its_pipeline_sends_in_line_launches_from_its_file(tmp_path: Path) -> None:
    # the file's framework section is read typed, every term with it: launch rebuilt the request without
    # pp_p2p_overlap and refused the file as "not this version's"
    planned = run_gpufleet("plan", "-m", "llama3-70b", "-n", "256", "--top", "1", "--no-overlap-pp", "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["framework"]["pp_p2p_overlap"] is False
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(planned.stdout)
    result = run_gpufleet("launch", "--plan", str(plan_file), "--target", "megatron", "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr


def test_a_plan_file_with_a_mistyped_framework_setting_is_one_line(tmp_path: Path) -> None:
    planned = run_gpufleet("plan", *PLAN, "--json")
    document = json.loads(planned.stdout)
    document["framework"]["tp_comm_overlap"] = "sometimes"
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(document))
    line = one_error_line(run_gpufleet("launch", "--plan", str(plan_file), "--target", "megatron", "--out",
                                       str(tmp_path / "run")))
    assert "framework.tp_comm_overlap" in line


def test_a_plan_file_from_another_version_or_model_is_refused(tmp_path: Path) -> None:
    data = json.loads(run_gpufleet("plan", *PLAN, "--json").stdout)
    cases = {"version": {**data, "gpufleet_version": "0.0.1"},
             "model": {**data, "job": {**data["job"], "model": "llama9-1t"}},
             "rank": data}
    for name, content in cases.items():
        plan_file = tmp_path / f"{name}.json"
        plan_file.write_text(json.dumps(content))
        rank = "9" if name == "rank" else "1"
        result = run_gpufleet("launch", "--plan", str(plan_file), "--rank", rank, "--target", "megatron", "--out",
                              str(tmp_path / f"out-{name}"))
        line = one_error_line(result)
        assert {"version": "0.0.1", "model": "llama9-1t", "rank": "--rank 9"}[name] in line
        assert not (tmp_path / f"out-{name}").exists()
    mixed = run_gpufleet("launch", "--plan", str(tmp_path / "rank.json"), "-m", "llama3-70b", "--target",
                         "megatron", "--out", str(tmp_path / "mixed"))
    assert "drop --model" in one_error_line(mixed)
    assert __version__ == data["gpufleet_version"]


def _spec(gpus: int = 16):  # type: ignore[no-untyped-def]
    result = make_plan(PlanRequest(model="llama3-8b", tokens=1e11, gpus=gpus), load_catalog([]))
    return launch_spec(result, 1)


def test_a_target_that_cannot_express_the_plan_names_what_it_lacks_and_who_can() -> None:
    spec = _spec()
    with_cp = replace(spec, layout=replace(spec.layout, cp=2, dp=spec.layout.dp // 2, tp=1, sequence_parallel=False))
    with pytest.raises(TargetCannotExpress, match=r"context parallelism.*use --target megatron or torchtitan"):
        DEEPSPEED.render(with_cp)
    result = run_gpufleet("launch", "-m", "llama3-70b", "-t", "2T", "-n", "256", "--stack", "torchtitan",
                          "--target", "deepspeed", "--out", str(Path("/nonexistent-gpufleet/run")))
    assert "--stack torchtitan launches with --target torchtitan" in one_error_line(result)


def test_a_release_range_without_a_writer_is_refused_however_it_is_launched(tmp_path: Path) -> None:
    """torchtitan@0.1 prices a full recompute that stops early (torchtitan 0.0-0.1.0); the torchtitan files gpufleet
    writes are torchtitan 0.3.0's, whose full recompute does not. Launching such a plan, with options or from a
    plan file, to any target, is one line naming the stack that launches; planning with it still works."""
    out = tmp_path / "run"
    for target in ("torchtitan", "megatron", "all"):
        done = run_gpufleet("launch", "-m", "llama3-8b", "-t", "1T", "-n", "64", "--stack", "torchtitan@0.1",
                            "--target", target, "--out", str(out))
        assert done.returncode == 2, target
        assert "plan with --stack torchtitan " in one_error_line(done)
    planned = run_gpufleet("plan", "-m", "llama3-8b", "-t", "1T", "-n", "64", "--stack", "torchtitan@0.1", "--json")
    assert planned.returncode == 0, planned.stderr
    (tmp_path / "plan.json").write_text(planned.stdout, encoding="utf-8")
    done = run_gpufleet("launch", "--plan", str(tmp_path / "plan.json"), "--target", "slurm", "--out", str(out))
    assert done.returncode == 2
    assert "--stack torchtitan@0.1 prices torchtitan releases 0.0–0.1.0" in one_error_line(done)
    assert not out.exists()
    fine = run_gpufleet("launch", "-m", "llama3-8b", "-t", "1T", "-n", "64", "--stack", "torchtitan", "--target",
                        "torchtitan", "--out", str(out))
    assert fine.returncode == 0, fine.stderr


def test_a_plan_file_the_target_cannot_express_is_refused_naming_what_it_lacks(tmp_path: Path) -> None:
    """A plan file is launched as planned (no re-planning within the target): a target that cannot run it says
    what it lacks and which target can."""
    planned = run_gpufleet("plan", "-m", "llama3-70b", "-t", "2T", "-n", "256", "--stack", "torchtitan", "--json")
    assert planned.returncode == 0, planned.stderr
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(planned.stdout, encoding="utf-8")
    result = run_gpufleet("launch", "--plan", str(plan_file), "--target", "deepspeed", "--out", str(tmp_path / "r"))
    assert "--target deepspeed cannot express this plan" in one_error_line(result)


def test_rank_beyond_the_plans_and_all_targets() -> None:
    with pytest.raises(InputError, match="beyond the plans found"):
        launch_spec(make_plan(PlanRequest(model="llama3-8b", tokens=1e11, gpus=16, top=2), load_catalog([])), 3)
    assert resolve_targets(["all", "megatron"]) == available_targets()
    assert {"megatron", "torchtitan", "deepspeed"} <= set(available_targets())


def test_write_files_leaves_nothing_behind_on_failure(tmp_path: Path) -> None:
    twice = [EmittedFile("a.txt", "1"), EmittedFile("a.txt", "2")]
    with pytest.raises(InputError, match="same file"):
        write_files(tmp_path / "run", twice)
    blocked = [EmittedFile("a", "file"), EmittedFile("a/b", "under a file")]
    with pytest.raises(InputError, match="cannot write"):
        write_files(tmp_path / "run", blocked)
    assert list(tmp_path.iterdir()) == []


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_check_reads_sbatch_gpus_and_megatron_degrees(tmp_path: Path) -> None:
    sbatch = _write(tmp_path / "job.sbatch", "#!/bin/bash\n#SBATCH --nodes=4\n#SBATCH --gpus-per-node=8\n"
                    "#SBATCH --ntasks-per-node=8\nsrun python pretrain_gpt.py\n")
    good = _write(tmp_path / "good.args", "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 2 \\\n"
                  "--micro-batch-size 2 --global-batch-size 64\n")
    ok = run_gpufleet("launch", "--check", str(sbatch), str(good), "--json")
    report = json.loads(ok.stdout)
    assert ok.returncode == 0, ok.stderr
    assert report["gpus"] == 32 and report["consistent"]  # 4 x 8 = 32 = tp 8 x pp 2 x dp 2; 64 = 2 x 16 x 2
    # on 64 GPUs (--gpus) dp = 64 / (8 x 2) = 4: 64 = 2 x 8 x 4 holds, 48 sequences at micro-batch 5 do not (2.4)
    bad = _write(tmp_path / "bad.args", "--tensor-model-parallel-size=8 --pipeline-model-parallel-size=2 "
                 "--micro-batch-size=5 --global-batch-size=48\n")
    failed = run_gpufleet("launch", "--check", str(sbatch), str(good), str(bad), "--gpus", "64", "--json")
    assert failed.returncode == 1
    problems = json.loads(failed.stdout)["problems"]
    assert len(problems) == 2, problems
    assert "job.sbatch asks for 32 GPUs, not the 64 given (--gpus)" in problems
    assert any("48 / (5 × 4 dp) = 2.4" in problem for problem in problems), problems


def test_check_refuses_unreadable_files_in_one_line(tmp_path: Path) -> None:
    assert "does not exist" in one_error_line(run_gpufleet("launch", "--check", str(tmp_path / "missing.json")))
    broken = _write(tmp_path / "ds.json", "{ not json")
    assert "not valid JSON" in one_error_line(run_gpufleet("launch", "--check", str(broken)))
    prose = _write(tmp_path / "notes.txt", "just some words\n")
    assert "not a launch file gpufleet reads: expected a ds_config JSON" in one_error_line(
        run_gpufleet("launch", "--check", str(prose)))
    # flags, but none Megatron has (a shell command): refused naming what was expected, not read as Megatron
    shell = _write(tmp_path / "ls.sh", "ls --color=auto --all /tmp\n")
    line = one_error_line(run_gpufleet("launch", "--check", str(shell)))
    assert "not a launch file" in line and "Megatron-LM argument list" in line and "srun/sbatch command" in line


def test_check_reads_a_bare_srun_line_as_slurm(tmp_path: Path) -> None:
    # seed 000 l.76: its srun line, alone in a file; 128 nodes x gpu:8 = 1,024 GPUs, 8 tasks per node, block
    srun = _write(tmp_path / "seed000.sbatch", "# Job submission\nsrun --gres=gpu:8 --ntasks-per-node=8 --nodes=128 "
                  "--distribution=block:block --network=ib python train.py\n")
    result = run_gpufleet("launch", "--check", str(srun), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["files"][0]["kind"] == "sbatch" and report["gpus"] == 1024
    notes = " ".join(report["notes"])
    assert "--network=ib does nothing here" in notes and "Cray" in notes
    assert "does not choose contiguous nodes" in notes
    # the same options as short flags and separate values
    short = _write(tmp_path / "short.sh", "srun -N 4 --gpus-per-node 8 --ntasks-per-node 8 -m cyclic python t.py\n")
    assert json.loads(run_gpufleet("launch", "--check", str(short), "--json").stdout)["gpus"] == 32


@pytest.mark.parametrize(("distribution", "tp", "verdict"), [
    ("block", 8, "consistent"), ("block:cyclic", 8, "consistent"),  # the second method binds CPUs, not ranks
    ("cyclic", 8, "tensor-parallel group of 8 spans more than one node"),
    ("cyclic", 1, "consecutive ranks on different nodes"),
    ("plane=4", 8, "tensor-parallel group of 8 spans more than one node"),
    ("plane=4", 4, "consistent"),  # tp 4 stays in a node; a note says the order is not block
])
def test_check_distribution_against_the_plans_block_order(tmp_path: Path, distribution: str, tp: int,
                                                          verdict: str) -> None:
    sbatch = _write(tmp_path / "job.sbatch", "#!/bin/bash\n#SBATCH --nodes=4\n#SBATCH --gpus-per-node=8\n"
                    f"#SBATCH --ntasks-per-node=8\n#SBATCH --distribution={distribution}\nsrun python t.py\n")
    args = _write(tmp_path / "m.args", f"--tensor-model-parallel-size {tp} --micro-batch-size 1 "
                  "--global-batch-size 64\n")
    result = run_gpufleet("launch", "--check", str(sbatch), str(args), "--json")
    report = json.loads(result.stdout)
    if verdict == "consistent":
        assert result.returncode == 0 and report["consistent"], report["problems"]
    else:
        assert result.returncode == 1 and any(verdict in problem for problem in report["problems"]), report
    # with one task per node torchrun numbers the GPUs itself: the distribution cannot split a group
    per_node = _write(tmp_path / "one.sbatch", "#!/bin/bash\n#SBATCH --nodes=4\n#SBATCH --gpus-per-node=8\n"
                      f"#SBATCH --ntasks-per-node=1\n#SBATCH --distribution={distribution}\nsrun torchrun t.py\n")
    assert run_gpufleet("launch", "--check", str(per_node), str(args)).returncode == 0


def test_scheduler_targets_get_the_framework_command_and_are_found_whatever_their_emitter_is_called(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.machinery
    import sys
    import types

    from gpufleet.emit import registry
    from gpufleet.emit.launch_request import render_targets

    seen: list[tuple[str, ...]] = []

    class Scheduler:
        name = "fake-scheduler"  # not the target's name: the module's one emitter is used

        def render(self, spec):  # type: ignore[no-untyped-def]
            seen.append(spec.train_command)
            return [EmittedFile("job.sbatch", "#!/bin/bash\n", executable=True)]

    module = types.ModuleType("gpufleet_test_fake_slurm")
    module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
    module.SCHEDULER = Scheduler()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(registry.TARGET_MODULES, "slurm", module.__name__)
    by_target = render_targets(_spec(), ["megatron", "slurm"], {"megatron", "slurm"}, tmp_path / "run", print)
    assert set(by_target) == {"megatron", "slurm"}
    from gpufleet.emit.megatron import ARGS_FILE

    written = next(f.text for f in by_target["megatron"] if f.path == ARGS_FILE).split()
    assert seen == [("pretrain_gpt.py", *written)]  # the same arguments as the written argument file
    from gpufleet.emit.start import start_command

    assert start_command(by_target, tmp_path / "run", _spec()) == f"sbatch {tmp_path / 'run' / 'job.sbatch'}"
