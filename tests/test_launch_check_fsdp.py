"""`launch --check` on a PyTorch FSDP keyword dict (seed claim S2-17), checked against the installed PyTorch's own
FullyShardedDataParallel: its signature, enums and dataclasses, and (as the independent check of what the reader
calls a problem or a note) a real FSDP wrapper built with each value in a one-rank gloo process group."""

from __future__ import annotations

import inspect
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from clirun import one_error_line, run_gpufleet
from gpufleet.catalog.registry import Catalog
from gpufleet.emit.check import check_files
from gpufleet.emit.read import kind_of, read_file
from gpufleet.emit.read_fsdp import fsdp_api
from gpufleet.emit.read_fsdp_file import FSDP_MARKERS
from gpufleet.extras import MissingExtraError

pytestmark = pytest.mark.timeout(120)
torch = pytest.importorskip("torch", reason="the runtime extra (scripts/test installs it)")

#: Seed 002 l.39-48, as printed (its two imports, then the dict).
SEED_IMPORTS = ("# FSDP configuration example\nfrom torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
                "from torch.distributed.fsdp import ShardingStrategy\n")
SEED_DICT = """fsdp_config = {
"sharding_strategy": ShardingStrategy.FULL_SHARD,
"mixed_precision": True,
"forward_prefetch": True,
"limit_all_gathers": True,
"cpu_offload": False # Keep everything on GPU for speed
}
"""
GOOD = {"sharding_strategy": "SHARD_GRAD_OP", "backward_prefetch": "BACKWARD_POST", "use_orig_params": True,
        "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32", "buffer_dtype": "bfloat16"},
        "cpu_offload": {"offload_params": True}, "sync_module_states": True, "device_id": 0}


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_markers_are_keywords_of_the_installed_pytorch() -> None:
    """kind_of tells an FSDP dict by these names without importing torch: each is still a keyword of FSDP1."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    keywords = set(inspect.signature(FullyShardedDataParallel.__init__).parameters)
    assert keywords >= FSDP_MARKERS
    assert fsdp_api().keywords["limit_all_gathers"] is True and fsdp_api().keywords["use_orig_params"] is False


def test_the_seeds_dict_has_one_problem_and_two_notes(tmp_path: Path) -> None:
    """S2-17: mixed_precision=True is the problem; cpu_offload=False (works by accident) and limit_all_gathers=True
    (the default) are notes; forward_prefetch=True changes the default (False) and says nothing."""
    found = read_file(_write(tmp_path / "fsdp_seed002.py", SEED_DICT))
    assert found.kind == "fsdp" and found.sharding == "fsdp" and found.precision is None
    assert len(found.problems) == 1, found.problems
    assert found.problems[0].startswith("fsdp_seed002.py: mixed_precision=True: FullyShardedDataParallel takes a "
                                        "MixedPrecision(")
    assert "`mixed_precision or MixedPrecision()`" in found.problems[0] and "param_dtype" in found.problems[0]
    assert len(found.notes) == 2, found.notes
    assert found.notes[0] == "limit_all_gathers=True is already PyTorch's default"
    assert found.notes[1].startswith("cpu_offload=False works by accident") and "write null" in found.notes[1]
    ran = run_gpufleet("launch", "--check", str(tmp_path / "fsdp_seed002.py"), "--json")
    assert ran.returncode == 1, ran.stderr
    report = json.loads(ran.stdout)
    assert report["files"][0]["kind"] == "fsdp" and report["problems"] == found.problems
    assert "fsdp_seed002.py: cpu_offload=False works by accident" in " ".join(report["notes"])


def _fsdp_outcome(**keywords: Any) -> str:
    """'ok' when a real FSDP wraps a Linear with these keywords and runs a forward and backward, else the error."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    try:
        wrapped = FullyShardedDataParallel(torch.nn.Linear(4, 4), device_id=torch.device("cpu"), **keywords)
        wrapped(torch.randn(2, 4)).sum().backward()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return "ok"


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_pytorch_itself_fails_where_the_reader_says_problem_and_runs_where_it_says_note() -> None:
    """The seed's keywords in a real FullyShardedDataParallel (one rank, gloo, CPU): True for mixed_precision fails
    at param_dtype; False there and for cpu_offload run; True for cpu_offload fails at offload_params."""
    import torch.distributed as dist
    from torch.distributed.fsdp import ShardingStrategy

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        seed = {"sharding_strategy": ShardingStrategy.FULL_SHARD, "mixed_precision": True, "forward_prefetch": True,
                "limit_all_gathers": True, "cpu_offload": False}
        assert _fsdp_outcome(**seed) == "AttributeError: 'bool' object has no attribute 'param_dtype'"
        assert _fsdp_outcome(**{**seed, "mixed_precision": None}) == "ok"
        assert _fsdp_outcome(mixed_precision=False) == "ok" and _fsdp_outcome(cpu_offload=False) == "ok"
        assert "'bool' object has no attribute 'offload_params'" in _fsdp_outcome(cpu_offload=True)
    finally:
        dist.destroy_process_group()


def test_true_and_false_for_the_object_keywords(tmp_path: Path) -> None:
    found = read_file(_write(tmp_path / "f.json", json.dumps({"mixed_precision": False, "cpu_offload": True})))
    assert found.notes == ["mixed_precision=False works by accident: FSDP keeps `mixed_precision or "
                           "MixedPrecision()`, and MixedPrecision() is the default; write null"]
    assert len(found.problems) == 1 and "cpu_offload=True" in found.problems[0]
    assert "state.cpu_offload.offload_params" in found.problems[0]


def test_unknown_keys_name_the_nearest_real_one(tmp_path: Path) -> None:
    found = read_file(_write(tmp_path / "f.json", json.dumps({
        "sharding_stratgy": "FULL_SHARD", "limit_all_gather": True,
        "mixed_precision": {"param_dtyp": "bfloat16", "reduce_dtype": "bf16"}})))
    assert found.problems == [
        "f.json: sharding_stratgy: not a keyword of PyTorch 2.13.0's FullyShardedDataParallel (did you mean "
        "sharding_strategy?)",
        "f.json: limit_all_gather: not a keyword of PyTorch 2.13.0's FullyShardedDataParallel (did you mean "
        "limit_all_gathers?)",
        "f.json: mixed_precision.param_dtyp: not a field of PyTorch 2.13.0's MixedPrecision (did you mean "
        "param_dtype?)",
        "f.json: mixed_precision.reduce_dtype='bf16': not a torch dtype (e.g. \"bfloat16\", \"float16\", "
        "\"float32\", or null)"]


def test_enum_values_are_the_enums_members(tmp_path: Path) -> None:
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy

    found = read_file(_write(tmp_path / "f.json", json.dumps({"sharding_strategy": "FULL", "backward_prefetch":
                                                               "BackwardPrefetch.BACKWARD_PRE"})))
    assert len(found.problems) == 1 and "sharding_strategy='FULL': not a ShardingStrategy member" in found.problems[0]
    assert all(name in found.problems[0] for name in ShardingStrategy.__members__)
    assert found.notes == ["backward_prefetch='BackwardPrefetch.BACKWARD_PRE' is already PyTorch's default"]
    assert BackwardPrefetch.BACKWARD_PRE.name in found.notes[0]


@pytest.mark.parametrize(("strategy", "sharding"), [
    ("FULL_SHARD", "fsdp"), ("ShardingStrategy.SHARD_GRAD_OP", "zero2"), ("HYBRID_SHARD", "hsdp"),
    ("NO_SHARD", "none"), ("_HYBRID_SHARD_ZERO2", None), (None, "fsdp"),  # None: FSDP's `or FULL_SHARD`
])
def test_sharding_strategy_maps_to_gpufleets_names(tmp_path: Path, strategy: str | None,
                                                   sharding: str | None) -> None:
    found = read_file(_write(tmp_path / "f.json", json.dumps({"sharding_strategy": strategy})))
    assert found.sharding == sharding and not found.problems
    assert ("no gpufleet equivalent" in " ".join(found.notes)) == (sharding is None)


def test_a_correct_config_has_no_problems_and_feeds_the_estimate(tmp_path: Path) -> None:
    path = _write(tmp_path / "good.json", json.dumps(GOOD))
    found = read_file(path)
    assert found.problems == [] and found.notes == []
    assert (found.sharding, found.precision) == ("zero2", "bf16")
    checked = check_files(Catalog(), [path], "llama3-8b", "h100-sxm", 8)  # what --model prints
    shown = io.StringIO()
    checked.render(Console(file=shown, width=160))
    assert shown.getvalue().startswith(f"{path} (fsdp): no degrees stated, sharding zero2, precision bf16\n")
    report = checked.as_dict()
    assert report["consistent"] and report["files"][0]["sharding"] == "zero2"
    assert report["expected"]["layout"].split() == ["tp1", "pp1", "dp8", "mb1", "zero2"]


NAMED = '''"""FSDP keywords, as a training script would hold them."""
cfg: dict = {
    "sharding_strategy": ShardingStrategy.SHARD_GRAD_OP,  # a dotted enum name: read as its text, never looked up
    "backward_prefetch": "BACKWARD_POST",
    "mixed_precision": True,
    "cpu_offload": {"offload_params": True},
    "device_id": 0,
    "limit_all_gathers": True,
    "sharding_stratgy": None,
}
'''
SAME_AS_JSON = {"sharding_strategy": "SHARD_GRAD_OP", "backward_prefetch": "BACKWARD_POST", "mixed_precision": True,
                "cpu_offload": {"offload_params": True}, "device_id": 0, "limit_all_gathers": True,
                "sharding_stratgy": None}


def _said(found: Any) -> tuple[list[str], list[str], str | None, str | None]:
    return [problem.split(": ", 1)[1] for problem in found.problems], found.notes, found.sharding, found.precision


def test_a_python_dict_literal_reads_as_the_same_json(tmp_path: Path) -> None:
    as_json = read_file(_write(tmp_path / "cfg.json", json.dumps(SAME_AS_JSON)))
    problems, notes, sharding, _ = _said(as_json)
    assert len(problems) == 2 and notes == ["limit_all_gathers=True is already PyTorch's default"]
    assert sharding == "zero2"
    assert _said(read_file(_write(tmp_path / "named.py", NAMED))) == _said(as_json)
    assert _said(read_file(_write(tmp_path / "bare.py", repr(SAME_AS_JSON)))) == _said(as_json)  # a bare {…}
    unpacked = _write(tmp_path / "unpacked.py", "cfg = {'sharding_strategy': 'FULL_SHARD', **other}\n")
    assert "`**` unpacking" in one_error_line(run_gpufleet("launch", "--check", str(unpacked)))


@pytest.mark.parametrize("code", [
    SEED_IMPORTS + SEED_DICT,  # the seed as printed: its imports are code
    "import pathlib\npathlib.Path(MARKER).write_text('ran')\nfsdp_config = {'sharding_strategy': 'FULL_SHARD'}\n",
    "fsdp_config = {'sharding_strategy': 'FULL_SHARD', 'param_init_fn': __import__('pathlib').Path(MARKER)"
    ".write_text('ran')}\n",
    "fsdp_config = dict(sharding_strategy=open(MARKER, 'w').write('ran'))\n",
], ids=["seed-imports", "statement", "call-in-dict", "dict-call"])
def test_python_with_code_is_refused_in_one_line_and_never_run(tmp_path: Path, code: str) -> None:
    marker = tmp_path / "ran.marker"
    path = _write(tmp_path / "fsdp_config.py", code.replace("MARKER", repr(str(marker))))
    assert kind_of(path, path.read_text()) == "fsdp"
    line = one_error_line(run_gpufleet("launch", "--check", str(path)))
    assert "fsdp_config.py" in line and ("not an FSDP config gpufleet reads" in line or "is not a literal" in line)
    assert "never runs it" in line
    assert not marker.exists()
    if "MARKER" in code:  # the control: run, the file does write the marker
        exec(compile(path.read_text(), str(path), "exec"), {})
        assert marker.exists()


def test_bad_json_is_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "fsdp.json", '{"sharding_strategy": "FULL_SHARD", "mixed_precision": null,}\n')
    assert "fsdp.json is not valid JSON" in one_error_line(run_gpufleet("launch", "--check", str(path)))


def test_a_deepspeed_config_with_an_fsdp_name_stays_deepspeed(tmp_path: Path) -> None:
    text = json.dumps({"train_batch_size": 8, "mixed_precision": True})
    assert kind_of(tmp_path / "ds.json", text) == "deepspeed"
    assert kind_of(tmp_path / "f.json", json.dumps({"mixed_precision": None})) == "fsdp"


def test_without_torch_the_check_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "f.json", json.dumps({"sharding_strategy": "FULL_SHARD"}))
    fsdp_api.cache_clear()
    monkeypatch.setitem(sys.modules, "torch.distributed.fsdp", None)  # `from … import` raises ImportError
    try:
        with pytest.raises(MissingExtraError, match=r"checking an FSDP config needs torch, from the runtime extra, "
                                                    r"which is not installed: pip install 'gpufleet\[runtime\]'"):
            read_file(path)
    finally:
        fsdp_api.cache_clear()


def test_launch_help_names_the_fsdp_kind() -> None:
    shown = run_gpufleet("launch", "--help")
    assert shown.returncode == 0 and "a PyTorch FSDP keyword" in shown.stdout
    assert "launch --check fsdp_config.py" in shown.stdout  # the example
