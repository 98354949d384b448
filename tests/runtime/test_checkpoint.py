"""Single-process behaviour: commit layout, async isolation, busy policy, retention, corruption
detection (bit flips, truncation, missing shard, missing manifest), safe loading, disk full, CLI."""

from __future__ import annotations

import errno
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from _workers import expected_state, flip_bit, same_state  # noqa: E402

from gpufleet.cli.main import run as cli_run  # noqa: E402
from gpufleet.runtime.checkpoint import (  # noqa: E402
    CheckpointError,
    CheckpointManager,
    CheckpointNameError,
    CorruptCheckpointError,
    steps_to_delete,
    verify_checkpoint,
)
from gpufleet.runtime.checkpoint.manager import _local_fs  # noqa: E402
from gpufleet.runtime.checkpoint.names import check_relpath, inside, step_dirname  # noqa: E402


def cli(*args: str) -> tuple[int, str, str]:
    """Run `gpufleet ckpt …` in a subprocess (fresh interpreter, real exit code)."""
    proc = subprocess.run([sys.executable, "-c", "from gpufleet.cli.main import run; run()", "ckpt", *args],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def saved(root: Path, steps: range, **kwargs: Any) -> CheckpointManager:
    manager = CheckpointManager(root, **kwargs)
    for step in steps:
        manager.save(expected_state(step), step)
    manager.wait()
    return manager


def test_names_and_retention_rules() -> None:
    assert step_dirname(42) == "step_000000000042"
    for bad in (-1, 1.5, True, 10**12):
        with pytest.raises(CheckpointNameError):
            step_dirname(bad)  # type: ignore[arg-type]
    for bad_path in ("../x", "/etc/passwd", "a/../../b", "", "a\\b"):
        with pytest.raises(CheckpointNameError):
            check_relpath(bad_path)
    with pytest.raises(CheckpointNameError):
        inside(Path("/tmp/root"), "../escape")
    assert steps_to_delete([1, 2, 3, 4, 5], keep_last=2) == [1, 2, 3]
    assert steps_to_delete([10, 20, 30, 40, 50], keep_last=2, keep_every=20) == [10, 30]
    with pytest.raises(CheckpointError):
        steps_to_delete([1], keep_last=0)


def test_async_save_is_isolated_from_later_training_steps(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    state = expected_state(7)
    manager.save(state, 7)
    state["model"]["w"].mul_(0)  # the training loop overwrites its tensors at once
    manager.wait()
    found = manager.load_latest()
    assert found is not None and found[0] == 7 and same_state(found[1], expected_state(7))
    assert (tmp_path / "latest").read_text().strip() == "step_000000000007"
    from gpufleet.runtime.checkpoint.dcp_io import WRITE_THREADS

    assert sorted(p.name for p in (tmp_path / "step_000000000007").iterdir()) == [
        ".metadata", *(f"__0_{i}.distcp" for i in range(WRITE_THREADS)), "manifest.json"]


def test_busy_policy_skip_drops_the_second_save(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, if_busy="skip")
    big = {"w": torch.randn(2048, 2048)}
    assert manager.save(big, 1) is True
    assert manager.save(big, 2) is False  # the first is still being written
    manager.wait()
    assert manager.save(big, 3, blocking=True) is True
    assert manager.steps() == [1, 3]


def test_retention_keeps_last_and_every(tmp_path: Path) -> None:
    manager = saved(tmp_path, range(1, 8), keep_last=2, keep_every=3)
    assert manager.steps() == [3, 6, 7]


def test_load_into_a_template(tmp_path: Path) -> None:
    manager = saved(tmp_path, range(2))
    template = expected_state(99)
    loaded = manager.load(0, template)
    assert same_state(loaded, expected_state(0))


DAMAGE = {
    "bit flip in a shard": lambda d: flip_bit(d / "__0_0.distcp", 4000),
    "bit flip in DCP metadata": lambda d: flip_bit(d / ".metadata", 100),
    "bit flip in the manifest": lambda d: flip_bit(d / "manifest.json", 60),
    "truncated shard": lambda d: os.truncate(d / "__0_0.distcp", 1000),
    "missing shard": lambda d: (d / "__0_0.distcp").unlink(),
    "missing manifest": lambda d: (d / "manifest.json").unlink(),
    "extra file": lambda d: (d / "__9_0.distcp").write_bytes(b"junk"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damage_is_detected_by_verify_and_skipped_by_load_latest(tmp_path: Path, damage: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    manager = saved(tmp_path, range(1, 3), keep_last=5)
    newest = tmp_path / "step_000000000002"
    DAMAGE[damage](newest)
    code, out, err = cli("verify", str(tmp_path))
    assert code == 1, (out, err)
    assert "BAD  step 2" in out and "ok  step 1" in out
    code, out, _ = cli("verify", str(tmp_path), "--json")
    result = json.loads(out)
    assert [c["ok"] for c in result["checkpoints"]] == [True, False]
    assert all(str(newest) in problem for problem in result["checkpoints"][1]["problems"])
    found = manager.load_latest()
    assert found is not None and found[0] == 1 and same_state(found[1], expected_state(1))
    assert "step_000000000002" in caplog.text
    with pytest.raises(CorruptCheckpointError):
        manager.load(2)


def test_metadata_that_would_run_code_is_refused(tmp_path: Path) -> None:
    from gpufleet.runtime.checkpoint.dcp_io import SafeReader

    saved(tmp_path, range(1))
    evil = tmp_path / "evil"
    evil.mkdir()

    class Boom:
        def __reduce__(self) -> Any:
            return (os.system, ("echo pwned > /dev/null",))

    (evil / ".metadata").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(CheckpointError, match="not allowed"):
        SafeReader(evil).read_metadata()


def test_disk_full_fails_loudly_and_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                             capture_output=True).returncode == 0
    try:
        root = mount / "ckpt"
        manager = CheckpointManager(root, keep_last=5)
        manager.save({"w": torch.ones(1000)}, 1, blocking=True)
        too_big = {"w": torch.ones(1024, 1024)}  # 4 MiB
        if not mounted:  # no tmpfs allowed here: inject the same kernel error into DCP's writer
            from torch.distributed.checkpoint.filesystem import _FileSystemWriter

            def full(*args: Any, **kwargs: Any) -> Any:
                raise OSError(errno.ENOSPC, "No space left on device (injected)")

            original = _FileSystemWriter.write_data
            _FileSystemWriter.write_data = full  # type: ignore[method-assign]
        try:
            manager.save(too_big, 2)
            with pytest.raises(CheckpointError, match="not saved") as failure:
                manager.wait()
            assert "bytes free on" in str(failure.value)
        finally:
            if not mounted:
                _FileSystemWriter.write_data = original  # type: ignore[method-assign]
        assert manager.steps() == [1]
        assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]
        found = manager.load_latest()
        assert found is not None and found[0] == 1 and torch.equal(found[1]["w"], torch.ones(1000))
        assert (root / "latest").read_text().strip() == "step_000000000001"
    finally:
        if mounted:
            subprocess.run(["umount", str(mount)], check=False)


def test_cli_list_prune_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved(tmp_path, range(1, 5), keep_last=10)
    (tmp_path / "step_000000000009").mkdir()  # an incomplete one: no manifest
    with pytest.raises(SystemExit) as done:
        cli_run(["ckpt", "list", str(tmp_path), "--json"])
    assert done.value.code == 0
    rows = json.loads(capsys.readouterr().out)["checkpoints"]
    assert [(r["step"], r["complete"]) for r in rows] == [(1, True), (2, True), (3, True), (4, True), (9, False)]
    with pytest.raises(SystemExit) as done:
        cli_run(["ckpt", "prune", str(tmp_path), "--keep-last", "2", "--incomplete"])
    assert done.value.code == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step_")) == [
        "step_000000000003", "step_000000000004"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        cli_run(["ckpt", "verify", str(tmp_path / "nowhere")])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1


def test_a_failing_writer_thread_fails_the_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DCP's extra writer threads drop their items silently on an error; the save must fail anyway."""
    from gpufleet.runtime.checkpoint import dcp_io

    manager = CheckpointManager(tmp_path, keep_last=5)
    manager.save(expected_state(1), 1, blocking=True)
    original = dcp_io._HashingWriter.write

    def flaky(self: Any, data: Any) -> int:
        if self.path.name.endswith("_1.distcp"):
            raise OSError(errno.EIO, "Input/output error (injected)")
        return original(self, data)

    monkeypatch.setattr(dcp_io._HashingWriter, "write", flaky)
    manager.save(expected_state(2), 2)
    with pytest.raises(CheckpointError, match="not saved"):
        manager.wait()
    monkeypatch.undo()
    assert manager.steps() == [1]
    found = manager.load_latest()
    assert found is not None and found[0] == 1 and same_state(found[1], expected_state(1))


def test_checksums_hashed_while_writing_match_the_files(tmp_path: Path) -> None:
    manager = saved(tmp_path, range(1, 2))
    report = verify_checkpoint(_local_fs(), str(tmp_path / "step_000000000001"))
    assert report.ok and report.manifest is not None, report.problems
    assert manager.last_stats is not None and manager.last_stats.size_bytes == report.manifest.total_bytes


def test_a_bit_flip_found_while_loading_names_the_file_and_flags_the_template(tmp_path: Path) -> None:
    manager = saved(tmp_path, range(1, 2))
    flip_bit(tmp_path / "step_000000000001" / "__0_0.distcp", 4000)
    template = expected_state(99)
    with pytest.raises(CorruptCheckpointError, match=r"__0_0\.distcp: checksum mismatch") as caught:
        manager.load(1, template)
    assert caught.value.partial_template  # values are read in place before the file's checksum is known
    # The only checkpoint is damaged: with a template that may hold some of its values, load_latest raises
    # rather than returning None (a None would read as "start from a freshly initialised model").
    with pytest.raises(CorruptCheckpointError, match="re-initialise") as caught:
        manager.load_latest(expected_state(99))
    assert caught.value.partial_template
    assert manager.load_latest() is None  # without a template nothing partial can reach the caller


def _shard_files(step_dir: Path) -> list[Path]:
    return sorted(step_dir.glob("*.distcp"))


@pytest.mark.parametrize("where", ["first byte", "middle", "last byte"])
@pytest.mark.parametrize("shard", [0, 1])
def test_load_latest_returns_the_older_checkpoint_exactly_after_mid_file_damage(tmp_path: Path, where: str,
                                                                                shard: int) -> None:
    manager = saved(tmp_path, range(1, 4), keep_last=5)
    target = _shard_files(tmp_path / "step_000000000003")[shard]
    size = target.stat().st_size
    flip_bit(target, {"first byte": 0, "middle": size // 2, "last byte": size - 1}[where])
    template = expected_state(99)
    found = manager.load_latest(template)
    assert found is not None and found[0] == 2
    assert found[1] is template and same_state(template, expected_state(2))


def test_damage_in_bytes_a_partial_load_does_not_need_is_still_detected(tmp_path: Path) -> None:
    manager = saved(tmp_path, range(1, 3), keep_last=5)
    for path in _shard_files(tmp_path / "step_000000000002"):
        data = bytearray(path.read_bytes())
        for offset in range(0, len(data), 997):  # damage spread over every region of every shard
            data[offset] ^= 0x01
        path.write_bytes(bytes(data))
    template = {"optim": {"count": torch.tensor(-5)}}  # needs one small item of one file
    found = manager.load_latest(template)
    assert found is not None and found[0] == 1 and torch.equal(template["optim"]["count"], torch.tensor(1))


def test_tensors_are_read_in_place_and_other_layouts_through_a_buffer(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.checkpoint.planner import LoadItemType

    from gpufleet.runtime.checkpoint import dcp_io

    manager = saved(tmp_path, range(1, 2))
    buffered: list[str] = []
    original = dcp_io.VerifiedReader._deserialize

    def counting(self: Any, data: Any, items: Any, planner: Any) -> None:
        buffered.extend("bytes" if i.type == LoadItemType.BYTE_IO else i.dest_index.fqn for i in items)
        original(self, data, items, planner)

    monkeypatch.setattr(dcp_io.VerifiedReader, "_deserialize", counting)
    template = expected_state(99)
    manager.load(1, template)
    assert same_state(template, expected_state(1))
    assert set(buffered) == {"bytes"}  # every tensor went straight into its destination
    buffered.clear()
    strided = expected_state(99)
    strided["model"]["w"] = torch.zeros(384, 384).t()  # not contiguous: the general path
    strided["optim"]["m"] = torch.zeros(256, 256)  # another dtype: DCP converts on copy
    manager.load(1, strided)
    assert torch.equal(strided["model"]["w"], expected_state(1)["model"]["w"])
    assert torch.equal(strided["optim"]["m"], expected_state(1)["optim"]["m"].float())
    assert {"model.w", "optim.m"} <= set(buffered)


def _snapshot(path: Path) -> dict[str, bytes]:
    """Every file at or under `path` with its bytes."""
    if path.is_file():
        return {".": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _set_aside(root: Path, step: int) -> list[Path]:
    return [p for p in root.iterdir() if p.name.startswith(f"{step_dirname(step)}.set-aside-")]


def _damaged_manifest_and_a_note(step_dir: Path) -> None:
    flip_bit(step_dir / "manifest.json", 60)
    (step_dir / "notes.txt").write_text("precious\n")


def _a_file_instead(step_dir: Path) -> None:
    shutil.rmtree(step_dir)
    step_dir.write_text("hi\n")


IN_THE_WAY = {"a damaged copy with a note in it": _damaged_manifest_and_a_note, "a file": _a_file_instead}


@pytest.mark.parametrize("what", sorted(IN_THE_WAY))
def test_restore_from_the_store_moves_what_is_in_the_way_aside_and_deletes_nothing(
        tmp_path: Path, what: str, caplog: pytest.LogCaptureFixture) -> None:
    local, store = tmp_path / "local", f"file://{tmp_path / 'store'}"
    manager = CheckpointManager(local, upload_to=store)
    for step in (1, 2):
        manager.save(expected_state(step), step, blocking=True)
    manager.wait_uploads(60)
    manager.close()
    shutil.rmtree(local / step_dirname(1))
    IN_THE_WAY[what](local / step_dirname(2))  # no local checkpoint loads: step 2 comes back from the store
    before = _snapshot(local / step_dirname(2))
    fresh = CheckpointManager(local, upload_to=store)
    found = fresh.load_latest()
    fresh.close()
    assert found is not None and found[0] == 2 and same_state(found[1], expected_state(2))
    assert verify_checkpoint(_local_fs(), str(local / step_dirname(2))).ok
    aside = _set_aside(local, 2)
    assert len(aside) == 1 and _snapshot(aside[0]) == before  # kept whole, under a name a person sees
    assert str(aside[0]) in caplog.text  # ...and the log says where
    assert not [p.name for p in local.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("what", ["a folder of someone's files", "a file"])
def test_a_save_moves_what_is_not_a_checkpoint_aside_and_replaces_an_earlier_save(
        tmp_path: Path, what: str, caplog: pytest.LogCaptureFixture) -> None:
    in_the_way = tmp_path / step_dirname(5)
    if what == "a file":
        in_the_way.write_text("hi\n")
    else:
        in_the_way.mkdir()
        (in_the_way / "notes.txt").write_text("precious\n")
    before = _snapshot(in_the_way)
    manager = CheckpointManager(tmp_path)
    manager.save(expected_state(5), 5, blocking=True)
    aside = _set_aside(tmp_path, 5)
    assert len(aside) == 1 and _snapshot(aside[0]) == before and str(aside[0]) in caplog.text
    manager.save(expected_state(6), 5, blocking=True)  # an earlier save of this very step is simply replaced
    assert len(_set_aside(tmp_path, 5)) == 1
    assert same_state(manager.load(5), expected_state(6))
    manager.close()


class _Crash(RuntimeError):
    """Stands for the process dying while the superseded copy is being deleted."""


def _crash_while_deleting_trash(monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.rmtree

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path).name.startswith(".trash-"):
            raise _Crash(f"killed while deleting {path}")
        real(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree)


def test_a_crash_while_deleting_a_superseded_save_keeps_the_new_one(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(expected_state(5), 5, blocking=True)
    with monkeypatch.context() as patch:
        _crash_while_deleting_trash(patch)
        with pytest.raises(CheckpointError):  # the "crash" is reported; what matters is what is on disk
            manager.save(expected_state(6), 5, blocking=True)  # the same step again: the old one is superseded
    manager.close()
    restarted = CheckpointManager(tmp_path)  # its start-up sweep deletes hidden .tmp- and .trash- folders
    assert verify_checkpoint(_local_fs(), str(tmp_path / step_dirname(5))).ok
    assert same_state(restarted.load(5), expected_state(6))
    restarted.close()


def test_a_crash_while_deleting_a_replaced_copy_keeps_the_new_copy(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufleet.runtime.checkpoint.store import TransferPolicy, install_checkpoint

    source, dest = tmp_path / "source", tmp_path / "dest"
    manager = CheckpointManager(source)
    manager.save(expected_state(5), 5, blocking=True)
    manager.close()
    shutil.copytree(source / step_dirname(5), dest / step_dirname(5))
    flip_bit(dest / step_dirname(5) / "__0_0.distcp", 4000)  # a damaged copy: repaired by the install below
    fs = _local_fs()
    with monkeypatch.context() as patch:
        _crash_while_deleting_trash(patch)
        with pytest.raises(_Crash):
            install_checkpoint(fs, str(source / step_dirname(5)), fs, str(dest / step_dirname(5)), TransferPolicy())
    assert verify_checkpoint(fs, str(dest / step_dirname(5))).ok


def test_an_os_error_installing_one_step_does_not_stop_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    source, dest = tmp_path / "source", tmp_path / "dest"
    saved(source, [100, 200], keep_last=10)
    real = os.rename

    def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if Path(dst).name == step_dirname(100):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dst))
        real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(SystemExit) as done:
        cli_run(["ckpt", "download", str(source), str(dest), "--json"])
    assert done.value.code == 1
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert [item["step"] for item in result["copied"]] == [200]  # the step after the failed one still went across
    assert [item["step"] for item in result["not_copied"]] == [100]
    reason = result["not_copied"][0]["reason"]
    assert str(dest / step_dirname(100)) in reason and "Permission denied" in reason, reason
    assert "Traceback" not in captured.err and captured.err.count("\n") == 1
    assert not (dest / step_dirname(100)).exists() and not [p.name for p in dest.iterdir() if p.name.startswith(".")]
