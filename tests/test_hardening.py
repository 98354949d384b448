"""Issue 23's input reproductions: each one a user would hit, run through the real `gpufleet` script.

Every file input (--catalog files and the .yaml files in a --catalog folder, --runs, --plan) is a regular file of
bounded size, nested within bounds; a run file's typo, a long argument, a thousands separator, a date-like id or a
layout that cannot split its GPUs each get one useful line, exit 2 (or a skipped run with a reason, exit 1).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from clirun import one_error_line, run_gpufleet
from gpufleet.errors import InputError, shorten
from gpufleet.input_files import MAX_INPUT_BYTES, MAX_NESTING_LEVELS, load_json, load_yaml, read_text

SHIPPED_RUNS = Path(__file__).parent.parent / "src/gpufleet/catalog/runs/published_runs.yaml"
#: Long enough that Python's parsers overflow their stack when nothing bounds the nesting (the issue saw ~500).
DEEP_LEVELS = 1000
#: Seconds a refused named pipe may take (a real process starting on a loaded machine); the old code never ended.
PIPE_LIMIT_S = 60

pytestmark = pytest.mark.timeout(300)


def first_run() -> dict[str, Any]:
    """The first shipped run (SC21 GPT-1.7B: 24 heads, 2304 hidden, tp 1 × pp 1 × dp 32 on 32 A100s)."""
    runs = yaml.safe_load(SHIPPED_RUNS.read_text(encoding="utf-8"))
    assert runs[0]["model"]["heads"] == 24 and runs[0]["hardware"]["num_gpus"] == 32
    return dict(runs[0])


def write_runs(tmp_path: Path, run: dict[str, Any], name: str = "runs.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump([run]), encoding="utf-8")
    return path


# --- a run file with a one-character typo: one line, exit 2 (was a pydantic traceback) ----------------------------


def test_run_file_hidden_that_heads_do_not_divide_is_one_line(tmp_path: Path) -> None:
    run = first_run()
    run["model"] = {**run["model"], "hidden": 16385}  # 16385 = 5 * 29 * 113: 24 heads cannot divide it
    line = one_error_line(run_gpufleet("validate", "--runs", str(write_runs(tmp_path, run))))
    assert "runs.yaml" in line and run["id"] in line and "hidden (16385)" in line and "heads (24)" in line
    assert "ValidationError" not in line and "give head_dim" not in line  # the run schema has no head_dim


def test_run_file_kv_heads_above_heads_is_one_line(tmp_path: Path) -> None:
    run = first_run()
    run["model"] = {**run["model"], "kv_heads": 48}
    line = one_error_line(run_gpufleet("validate", "--runs", str(write_runs(tmp_path, run))))
    assert "kv_heads (48)" in line and "heads (24)" in line and run["id"] in line


def test_run_whose_tp_cannot_split_its_gpus_says_why(tmp_path: Path) -> None:
    run = first_run()
    run["layout"] = {**run["layout"], "tp": 3, "cp": None}  # 3 x 1 x 32 = 96 ranks for 32 GPUs
    done = run_gpufleet("validate", "--runs", str(write_runs(tmp_path, run)), "--json")
    assert done.returncode == 1, done.stderr  # nothing could be predicted: a failed check, as before
    (row,) = json.loads(done.stdout)["runs"]
    assert row["status"] == "skipped"
    assert "({})" not in row["reason"]
    assert "tp=3 × pp=1 × dp=32 = 96" in row["reason"] and "32 GPUs" in row["reason"]


# --- nesting ---------------------------------------------------------------------------------------------------------


def test_deeply_nested_yaml_catalog_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("gpus: " + "[" * DEEP_LEVELS + "]" * DEEP_LEVELS + "\n", encoding="utf-8")
    line = one_error_line(run_gpufleet("catalog", "list", "--catalog", str(deep)))
    assert "deep.yaml" in line and f"more than {MAX_NESTING_LEVELS} levels" in line


def test_deeply_nested_yaml_run_file_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep_runs.yaml"
    deep.write_text("- " * DEEP_LEVELS + "1\n", encoding="utf-8")  # block style: nested lists, one per '- '
    line = one_error_line(run_gpufleet("validate", "--runs", str(deep)))
    assert "deep_runs.yaml" in line and "levels" in line


def test_deeply_nested_json_plan_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "plan.json"
    deep.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    line = one_error_line(run_gpufleet("cost", "--plan", str(deep)))
    assert "plan.json" in line and "levels" in line


def test_nesting_is_bounded_at_the_documented_level(tmp_path: Path) -> None:
    """MAX_NESTING_LEVELS lists deep is read; one more is refused (YAML and JSON alike)."""
    at, over = tmp_path / "at", tmp_path / "over"
    for suffix, loader in ((".yaml", load_yaml), (".json", load_json)):
        at.with_suffix(suffix).write_text("[" * MAX_NESTING_LEVELS + "]" * MAX_NESTING_LEVELS, encoding="utf-8")
        over.with_suffix(suffix).write_text("[" * (MAX_NESTING_LEVELS + 1) + "]" * (MAX_NESTING_LEVELS + 1),
                                            encoding="utf-8")
        document = loader(at.with_suffix(suffix), "file")
        for _ in range(MAX_NESTING_LEVELS - 1):
            (document,) = document
        assert document == []
        with pytest.raises(InputError, match=f"more than {MAX_NESTING_LEVELS} levels"):
            loader(over.with_suffix(suffix), "file")


# --- only regular files of bounded size ------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["runs", "plan", "catalog folder"])
def test_a_named_pipe_is_refused_at_once(tmp_path: Path, where: str) -> None:
    folder = tmp_path / "catalog"
    folder.mkdir()
    pipe = (folder if where == "catalog folder" else tmp_path) / "pipe.yaml"
    os.mkfifo(pipe)  # no writer: reading it would wait forever
    args = {"runs": ["validate", "--runs", str(pipe)], "plan": ["cost", "--plan", str(pipe)],
            "catalog folder": ["catalog", "list", "--catalog", str(folder)]}[where]
    line = one_error_line(run_gpufleet(*args, timeout=PIPE_LIMIT_S))
    assert str(pipe) in line and "named pipe" in line and "regular file" in line


def test_dev_null_as_catalog_is_not_said_to_be_missing() -> None:
    line = one_error_line(run_gpufleet("catalog", "list", "--catalog", "/dev/null"))
    assert "/dev/null" in line and "does not exist" not in line and "character device" in line


def test_a_file_over_the_size_bound_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as handle:
        handle.truncate(MAX_INPUT_BYTES + 1)  # sparse: no disk used
    line = one_error_line(run_gpufleet("catalog", "list", "--catalog", str(big)))
    assert "big.yaml" in line and "at most 16 MiB" in line


def test_a_file_at_the_size_bound_is_read(tmp_path: Path) -> None:
    path = tmp_path / "at_bound.yaml"
    path.write_text("#" * (MAX_INPUT_BYTES - 1) + "\n", encoding="utf-8")
    assert len(read_text(path, "file")) == MAX_INPUT_BYTES


# --- messages --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["x" * 100_000, "ab " * 33_000])
def test_a_100_kb_argument_is_not_echoed_whole(value: str) -> None:
    for args in (["catalog", "show", value], ["plan", "-m", value, "-t", "1T", "-n", "8"],
                 ["plan", "-m", "llama3-8b", "-t", "1T", f"--gpus={value}"]):
        line = one_error_line(run_gpufleet(*args))
        assert len(line) < 1000, (args[:2], len(line))
        assert f"({len(value):,} characters)" in line


def test_shorten_keeps_both_ends_and_says_the_length() -> None:
    text = "start" + "m" * 10_000 + "end"
    short = shorten(text, 100)
    assert len(short) == 100 and short.startswith("start") and "end (10,008 characters)" in short
    assert shorten("short", 100) == "short"


def test_a_thousands_separator_in_a_size_is_named() -> None:
    line = one_error_line(run_gpufleet("fabric", "simulate", "--gpus", "8", "--size", "1,000T"))
    assert "'1,000T'" in line and "thousands separator" in line and "'1000T'" in line
    assert "000T is 0 B" not in line


def test_a_thousands_separator_in_a_gpu_count_is_named() -> None:
    line = one_error_line(run_gpufleet("fabric", "simulate", "--gpus", "1,024"))
    assert "'1,024'" in line and "'1024'" in line


def test_a_list_of_counts_is_still_a_list() -> None:
    """8,128 is two counts, not 8128: only an entry that starts with 0 reads as a separated thousand."""
    from gpufleet.units import parse_int_list

    assert parse_int_list("8,128") == [8, 128]
    with pytest.raises(InputError, match="thousands separator"):
        parse_int_list("2,048")


def test_a_catalog_id_written_as_a_date_reads_as_text(tmp_path: Path) -> None:
    path = tmp_path / "dated.yaml"
    path.write_text("gpus:\n  - id: 2024-01-01\n    name: x\n", encoding="utf-8")
    line = one_error_line(run_gpufleet("catalog", "list", "--catalog", str(path)))
    assert "datetime" not in line and "'2024-01-01'" in line
    assert load_yaml(path, "file") == {"gpus": [{"id": "2024-01-01", "name": "x"}]}


def test_an_infinite_ratio_is_refused() -> None:
    """`--oversubscription 1e400` reads as inf:1 and ended in 'cannot convert float NaN to integer'."""
    line = one_error_line(run_gpufleet("fabric", "build", "--gpus", "64", "--oversubscription", "1e400"))
    assert "--oversubscription" in line and "finite" in line


def test_a_rack_power_beyond_any_rack_is_refused() -> None:
    line = one_error_line(run_gpufleet("facility", "--gpus", "512", "--gpu", "h100-sxm", "--rack-kw", "1e308"))
    assert "--rack-kw" in line and "10,000 kW" in line


def test_any_pydantic_error_that_reaches_the_entry_point_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Whichever command builds a record from bad values, the entry point prints one line, exit 2: checked with a
    command that validates a real catalog record (ModelSpec) from values no one checked first."""
    import typer

    from gpufleet.catalog.records import ModelSpec
    from gpufleet.cli import main

    def app_with_unchecked_record() -> typer.Typer:
        app = typer.Typer()

        @app.command("build")
        def build(heads: int = typer.Option(24, "--heads")) -> None:
            ModelSpec(id="m", name="m", source="test", layers=2, hidden=16385, heads=heads, kv_heads=heads,
                      vocab=100, gated_mlp=True, ffn_hidden=64)

        @app.command("other")
        def other() -> None:
            pass

        return app

    monkeypatch.setattr(main, "build_app", app_with_unchecked_record)
    with pytest.raises(SystemExit) as done:
        main.run(["build", "--heads", "24"])
    assert done.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: invalid ModelSpec: ") and "hidden (16385)" in line and "heads (24)" in line
