"""Optional extras: a command that needs one which is not installed says so in one line, naming the extra and the
pip command that installs it, and exits 2 (never a traceback); brackets in what the CLI prints stay as written.

The extras are installed in the test environment, so each command runs in a subprocess whose import system refuses
the extra's modules (a meta-path finder installed before gpufleet is imported), as a base-only install would.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from clirun import one_error_line, run_gpufleet_without
from gpufleet.cli.output import OwnMarkupConsole, literal_brackets
from gpufleet.extras import EXTRA_MODULES, MissingExtraError, missing_extra, require_extra


def _modules_of(extra: str) -> list[str]:
    return [module for module, (owner, _) in EXTRA_MODULES.items() if owner == extra]





def _launch_files(folder: Path) -> None:
    (folder / "ds_config.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 1,
                                                       "gradient_accumulation_steps": 1, "train_batch_size": 8}))
    (folder / "megatron_args.txt").write_text("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                                              "--micro-batch-size 1 --global-batch-size 16\n")
    (folder / "titan_job.py").write_text("from torchtitan.config import JobConfig\n\n\n"
                                         "def gpufleet_job():\n    return JobConfig()\n")
    (folder / "fsdp.json").write_text(json.dumps({"sharding_strategy": "FULL_SHARD", "use_orig_params": True}))
    (folder / "ckpt").mkdir()


#: (what is run, the extra it needs, the modules refused: None = every module of that extra)
NEEDS_AN_EXTRA = [
    (["exporter", "--fake-gpus", "8"], "runtime", ["prometheus_client"]),
    (["bench", "gemm", "--model", "llama3-8b"], "runtime", None),
    (["bench", "collectives"], "runtime", None),
    (["bench", "memory"], "runtime", None),
    (["ckpt", "list", "ckpt"], "runtime", None),
    (["ckpt", "verify", "ckpt"], "runtime", None),
    (["ckpt", "list", "s3://bucket/run7"], "runtime", ["s3fs"]),
    (["doctor", "--cluster"], "runtime", None),
    (["burnin", "--steps", "2"], "runtime", None),
    (["calibrate", "--gpu", "h100-sxm", "--out", "profile.yaml", "--model", "llama3-8b"], "runtime", None),
    (["plan", "-m", "llama3-8b", "-t", "1T", "-g", "h100-sxm", "-n", "64-128", "--plot", "sweep.png"], "plot", None),
    (["validate", "--plot", "parity.png"], "plot", None),
    (["launch", "--check", "fsdp.json"], "runtime", None),
]
#: launch --check on a framework's file without that framework: the framework-free checks run, and one line names
#: the framework's extra (tests/test_launch_check_bare.py checks what they find)
CHECKED_WITHOUT_ITS_EXTRA = [("ds_config.json", "deepspeed"), ("megatron_args.txt", "megatron"),
                             ("titan_job.py", "torchtitan")]


@pytest.mark.slow
@pytest.mark.parametrize(("args", "extra", "blocked"), NEEDS_AN_EXTRA,
                         ids=[" ".join(args[:3]) for args, _, _ in NEEDS_AN_EXTRA])
def test_a_missing_extra_is_one_line_naming_it(tmp_path: Path, args: list[str], extra: str,
                                               blocked: list[str] | None) -> None:
    _launch_files(tmp_path)
    line = one_error_line(run_gpufleet_without(blocked or _modules_of(extra), *args, cwd=tmp_path))
    assert line.startswith("error: ") and "from the " + extra + " extra" in line
    assert line.endswith(f"pip install 'gpufleet[{extra}]'") or f"pip install 'gpufleet[{extra}]' (" in line
    assert not (tmp_path / "sweep.png").exists() and not (tmp_path / "profile.yaml").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("name", "extra"), CHECKED_WITHOUT_ITS_EXTRA)
def test_launch_check_without_a_framework_runs_and_names_its_extra(tmp_path: Path, name: str, extra: str) -> None:
    _launch_files(tmp_path)
    ran = run_gpufleet_without(_modules_of(extra), "launch", "--check", name, "--gpus", "8", "--json", cwd=tmp_path)
    assert ran.returncode in (0, 1), ran.stderr
    (skipped,) = json.loads(ran.stdout)["skipped"]
    assert skipped["extra"] == extra and skipped["files"] == [name]
    assert f"pip install 'gpufleet[{extra}]'" in skipped["install"]


@pytest.mark.slow
def test_burnin_names_the_extra_before_asking_for_torchrun(tmp_path: Path) -> None:
    """torchrun comes with torch: telling a base install to start under torchrun would send the user in a circle."""
    line = one_error_line(run_gpufleet_without(_modules_of("runtime"), "burnin", "--steps", "2", cwd=tmp_path))
    assert "torchrun" not in line and "'gpufleet[runtime]'" in line


@pytest.mark.slow
def test_what_needs_no_extra_still_runs_without_any(tmp_path: Path) -> None:
    """The guard is where an extra is needed, not at the door: the planner, an HTML plot and the disk bench work on
    the base install."""
    every_extra = list(EXTRA_MODULES)
    plan = run_gpufleet_without(every_extra, "plan", "-m", "llama3-8b", "-t", "1T", "-g", "h100-sxm", "-n", "64-128",
                             "--plot", "sweep.html", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "<table" in (tmp_path / "sweep.html").read_text()
    (tmp_path / "disk").mkdir()
    disk = run_gpufleet_without(every_extra, "bench", "disk", "disk", "--sizes", "1MiB", "--json", cwd=tmp_path)
    assert disk.returncode == 0, disk.stderr


def test_only_an_extras_own_modules_are_named_as_missing() -> None:
    """A module no extra provides (a bug, a broken install) is not dressed up as a missing extra."""
    assert missing_extra(ModuleNotFoundError("No module named 'nosuch'", name="nosuch")) is None
    found = missing_extra(ModuleNotFoundError("No module named 'megatron.core'", name="megatron.core"), "checking")
    assert found is not None and (found.extra, found.distribution) == ("megatron", "megatron-core")
    assert str(found) == ("checking needs megatron-core, from the megatron extra, which is not installed: "
                          "pip install 'gpufleet[megatron]'")


def test_each_framework_module_maps_to_its_own_extra_and_launch_check_is_their_union() -> None:
    import tomllib

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert {module: EXTRA_MODULES[module][0] for module in ("deepspeed", "megatron", "torchtitan", "datasets")} == {
        "deepspeed": "deepspeed", "megatron": "megatron", "torchtitan": "torchtitan", "datasets": "torchtitan"}
    assert extras["launch-check"] == ["gpufleet[deepspeed,megatron,torchtitan]"]
    pins = {extra: {pin.split("==")[0].lower() for pin in extras[extra]} for extra in extras}
    assert {"deepspeed"} <= pins["deepspeed"] and {"megatron-core"} <= pins["megatron"]
    assert {"gpufleet[torchtitan-imports]", "torchtitan", "datasets"} == pins["torchtitan"]
    for extra in ("deepspeed", "megatron", "torchtitan-imports"):  # a framework extra alone never pulls a new torch
        assert "torch==2.13.0" in extras[extra] and "torch==2.13.0" in extras["runtime"]


def test_the_torchtitan_hint_beside_the_runtime_extras_fsspec_is_the_commands_that_work(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """datasets 4.7.0 (torchtitan 0.3.0's) pins fsspec<=2026.2.0; the runtime extra pins 2026.9.0, where pip cannot
    resolve gpufleet[torchtitan]: the hint is then torchtitan's imports and the two without their pins."""
    from gpufleet import extras

    versions = {"fsspec": (2026, 9, 0)}
    monkeypatch.setattr(extras, "_version", versions.get)
    beside = extras.install_command("torchtitan")
    assert beside.startswith("pip install 'gpufleet[torchtitan-imports]' && pip install --no-deps "
                             "torchtitan==0.3.0 datasets==4.7.0 (not pip install 'gpufleet[torchtitan]': ")
    assert "fsspec<=2026.2.0 against the fsspec 2026.9.0 installed here" in beside
    assert extras.install_command("launch-check").startswith(
        "pip install 'gpufleet[deepspeed,megatron,torchtitan-imports]' && pip install --no-deps ")
    assert extras.install_command("deepspeed") == "pip install 'gpufleet[deepspeed]'"
    for alone in ({"fsspec": (2026, 2, 0)}, {}):  # an fsspec datasets takes, or none: pip resolves the extra
        monkeypatch.setattr(extras, "_version", alone.get)
        assert extras.install_command("torchtitan") == "pip install 'gpufleet[torchtitan]'"


def test_require_extra_raises_a_gpufleet_error_that_is_an_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ModuleNotFoundError
    with pytest.raises(MissingExtraError, match=r"--plot a\.png needs matplotlib, from the plot extra.*"
                                                r"'gpufleet\[plot\]' \(or write FILE\.html"):
        require_extra("matplotlib", "--plot a.png", "or write FILE.html")
    with pytest.raises(ImportError):
        require_extra("matplotlib", "--plot a.png")


def _printed(text: str) -> str:
    console = OwnMarkupConsole(file=io.StringIO(), width=200, highlight=False)
    console.print(text)
    assert isinstance(console.file, io.StringIO)
    return console.file.getvalue().rstrip("\n")


def test_the_cli_prints_brackets_in_user_text_as_written() -> None:
    """Plain Rich reads `[launch-check]` as a style and prints `pip install 'gpufleet'`."""
    plain = Console(file=io.StringIO(), width=200)
    plain.print("pip install 'gpufleet[launch-check]'")
    assert isinstance(plain.file, io.StringIO) and "[launch-check]" not in plain.file.getvalue()
    assert _printed("note: pip install 'gpufleet[launch-check]'") == "note: pip install 'gpufleet[launch-check]'"
    assert _printed("run[1].log [bold-ish] [link=https://x]") == "run[1].log [bold-ish] [link=https://x]"
    assert _printed(r"C:\logs\[x]") == r"C:\logs\[x]"
    assert _printed("[red]problem:[/red] in [runtime]") == "problem: in [runtime]"  # gpufleet's own style tags
    assert literal_brackets("[green]ok[/green]") == "[green]ok[/green]"


def test_a_warning_prints_its_brackets(capsys: pytest.CaptureFixture[str]) -> None:
    from gpufleet.cli.output import Output

    Output().warn("install it with pip install 'gpufleet[plot]'")
    assert capsys.readouterr().err.strip() == "warning: install it with pip install 'gpufleet[plot]'"
