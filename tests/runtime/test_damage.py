"""Damage is per step: whatever makes one checkpoint unreadable (a permission refused, a folder where a file
belongs, an I/O error, a manifest nested absurdly deep or holding 1e400, a manifest of another step) makes a
fresh process skip that step, load the newest intact one exactly, and go on saving with retention; `ckpt
list/verify/prune` report that step and go on.

Each case damages step 3 of steps 1-3 and then runs, in a fresh process, the three `ckpt` commands and a resume
that saves step 4. Before the fix these raised IsADirectoryError, PermissionError, OSError, RecursionError or
OverflowError, or (a renamed copy) loaded step 1's state as step 3's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from _workers import expected_state  # noqa: E402

from gpufleet.runtime.checkpoint import CheckpointManager, verify_checkpoint  # noqa: E402
from gpufleet.runtime.checkpoint.manager import _local_fs  # noqa: E402
from gpufleet.runtime.checkpoint.manifest import MAX_MANIFEST_BYTES, _digest_of, json_depth  # noqa: E402
from gpufleet.runtime.checkpoint.names import step_dirname  # noqa: E402

pytestmark = [pytest.mark.timeout(300)]
HERE = Path(__file__).parent
SRC = HERE.parents[1] / "src"
# In one fresh process: `gpufleet ARGS` for each ARGS in the JSON list argv[2] (each run's exit code, stdout and
# stderr printed as one JSON line), then a resume from argv[3] that saves step 4 (`_workers.resume`, one more JSON
# line); every read of the file argv[1] fails (EIO) when it is not empty
FRESH = ("import contextlib, io, json, sys\n"
         f"sys.path.insert(0, {str(HERE)!r})\n"
         "from _workers import fail_reads_of, resume\n"
         "if sys.argv[1]: fail_reads_of(sys.argv[1])\n"
         "from gpufleet.cli.main import run\n"
         "results = []\n"
         "for args in json.loads(sys.argv[2]):\n"
         "    out, err = io.StringIO(), io.StringIO()\n"
         "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
         "        try:\n"
         "            run(args)\n"
         "        except SystemExit as done:\n"
         "            code = done.code\n"
         "    results.append([code, out.getvalue(), err.getvalue()])\n"
         "print(json.dumps(results), flush=True)\n"
         "resume(sys.argv[3], 4, None)\n")


def unprivileged() -> list[str]:
    """A command prefix under which file permissions apply (root ignores them unless its override is dropped)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv (util-linux): file permissions cannot be made to apply")
    probe = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot drop root's permission override here: {probe.stderr.strip()}")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def rewrite_manifest(step_dir: Path, change: Callable[[dict[str, Any]], None], text: Callable[[str], str] = str,
                     ) -> None:
    """Change the manifest's body and recompute its own checksum, as a writer with a bug (or a hand) would."""
    path = step_dir / "manifest.json"
    body = json.loads(path.read_text())
    body.pop("manifest_checksum")
    change(body)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)  # to write (and checksum) the deeply nested case
    try:
        body["manifest_checksum"] = _digest_of(body)
        path.write_text(text(json.dumps(body, sort_keys=True)))
    finally:
        sys.setrecursionlimit(limit)


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def _manifest_a_folder(d: Path) -> None:
    (d / "manifest.json").unlink()
    (d / "manifest.json").mkdir()


def _renamed_copy(d: Path) -> None:
    shutil.rmtree(d)
    shutil.copytree(d.parent / step_dirname(1), d)  # cp -r step_1 step_3


INFINITE = float("inf")  # what json reads 1e400 as


def _huge(key: str) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        def change(body: dict[str, Any]) -> None:
            if key == "step":
                body["step"] = INFINITE
            else:
                next(iter(body["files"].values()))["size_bytes"] = INFINITE
        rewrite_manifest(d, change, text=lambda t: t.replace("Infinity", "1e400"))
    return damage


class Case(NamedTuple):
    damage: Callable[[Path], None]
    reason: str
    """Words the skip message must hold."""
    eio: str | None = None
    """A file of step 3 whose reads fail with EIO."""
    permissions: bool = False
    """Whether the damage is a file mode (so the processes run where permissions apply)."""
    in_data: bool = False
    """In a data file: `ckpt list` (which reads no data) still shows the step complete; verify and loads find it."""


CASES = {
    "manifest is a folder": Case(_manifest_a_folder, "is a folder"),
    "manifest unreadable": Case(lambda d: (d / "manifest.json").chmod(0), "Permission denied", permissions=True),
    "data file unreadable": Case(lambda d: (d / "__0_0.distcp").chmod(0), "Permission denied", permissions=True,
                                 in_data=True),
    "manifest I/O error": Case(lambda d: None, "Input/output error", eio="manifest.json"),
    "data file I/O error": Case(lambda d: None, "Input/output error", eio="__0_1.distcp", in_data=True),
    "manifest nested 1000 deep": Case(lambda d: rewrite_manifest(d, lambda b: b.update(user={"deep": _nested(1000)})),
                                      "nested 1002 levels deep"),
    "step is 1e400": Case(_huge("step"), "step is inf"),
    "size_bytes is 1e400": Case(_huge("size"), "size_bytes is inf"),
    "a renamed copy of step 1": Case(_renamed_copy, "manifest of step 1"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_damaged_step_is_skipped_and_everything_goes_on(tmp_path: Path, case: str) -> None:
    damage, reason, eio_name, permissions, in_data = CASES[case]
    prefix = unprivileged() if permissions else []
    root = tmp_path / "ckpt"
    manager = CheckpointManager(root, keep_last=10)
    for step in (1, 2, 3):
        manager.save(expected_state(step), step, blocking=True)
    manager.close()
    bad = root / step_dirname(3)
    damage(bad)
    eio = str(bad / eio_name) if eio_name else ""

    commands = [["ckpt", "list", str(root), "--json"], ["ckpt", "verify", str(root), "--json"],
                ["ckpt", "prune", str(root), "--keep-last", "1", "--dry-run", "--json"]]
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    proc = subprocess.run([*prefix, sys.executable, "-c", FRESH, eio, json.dumps(commands), str(root)],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    ran, outcome = (json.loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    for _, _, stderr in ran:
        assert "Traceback" not in stderr, stderr
    (code, out, err), (verify_code, verify_out, verify_err), (prune_code, prune_out, prune_err) = ran
    assert code == 0, err
    listed = json.loads(out)
    assert [(row["step"], row["complete"]) for row in listed["checkpoints"]] == [(1, True), (2, True), (3, in_data)]
    assert in_data or reason in "; ".join(listed["checkpoints"][2]["problems"]), listed
    assert verify_code == 1 and verify_err.count("\n") == 1, verify_err
    verified = json.loads(verify_out)
    assert [(c["step"], c["ok"]) for c in verified["checkpoints"]] == [(1, True), (2, True), (3, False)]
    assert reason in "; ".join(verified["checkpoints"][2]["problems"]), verified
    assert prune_code == 0, prune_err
    pruned = json.loads(prune_out)
    assert [d["step"] for d in pruned["damaged"]] == [3] and pruned["kept"] == [str(root / step_dirname(2))]

    assert outcome["loaded"] == 2 and outcome["exact"], outcome  # the newest intact step, exactly
    skipped = [line for line in outcome["log"] if "skipped" in line]
    assert skipped and step_dirname(3) in skipped[0] and reason in skipped[0], outcome["log"]
    assert outcome["save_error"] is None, outcome  # the save after it commits and says so
    assert outcome["steps"] == [2, 3, 4], outcome  # retention went on: 1 deleted, 3 left (damaged, not counted)


# -- the manifest as untrusted input (in-process: pure parsing and one folder) -----------------------------


def _reference_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_reference_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_reference_depth(v) for v in value), default=0)
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet='[]{}"\\ab:,\n\u00e9'),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(alphabet='[]{}"\\a'), children,
                                                                      max_size=4),
    max_leaves=30)


@given(json_values)
@settings(max_examples=300, deadline=None)
def test_json_depth_counts_nesting_without_parsing_and_ignores_brackets_in_strings(value: Any) -> None:
    text = json.dumps(value, ensure_ascii=False).encode()
    assert json_depth(text) == _reference_depth(value)


def test_a_manifest_that_is_a_pipe_or_too_large_is_damage_not_a_hang(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=10)
    for step in (1, 2):
        manager.save(expected_state(step), step, blocking=True)
    manifest = tmp_path / step_dirname(2) / "manifest.json"
    manifest.unlink()
    os.mkfifo(manifest)  # read forever by a plain open().read(): nobody ever writes to it
    report = verify_checkpoint(_local_fs(), str(manifest.parent))
    assert not report.ok and "not a regular file" in report.problems[0], report.problems
    found = manager.load_latest()
    assert found is not None and found[0] == 1
    manifest.unlink()
    with open(manifest, "wb") as handle:
        handle.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: no disk used
    report = verify_checkpoint(_local_fs(), str(manifest.parent))
    assert not report.ok and "more than the" in report.problems[0], report.problems
    manager.close()


@pytest.mark.parametrize(("field", "value", "words"), [
    ("step", True, "step is True, not a whole number"),
    ("step", 2.0, "step is 2.0, not a whole number"),
    ("step", -1, "outside"),
    ("world_size", 0, "outside"),
    ("created_unix_s", "soon", "not a finite number"),
    ("files", [], "not an object"),
    ("user", None, "not an object"),
])
def test_every_manifest_field_is_checked_never_coerced(tmp_path: Path, field: str, value: Any, words: str) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(expected_state(2), 2, blocking=True)
    manager.close()
    rewrite_manifest(tmp_path / step_dirname(2), lambda body: body.update({field: value}))
    report = verify_checkpoint(_local_fs(), str(tmp_path / step_dirname(2)))
    assert not report.ok and words in report.problems[0], report.problems


def test_a_checkpoint_that_cannot_be_deleted_never_stops_retention_or_prune(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from gpufleet.cli.main import run as cli_run

    manager = CheckpointManager(tmp_path, keep_last=10)
    for step in (1, 2, 3, 4):
        manager.save(expected_state(step), step, blocking=True)
    manager.close()
    real = os.rename

    def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:  # step 1 refuses to move (delete-by-rename)
        if Path(src).name == step_dirname(1):
            raise PermissionError(13, os.strerror(13), str(src))
        real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(SystemExit) as done:
        cli_run(["ckpt", "prune", str(tmp_path), "--keep-last", "2", "--json"])
    assert done.value.code == 1
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["deleted"] == [str(tmp_path / step_dirname(2))]  # the step after the stuck one still went
    assert [item["step"] for item in result["not_deleted"]] == [1] and "Permission denied" in captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    retaining = CheckpointManager(tmp_path, keep_last=1)
    retaining.save(expected_state(5), 5, blocking=True)  # retention cannot delete step 1: the save still commits
    assert retaining.steps() == [1, 5]
    retaining.close()


def _valid_manifest_bytes() -> bytes:
    from gpufleet.runtime.checkpoint.manifest import FileEntry, Manifest

    return Manifest(step=3, world_size=1, files={"__0_0.distcp": FileEntry(10, "ab" * 16)},
                    user={"lr": 0.1}, created_unix_s=1.7e9).to_json()


@given(st.one_of(
    st.binary(max_size=300),
    st.builds(lambda at, junk: _valid_manifest_bytes()[:at] + junk + _valid_manifest_bytes()[at:],
              st.integers(0, 400), st.binary(min_size=1, max_size=20)),
    st.builds(lambda at: _valid_manifest_bytes()[:at], st.integers(0, 400)),
    json_values.map(lambda value: json.dumps(value).encode()),
))
@settings(max_examples=400, deadline=None)
def test_any_manifest_bytes_parse_or_are_damage_never_another_error(data: bytes) -> None:
    """Fuzz: random bytes, valid manifests with bytes spliced in or cut short, and arbitrary JSON."""
    from gpufleet.runtime.checkpoint.errors import CorruptCheckpointError
    from gpufleet.runtime.checkpoint.manifest import Manifest

    try:
        manifest = Manifest.from_json(data, "/ckpt/step_000000000003")
    except CorruptCheckpointError as error:
        assert error.problems and all(len(problem) < 400 for problem in error.problems)
    else:
        assert manifest.step == 3 and manifest.to_json() == _valid_manifest_bytes()
