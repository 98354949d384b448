"""`gpufleet ckpt` as a user runs it (a real subprocess, real checkpoint folders, moto on 127.0.0.1):
prune never trades good checkpoints for damaged newer ones, copies never overwrite and survive a kill,
and every bad path, URL or flag is one line on stderr."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from _workers import expected_state, flip_bit, same_state  # noqa: E402

from conftest import S3  # noqa: E402
from gpufleet.runtime.checkpoint import CheckpointManager, open_url, verify_checkpoint  # noqa: E402
from gpufleet.runtime.checkpoint.manager import _local_fs  # noqa: E402
from gpufleet.runtime.checkpoint.names import step_dirname  # noqa: E402

ENTRY = "import sys\nfrom gpufleet.cli.main import run\nrun(sys.argv[1:])\n"


def s3_entry(server: S3) -> str:
    """The entry point, with s3:// URLs pointed at the test server (as a user's AWS config would)."""
    return ("import sys, gpufleet.runtime.checkpoint.store as st\n"
            f"opts = {server.options(via_proxy=False)!r}\n"
            "real = st.open_url\n"
            "st.open_url = lambda u, o=None: real(u, opts if u.startswith('s3://') else o)\n" + ENTRY)


def no_aws_env() -> dict[str, str]:
    """The environment of a user with no AWS credentials anywhere (and no instance metadata to ask)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") or k == "AWS_CA_BUNDLE"}
    env.update(AWS_SHARED_CREDENTIALS_FILE="/nonexistent/credentials", AWS_CONFIG_FILE="/nonexistent/config",
               AWS_EC2_METADATA_DISABLED="true")
    return env


def cli(*args: str, entry: str = ENTRY, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", entry, "ckpt", *args], capture_output=True, text=True,
                          timeout=180, env=env if env is not None else no_aws_env())


def one_line(proc: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: ")
    return proc.stderr


def saved(root: Path, steps: list[int], state: Any = None) -> None:
    manager = CheckpointManager(root, keep_last=100)
    for step in steps:
        manager.save(expected_state(step) if state is None else state, step, blocking=True)
    manager.close()


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` with a digest of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def ckpt_dir(root: Path, step: int) -> Path:
    return root / step_dirname(step)


DAMAGE = {
    "bit flip in the manifest": lambda d: flip_bit(d / "manifest.json", 60),
    "missing data file": lambda d: (d / "__0_0.distcp").unlink(),
    "truncated data file": lambda d: os.truncate(d / "__0_0.distcp", 100),
    "bit flip in a data file": lambda d: flip_bit(d / "__0_0.distcp", 4000),
}


# -- prune ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_prune_keeps_the_newest_good_checkpoint_when_a_newer_one_is_damaged(tmp_path: Path, damage: str) -> None:
    saved(tmp_path, [1, 2, 3])
    DAMAGE[damage](ckpt_dir(tmp_path, 3))
    damaged_before = snapshot(ckpt_dir(tmp_path, 3))
    proc = cli("prune", str(tmp_path), "--keep-last", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["deleted"] == [str(ckpt_dir(tmp_path, 1))]
    assert result["kept"] == [str(ckpt_dir(tmp_path, 2))]
    assert [d["step"] for d in result["damaged"]] == [3] and result["damaged"][0]["problems"]
    assert not ckpt_dir(tmp_path, 1).exists()
    assert verify_checkpoint(_local_fs(), str(ckpt_dir(tmp_path, 2))).ok  # the good one survives, whole
    assert snapshot(ckpt_dir(tmp_path, 3)) == damaged_before  # the damaged one is left alone, untouched
    found = CheckpointManager(tmp_path).load_latest()
    assert found is not None and found[0] == 2 and same_state(found[1], expected_state(2))


def test_prune_says_what_it_left_and_list_agrees_on_what_is_complete(tmp_path: Path) -> None:
    saved(tmp_path, [1, 2, 3])
    DAMAGE["missing data file"](ckpt_dir(tmp_path, 3))
    listed = json.loads(cli("list", str(tmp_path), "--json").stdout)["checkpoints"]
    assert [(row["step"], row["complete"]) for row in listed] == [(1, True), (2, True), (3, False)]
    proc = cli("prune", str(tmp_path), "--keep-last", "1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "would delete step 1" in proc.stdout and "left damaged step 3" in proc.stdout
    assert "__0_0.distcp: missing" in proc.stdout
    assert sorted(p.name for p in tmp_path.glob("step_*")) == [step_dirname(s) for s in (1, 2, 3)]
    assert "never deleted" in cli("prune", "--help").stdout


def test_manager_retention_does_not_count_a_damaged_checkpoint(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=2)
    manager.save(expected_state(1), 1, blocking=True)
    manager.save(expected_state(2), 2, blocking=True)
    DAMAGE["missing data file"](ckpt_dir(tmp_path, 2))
    manager.save(expected_state(3), 3, blocking=True)
    assert manager.steps() == [1, 2, 3]  # 1 and 3 are the two kept; 2 is damaged, left, not counted
    assert same_state(manager.load(1), expected_state(1))
    manager.close()


# -- upload / download: never overwrite, crash-safe ----------------------------------------------------


def test_download_refuses_to_overwrite_a_different_checkpoint_and_skips_an_identical_one(tmp_path: Path) -> None:
    source, other, dest = tmp_path / "source", tmp_path / "other", tmp_path / "dest"
    saved(source, [5])
    saved(other, [5], state=expected_state(99))  # step 5 again, different bytes
    assert cli("download", str(source), str(dest)).returncode == 0
    before = snapshot(dest)
    line = one_line(cli("download", str(other), str(dest)), code=1)
    assert "different checkpoint of step 5" in line and "not overwritten" in line
    assert snapshot(dest) == before
    proc = cli("download", str(source), str(dest))
    assert proc.returncode == 0 and "already at" in proc.stdout, proc.stderr
    assert snapshot(dest) == before
    found = CheckpointManager(dest).load_latest()
    assert found is not None and same_state(found[1], expected_state(5))


def test_download_repairs_a_copy_whose_bytes_rotted(tmp_path: Path) -> None:
    # same manifest, one byte flipped in a data file of the same size: not "identical" — the good source
    # replaces the damaged copy
    source, dest = tmp_path / "source", tmp_path / "dest"
    saved(source, [5])
    assert cli("download", str(source), str(dest)).returncode == 0
    copy = dest / step_dirname(5)
    files = [p for p in copy.rglob("*") if p.is_file() and p.name != "manifest.json"]
    data = max(files, key=lambda p: p.stat().st_size)
    flip_bit(data, data.stat().st_size // 2)
    assert not verify_checkpoint(_local_fs(), str(copy)).ok
    proc = cli("download", str(source), str(dest))
    assert proc.returncode == 0 and "already at" not in proc.stdout, proc.stdout + proc.stderr
    assert verify_checkpoint(_local_fs(), str(copy)).ok
    found = CheckpointManager(dest).load_latest()
    assert found is not None and same_state(found[1], expected_state(5))


def test_a_damaged_step_does_not_stop_the_good_ones_after_it(tmp_path: Path) -> None:
    source, dest = tmp_path / "source", tmp_path / "dest"
    saved(source, [1, 2, 3])
    DAMAGE["bit flip in a data file"](ckpt_dir(source, 2))
    proc = cli("download", str(source), str(dest), "--json")
    assert proc.returncode == 1 and "step 2" in one_line(proc, code=1)
    result = json.loads(proc.stdout)  # what did and did not go across, for a script
    assert [item["step"] for item in result["copied"]] == [1, 3]
    assert [item["step"] for item in result["not_copied"]] == [2]
    assert not ckpt_dir(dest, 2).exists()
    for step in (1, 3):
        assert verify_checkpoint(_local_fs(), str(ckpt_dir(dest, step))).ok


def test_failed_checks_say_why_on_stderr_and_in_json(tmp_path: Path) -> None:
    root, empty = tmp_path / "root", tmp_path / "empty"
    saved(root, [1, 2, 3])
    DAMAGE["bit flip in a data file"](ckpt_dir(root, 2))
    empty.mkdir()
    for args in (["verify", str(root)], ["verify", str(root), "--json"]):
        proc = cli(*args)
        line = one_line(proc, code=1)
        assert "1 of 3 checkpoint(s)" in line and "do not verify" in line and "2" in line, line
    result = json.loads(proc.stdout)
    assert "do not verify" in result["error"] and result["ok"] is False
    assert [(c["step"], c["ok"]) for c in result["checkpoints"]] == [(1, True), (2, False), (3, True)]
    for command, src in (("upload", str(empty)), ("download", f"file://{empty}")):
        proc = cli(command, src, str(tmp_path / "dest"), "--json")
        assert "no complete checkpoints found" in one_line(proc, code=1)
        result = json.loads(proc.stdout)
        assert "no complete checkpoints found" in result["error"], result
        assert result["copied"] == [] and result["not_copied"] == []
    proc = cli("download", str(root), str(tmp_path / "dest"), "--json")
    assert "not downloaded" in one_line(proc, code=1)
    assert "step 2" in json.loads(proc.stdout)["error"]


def test_upload_refuses_to_overwrite_a_different_checkpoint_in_the_store(s3: tuple[S3, str], tmp_path: Path) -> None:
    server, url = s3
    saved(tmp_path / "a", [4])
    saved(tmp_path / "b", [4], state=expected_state(77))
    entry = s3_entry(server)
    assert cli("upload", str(tmp_path / "a"), url, entry=entry).returncode == 0
    line = one_line(cli("upload", str(tmp_path / "b"), url, entry=entry), code=1)
    assert "different checkpoint of step 4" in line
    fs, root = open_url(url, server.options(via_proxy=False))
    assert verify_checkpoint(fs, f"{root}/{step_dirname(4)}").ok
    assert cli("download", url, str(tmp_path / "c"), entry=entry).returncode == 0
    found = CheckpointManager(tmp_path / "c").load_latest()
    assert found is not None and same_state(found[1], expected_state(4))


def test_a_download_killed_midway_leaves_the_destination_as_it_was(tmp_path: Path) -> None:
    source, dest = tmp_path / "source", tmp_path / "dest"
    saved(source, [7], state={"w": torch.randn(6 * 2**20)})  # 24 MiB: about 12 s at the cap below
    saved(dest, [1])
    before = snapshot(dest)
    proc = subprocess.Popen([sys.executable, "-c", ENTRY, "ckpt", "download", str(source), str(dest),
                             "--max-mib-per-s", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not any(p.is_file() and p.stat().st_size > 0 and p.name != "latest" and str(p.relative_to(dest))
                      not in before for p in dest.rglob("*")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the download never started writing"
            time.sleep(0.05)
        assert proc.poll() is None  # still copying: kill it mid-file
    finally:
        proc.kill()
        proc.communicate()
    verified = cli("verify", str(dest), "--json")
    assert verified.returncode == 0, verified.stdout
    assert [c["step"] for c in json.loads(verified.stdout)["checkpoints"]] == [1]
    assert {k: v for k, v in snapshot(dest).items() if not k.startswith(".tmp-")} == before
    assert cli("download", str(source), str(dest)).returncode == 0  # a retry completes
    assert cli("verify", str(dest)).returncode == 0
    # ...and clears what the killed attempt left: no checkpoint-sized hidden folder piles up
    assert not [p.name for p in dest.iterdir() if p.name.startswith((".tmp-", ".trash-"))]


# -- a destination step that is not this checkpoint is never touched ----------------------------------


def _notes_folder(step_dir: Path, source: Path, other: Path) -> None:
    step_dir.mkdir(parents=True)
    (step_dir / "notes.txt").write_text("precious\n")


def _other_checkpoint_without_its_manifest(step_dir: Path, source: Path, other: Path) -> None:
    shutil.copytree(ckpt_dir(other, 100), step_dir)
    (step_dir / "manifest.json").unlink()


def _a_file_named_like_the_step(step_dir: Path, source: Path, other: Path) -> None:
    step_dir.parent.mkdir(parents=True)
    step_dir.write_text("hi\n")


def _this_checkpoint_with_a_file_added(step_dir: Path, source: Path, other: Path) -> None:
    shutil.copytree(ckpt_dir(source, 100), step_dir)
    (step_dir / "notes.txt").write_text("precious\n")


NOT_OURS = {
    "a folder of someone's files": _notes_folder,
    "another checkpoint whose manifest was removed": _other_checkpoint_without_its_manifest,
    "a file named like the step": _a_file_named_like_the_step,
    "this checkpoint with a file added": _this_checkpoint_with_a_file_added,
}


@pytest.mark.parametrize("command", ["download", "upload"])
@pytest.mark.parametrize("what", sorted(NOT_OURS))
def test_a_destination_step_that_is_not_this_checkpoint_is_refused_and_left_untouched(
        tmp_path: Path, what: str, command: str) -> None:
    source, other, dest = tmp_path / "source", tmp_path / "other", tmp_path / "dest"
    saved(source, [100, 200])
    saved(other, [100], state=expected_state(99))  # step 100 again, different bytes
    NOT_OURS[what](ckpt_dir(dest, 100), source, other)
    before = snapshot(dest)
    src = f"file://{source}" if command == "download" else str(source)
    proc = cli(command, src, str(dest), "--json")
    line = one_line(proc, code=1)
    assert "step 100" in line and "not overwritten" in line, line
    result = json.loads(proc.stdout)
    assert [item["step"] for item in result["not_copied"]] == [100]
    assert str(ckpt_dir(dest, 100)) in result["not_copied"][0]["reason"]
    assert [item["step"] for item in result["copied"]] == [200]  # the good step after it still goes across
    assert {k: v for k, v in snapshot(dest).items() if not k.startswith(step_dirname(200))} == before
    assert not [p.name for p in dest.iterdir() if p.name.startswith(".")]  # nothing moved to a hidden name
    assert verify_checkpoint(_local_fs(), str(ckpt_dir(dest, 200))).ok


@pytest.mark.parametrize("target", ["a cut-off copy elsewhere", "nothing (a broken link)"])
def test_a_symlinked_destination_step_is_refused_and_left_as_it_is(tmp_path: Path, target: str) -> None:
    source, dest, elsewhere = tmp_path / "source", tmp_path / "dest", tmp_path / "elsewhere"
    saved(source, [100, 200])
    if target.startswith("a cut-off"):  # what would otherwise pass for a partial copy, and be replaced
        elsewhere.mkdir()
        shutil.copy2(ckpt_dir(source, 100) / ".metadata", elsewhere / ".metadata")
    dest.mkdir()
    link = ckpt_dir(dest, 100)
    link.symlink_to(elsewhere)
    before = snapshot(elsewhere) if elsewhere.exists() else None
    proc = cli("download", str(source), str(dest), "--json")
    line = one_line(proc, code=1)
    assert "step 100" in line and "symbolic link" in line, line
    result = json.loads(proc.stdout)
    assert [item["step"] for item in result["not_copied"]] == [100]
    assert [item["step"] for item in result["copied"]] == [200]
    assert link.is_symlink() and os.readlink(link) == str(elsewhere)
    assert (snapshot(elsewhere) if elsewhere.exists() else None) == before
    assert not [p.name for p in dest.iterdir() if p.name.startswith(".")]  # no hidden .trash- link left behind


def test_a_copy_cut_off_earlier_is_completed_from_the_same_checkpoint(tmp_path: Path) -> None:
    # every file there is one of this checkpoint's, byte for byte: replacing it loses nothing
    source, dest = tmp_path / "source", tmp_path / "dest"
    saved(source, [100])
    cut_off = ckpt_dir(dest, 100)
    cut_off.mkdir(parents=True)
    shutil.copy2(ckpt_dir(source, 100) / ".metadata", cut_off / ".metadata")
    proc = cli("download", str(source), str(dest))
    assert proc.returncode == 0 and "downloaded step 100" in proc.stdout, proc.stdout + proc.stderr
    assert verify_checkpoint(_local_fs(), str(cut_off)).ok
    assert not [p.name for p in dest.iterdir() if p.name.startswith(".")]


# -- a file named like a step is not a checkpoint: shown, reported, never read or deleted --------------


def test_a_file_named_like_a_step_is_reported_and_never_deleted(tmp_path: Path) -> None:
    root = tmp_path / "root"
    saved(root, [1, 2, 3])
    stray = ckpt_dir(root, 400)
    stray.write_text("hi\n")
    report = verify_checkpoint(_local_fs(), str(stray))  # the library says so too, instead of raising OSError
    assert not report.ok and "not a checkpoint folder" in report.problems[0]
    listed = cli("list", str(root), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["checkpoints"]
    assert [(row["step"], row["complete"]) for row in rows] == [(1, True), (2, True), (3, True), (400, False)]
    assert "not a checkpoint folder" in rows[-1]["problems"][0]
    table = cli("list", str(root))
    assert table.returncode == 0 and "not a checkpoint folder" in table.stdout, table.stdout + table.stderr
    verified = cli("verify", str(root), "--json")
    assert verified.returncode == 1, verified.stdout + verified.stderr
    results = json.loads(verified.stdout)["checkpoints"]
    assert [(r["step"], r["ok"]) for r in results] == [(1, True), (2, True), (3, True), (400, False)]
    assert "not a checkpoint folder" in results[-1]["problems"][0]
    dry = cli("prune", str(root), "--keep-last", "1", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would delete step 1" in dry.stdout and "not a checkpoint folder" in dry.stdout
    pruned = cli("prune", str(root), "--keep-last", "1", "--incomplete", "--json")
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout)["deleted"] == [str(ckpt_dir(root, 1)), str(ckpt_dir(root, 2))]
    assert stray.read_text() == "hi\n"
    assert sorted(p.name for p in root.iterdir() if p.name != "latest") == [step_dirname(3), step_dirname(400)]
    copied = cli("upload", str(root), str(tmp_path / "dest"), "--json")
    assert copied.returncode == 0, copied.stderr
    assert [item["step"] for item in json.loads(copied.stdout)["copied"]] == [3]


def test_a_broken_link_is_not_called_a_file_and_set_aside_folders_are_listed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    saved(root, [1])
    ckpt_dir(root, 7).symlink_to(tmp_path / "nowhere")
    aside = root / f"{step_dirname(5)}.set-aside-0123abcd"
    aside.mkdir()
    (aside / "notes.txt").write_text("precious\n")
    listed = cli("list", str(root), "--json")
    assert listed.returncode == 0, listed.stderr
    result = json.loads(listed.stdout)
    assert [(row["step"], row["complete"]) for row in result["checkpoints"]] == [(1, True), (7, False)]
    assert result["checkpoints"][-1]["problems"] == ["not a checkpoint folder"]
    assert result["set_aside"] == [str(aside)]
    table = cli("list", str(root))
    assert table.returncode == 0 and "a file" not in table.stdout, table.stdout
    assert f"{aside}: set aside (not a checkpoint; delete when reviewed)" in table.stdout, table.stdout
    verified = cli("verify", str(root), "--json")
    assert verified.returncode == 1
    problems = json.loads(verified.stdout)["checkpoints"][-1]["problems"]
    assert problems == [f"{ckpt_dir(root, 7)}: not a checkpoint folder"], problems
    dry = cli("prune", str(root), "--keep-last", "1", "--dry-run")
    assert dry.returncode == 0 and "not a checkpoint folder" in dry.stdout and "a file" not in dry.stdout, dry.stdout
    assert ckpt_dir(root, 7).is_symlink() and (aside / "notes.txt").read_text() == "precious\n"


def test_copying_a_root_onto_itself_is_refused(tmp_path: Path) -> None:
    root, link = tmp_path / "root", tmp_path / "link"
    saved(root, [1])
    link.symlink_to(root)
    before = snapshot(root)
    for args in (["upload", str(root), str(root)], ["download", f"file://{root}", f"{root}/"],
                 ["upload", str(link), str(root)]):
        line = one_line(cli(*args))
        assert "same place" in line, (args, line)
    assert snapshot(root) == before


def test_copying_a_root_into_itself_or_out_of_a_root_it_contains_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    saved(root, [1, 2])
    (tmp_path / "link").symlink_to(root)
    before = snapshot(root)
    cases = {
        ("upload", str(root), str(ckpt_dir(root, 2))): "destination is inside the source",
        ("download", f"file://{root}", f"{root}/sub/dir"): "destination is inside the source",
        ("upload", str(tmp_path / "link"), f"{root}/x"): "destination is inside the source",
        ("upload", str(ckpt_dir(root, 2)), str(root)): "source is inside the destination",
        ("download", f"file://{ckpt_dir(root, 1)}", f"file://{tmp_path}"): "source is inside the destination",
    }
    for args, words in cases.items():
        line = one_line(cli(*args))
        assert words in line, (args, line)
    assert snapshot(root) == before and not (root / "sub").exists() and not (root / "x").exists()
    # a sibling whose name merely starts with the source's is not inside it
    assert cli("upload", str(root), f"{root}-copy").returncode == 0


# -- one line, exit 2 ----------------------------------------------------------------------------------


def test_bad_destinations_urls_and_missing_credentials_are_one_line(tmp_path: Path) -> None:
    saved(tmp_path / "a", [1])
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder\n")
    assert "cannot create the destination folder /proc/x" in one_line(cli("upload", str(tmp_path / "a"), "/proc/x"))
    assert "is a file" in one_line(cli("upload", str(tmp_path / "a"), str(a_file)))
    assert "Not a directory" in one_line(cli("download", str(tmp_path / "a"), str(a_file / "sub")))
    assert "bucket is required" in one_line(cli("list", "s3://"))
    line = one_line(cli("list", "s3://any-bucket/x"))
    assert "no credentials" in line and "AWS_ACCESS_KEY_ID" in line
    assert a_file.read_text() == "not a folder\n"


@pytest.mark.parametrize(("args", "flag"), [
    (["upload", "{a}", "{dst}", "--max-mib-per-s", "0"], "--max-mib-per-s"),
    (["download", "{a}", "{dst}", "--max-mib-per-s", "-1"], "--max-mib-per-s"),
    (["prune", "{a}", "--keep-last", "0"], "--keep-last"),
    (["prune", "{a}", "--keep-last", "-3"], "--keep-last"),
    (["prune", "{a}", "--keep-last", "1", "--keep-every", "0"], "--keep-every"),
    (["verify", "{a}", "--step", "-1"], "--step"),
])
def test_bad_flag_values_name_the_flag_and_touch_nothing(tmp_path: Path, args: list[str], flag: str) -> None:
    saved(tmp_path / "a", [1, 2])
    before = snapshot(tmp_path / "a")
    line = one_line(cli(*(arg.format(a=tmp_path / "a", dst=tmp_path / "dst") for arg in args)))
    assert flag in line, line
    assert not any(field in line for field in ("keep_last", "keep_every", "max_bytes_per_s")), line
    assert snapshot(tmp_path / "a") == before and not (tmp_path / "dst").exists()


def test_verify_and_list_refuse_paths_that_hold_no_checkpoints(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x\n")
    (tmp_path / "empty").mkdir()
    assert "is a file" in one_line(cli("verify", str(a_file)))
    assert "is a file" in one_line(cli("list", str(a_file)))
    assert "does not exist" in one_line(cli("verify", str(tmp_path / "typo")))
    assert "empty" in one_line(cli("verify", ""))  # refused by the CLI before the command runs
    assert "no checkpoints found" in one_line(cli("verify", str(tmp_path / "empty")), code=1)
    assert "no complete checkpoints found" in one_line(cli("upload", str(tmp_path / "empty"), str(tmp_path / "d")),
                                                       code=1)
