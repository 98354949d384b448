"""Issue 31's input classes, each as a user would hit it through the real `gpufleet` script: one line on stderr,
exit 2, never a traceback; a duplicated key refused with its lines (it was taken silently), a symbolic link loop
named as one, and YAML bounded in nodes (so in time), not only in bytes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from clirun import one_error_line, run_gpufleet
from gpufleet.errors import InputError
from gpufleet.input_files import MAX_INTEGER_DIGITS, MAX_YAML_NODES, load_json, load_yaml, parse_json, parse_yaml

SHIPPED_RUNS = Path(__file__).parent.parent / "src/gpufleet/catalog/runs/published_runs.yaml"
SHIPPED_GPUS = Path(__file__).parent.parent / "src/gpufleet/catalog/data/gpus.yaml"
#: Past Python's own limit on reading an integer (4,300 digits): the issue's traceback class.
HUGE = "9" * 5000
#: Seconds a refusal may take through a real process on a loaded 2-core machine.
REFUSAL_LIMIT_S = 60

pytestmark = pytest.mark.timeout(300)


def first_run_text() -> str:
    """The first shipped run, as the text of a run file (a YAML list of one run)."""
    return "- id: " + SHIPPED_RUNS.read_text(encoding="utf-8").split("\n- id: ")[1]


def h100_record() -> dict[str, Any]:
    gpus = yaml.safe_load(SHIPPED_GPUS.read_text(encoding="utf-8"))["gpus"]
    return dict(next(gpu for gpu in gpus if gpu["id"] == "h100-sxm"))


def catalog_text(record: dict[str, Any]) -> str:
    return yaml.safe_dump({"gpus": [record]}, sort_keys=False)


# --- the six traceback classes ---------------------------------------------------------------------------------------


def test_an_integer_past_4300_digits_in_a_run_file_is_one_line(tmp_path: Path) -> None:
    text = first_run_text()
    assert "num_gpus: 32" in text
    path = tmp_path / "runs.yaml"
    path.write_text(text.replace("num_gpus: 32", f"num_gpus: {HUGE}"), encoding="utf-8")
    line = one_error_line(run_gpufleet("validate", "--runs", str(path)))
    assert "runs.yaml line" in line and "5,000 digits" in line and f"at most {MAX_INTEGER_DIGITS}" in line


def test_an_integer_past_4300_digits_in_a_catalog_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(catalog_text({**h100_record(), "id": "big"}).replace("hbm_gib: 80", f"hbm_gib: {HUGE}"),
                    encoding="utf-8")
    line = one_error_line(run_gpufleet("catalog", "show", "big", "--catalog", str(path)))
    assert "gpus.yaml line" in line and "5,000 digits" in line


@pytest.mark.parametrize("value", [".inf", ".nan", "1.0e+308"])
def test_an_infinite_or_overflowing_link_rate_in_a_catalog_is_one_line(tmp_path: Path, value: str) -> None:
    # found by the fuzz test: an NVLink rate of inf (or 1e308 GB/s, inf once in bytes/s) reached the flow solver as
    # NaN; the catalog now refuses non-finite numbers and bounds the rate
    record = h100_record()
    path = tmp_path / "gpus.yaml"
    rate = record["scale_up"]["gbytes_per_s_per_direction"]
    text = catalog_text(record).replace(f"gbytes_per_s_per_direction: {rate}", f"gbytes_per_s_per_direction: {value}")
    assert value in text
    path.write_text(text, encoding="utf-8")
    line = one_error_line(run_gpufleet("fabric", "simulate", "--gpus", "16", "--size", "1MiB", "--catalog", str(path)))
    assert "gbytes_per_s_per_direction" in line, line


def test_an_integer_past_4300_digits_as_a_gpu_count_is_one_line(tmp_path: Path) -> None:
    args = tmp_path / "megatron_args.txt"
    args.write_text("--tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --micro-batch-size 1 "
                    "--global-batch-size 64\n", encoding="utf-8")
    line = one_error_line(run_gpufleet("launch", "--check", str(args), "--gpus", HUGE))
    assert "--gpus" in line and "5,000 digits" in line and "(5,000 characters)" in line and len(line) < 600


def test_a_nul_byte_in_yaml_is_one_line_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "runs.yaml"
    path.write_text("- id: a\n  name: b\x00c\n", encoding="utf-8")
    line = one_error_line(run_gpufleet("validate", "--runs", str(path)))
    assert "runs.yaml line 2" in line and "#x0000" in line


@pytest.mark.parametrize(("flag", "target"), [("--runs", "/proc/kmsg"), ("--catalog", "/proc/self/status"),
                                              ("--runs", "/sys/kernel/mm/transparent_hugepage/enabled")])
def test_a_proc_or_sys_file_is_refused_unread(flag: str, target: str) -> None:
    if not os.path.exists(target):
        pytest.skip(f"{target} is not on this machine")
    command = ["validate"] if flag == "--runs" else ["catalog", "list"]
    started = time.monotonic()
    line = one_error_line(run_gpufleet(*command, flag, target, timeout=REFUSAL_LIMIT_S))
    assert time.monotonic() - started < REFUSAL_LIMIT_S  # /proc/kmsg used to wait for kernel messages
    assert target in line and "/proc or /sys file" in line and "not a regular file" in line


def test_a_lone_surrogate_in_a_catalog_string_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(catalog_text({**h100_record(), "id": "odd", "name": "PLACEHOLDER"}).replace(
        "PLACEHOLDER", '"GPU \\udc80"'), encoding="utf-8")
    line = one_error_line(run_gpufleet("catalog", "list", "--catalog", str(path)))
    assert "gpus.yaml line" in line


def test_a_lone_surrogate_is_refused_by_both_parsers() -> None:
    with pytest.raises(InputError, match="lone surrogate"):
        parse_json('{"name": "GPU \\udc80"}', "plan.json", "plan file")
    with pytest.raises(InputError, match=r"plan\.yaml line 1"):  # libyaml's scanner, or the composer's own check
        parse_yaml('name: "GPU \\udc80"\n', "plan.yaml", "plan file")


def test_megatron_degrees_below_one_are_one_line_not_a_modulo_by_zero(tmp_path: Path) -> None:
    args = tmp_path / "megatron_args.txt"
    args.write_text("--tensor-model-parallel-size -8 --pipeline-model-parallel-size 0 --num-layers 32 "
                    "--hidden-size 4096 --num-attention-heads 32 --micro-batch-size 1 --global-batch-size 64 "
                    "--seq-length 4096\n", encoding="utf-8")
    line = one_error_line(run_gpufleet("launch", "--check", str(args), "--gpus", "8"))
    assert "megatron_args.txt" in line and "at least 1" in line and ("tp is -8" in line or "pp is 0" in line)


def test_an_out_name_over_255_bytes_is_one_line_quoted_by_its_ends(tmp_path: Path) -> None:
    name = "run" + "a" * 4994 + "end"
    done = run_gpufleet("launch", "-m", "llama3-8b", "-t", "1T", "-g", "h100-sxm", "--gpus", "8", "--target", "nccl",
                        "--out", str(tmp_path / name))
    line = one_error_line(done)
    assert "too long" in line and "255 bytes" in line and "5,000" in line
    assert "end (" in line and len(line) < 600  # its two ends and its length, not all 5,000 characters
    assert list(tmp_path.iterdir()) == []  # nothing written


# --- duplicate keys, symbolic link loops -----------------------------------------------------------------------------


def test_a_duplicated_yaml_key_is_refused_with_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    text = catalog_text({**h100_record(), "id": "dup"})
    lines = text.splitlines()
    at = next(index for index, line in enumerate(lines) if line.strip().startswith("hbm_gib:"))
    lines.insert(at + 1, lines[at].replace("80", "4000"))  # hbm_gib: 80, then hbm_gib: 4000 (was a 4,000 GiB GPU)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    line = one_error_line(run_gpufleet("catalog", "show", "dup", "--catalog", str(path)))
    assert "'hbm_gib' twice" in line and f"lines {at + 1} and {at + 2}" in line


def test_a_duplicated_json_key_is_refused_with_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text('{\n  "plans": [],\n  "a": {"b": 1},\n  "plans": [1]\n}\n', encoding="utf-8")
    line = one_error_line(run_gpufleet("cost", "--plan", str(path)))
    assert "'plans' twice" in line and "lines 2 and 4" in line


def test_the_same_key_in_different_mappings_is_not_a_duplicate(tmp_path: Path) -> None:
    yaml_path, json_path = tmp_path / "a.yaml", tmp_path / "a.json"
    yaml_path.write_text("a: {id: 1}\nb: {id: 2}\nbase: &base {x: 1}\nmerged: {<<: *base, x: 2}\n", encoding="utf-8")
    json_path.write_text('[{"id": 1}, {"id": 2, "more": {"id": 3}}]', encoding="utf-8")
    assert load_yaml(yaml_path, "file") == {"a": {"id": 1}, "b": {"id": 2}, "base": {"x": 1}, "merged": {"x": 2}}
    assert load_json(json_path, "file") == [{"id": 1}, {"id": 2, "more": {"id": 3}}]


@pytest.mark.parametrize("command", [["validate", "--runs"], ["catalog", "list", "--catalog"], ["cost", "--plan"],
                                     ["doctor", "nccl-log"]])
def test_a_symbolic_link_loop_is_named_as_one(tmp_path: Path, command: list[str]) -> None:
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(loop)
    line = one_error_line(run_gpufleet(*command, str(loop)))
    assert "symbolic link loop" in line and "does not exist" not in line


# --- YAML bounded in nodes, so in time ------------------------------------------------------------------------------


def test_a_5_mb_catalog_of_200k_records_is_refused_quickly(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text("gpus:\n" + "".join(f"  - {{id: g{index}, name: n}}\n" for index in range(200_000)),
                    encoding="utf-8")
    assert path.stat().st_size > 5 * 10**6
    started = time.monotonic()
    line = one_error_line(run_gpufleet("catalog", "list", "--catalog", str(path), timeout=REFUSAL_LIMIT_S))
    assert time.monotonic() - started < REFUSAL_LIMIT_S  # it did not load in 60 s before
    assert f"more than {MAX_YAML_NODES:,} YAML nodes" in line and "huge.yaml line" in line


def test_the_node_budget_is_exact() -> None:
    """A list of MAX_YAML_NODES - 1 values is MAX_YAML_NODES nodes (the list is one): read; one more is refused."""
    at = "[" + ",".join(["1"] * (MAX_YAML_NODES - 1)) + "]"
    assert len(parse_yaml(at, "at.yaml", "file")) == MAX_YAML_NODES - 1
    with pytest.raises(InputError, match="YAML nodes"):
        parse_yaml(at[:-1] + ",1]", "over.yaml", "file")


def test_an_alias_counts_as_everything_it_repeats() -> None:
    """Nine aliases of nine aliases ... (a 'billion laughs') is a few hundred bytes and billions of values."""
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]" for n in range(1, 9)]
    started = time.monotonic()
    with pytest.raises(InputError, match="an alias counted as what it repeats"):
        parse_yaml("\n".join(levels), "laughs.yaml", "file")
    assert time.monotonic() - started < 5
    assert parse_yaml("a: &a [1, 2]\nb: *a\n", "small.yaml", "file") == {"a": [1, 2], "b": [1, 2]}


def test_integers_are_read_up_to_the_documented_digits() -> None:
    at, over = "1" * MAX_INTEGER_DIGITS, "1" * (MAX_INTEGER_DIGITS + 1)
    assert parse_yaml(f"n: {at}", "a.yaml", "file") == {"n": int(at)}
    assert parse_json(f'{{"n": -{at}}}', "a.json", "file") == {"n": -int(at)}
    for text, parse in ((f"n: {over}", parse_yaml), (f'{{"n": {over}}}', parse_json)):
        with pytest.raises(InputError, match=f"{MAX_INTEGER_DIGITS + 1} digits"):
            parse(text, "file", "file")


def test_a_json_document_with_a_long_integer_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"plans": []}).replace("[]", f"[{HUGE}]"), encoding="utf-8")
    line = one_error_line(run_gpufleet("cost", "--plan", str(path)))
    assert "plan.json" in line and "5,000 digits" in line


def test_a_duplicated_key_in_a_deepspeed_config_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ds_config.json"
    path.write_text('{\n  "train_batch_size": 64,\n  "train_batch_size": 4096\n}\n', encoding="utf-8")
    line = one_error_line(run_gpufleet("launch", "--check", str(path), "--gpus", "8"))
    assert "'train_batch_size' twice" in line and "lines 2 and 3" in line
