"""Store faults without a server: CheckpointManager and `gpufleet ckpt` against an in-memory object store that fails
on purpose (faultstore.FaultyStore: a real fsspec file system, handed in as `upload_to=StoreRoot(fs, root)` or opened
from a `faultmem://` URL).

The guarantees are those the tests against a real S3-compatible server assert (test_upload.py, test_upload_retry.py,
test_store_forgets.py, which stay as they are): a refused write is retried with growing backoff; a store that does
not answer is StoreUnreachableError (exit 3 from the command line), the step stays pending and is uploaded once the
store answers; a store that loses what it acknowledged never gets a manifest over missing files; damage in the store
is never loaded; nothing is lost locally.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import fsspec  # noqa: E402
from _workers import expected_state, same_state  # noqa: E402
from faultstore import EVERY_OPERATION, PROTOCOL, Faults, FaultyStore  # noqa: E402

from gpufleet.cli.main import run as cli_run  # noqa: E402
from gpufleet.runtime.checkpoint import (  # noqa: E402
    MANIFEST_NAME,
    CheckpointError,
    CheckpointManager,
    StoreRoot,
    StoreUnreachableError,
    TransferPolicy,
    install_checkpoint,
    list_checkpoints,
    verify_checkpoint,
)
from gpufleet.runtime.checkpoint.local_root import local_fs  # noqa: E402
from gpufleet.runtime.checkpoint.names import step_dirname  # noqa: E402
from gpufleet.runtime.checkpoint.store import PROOF_ROUNDS  # noqa: E402

pytestmark = pytest.mark.timeout(120)
ROOT = "/bucket/run"
"""Where the tests' checkpoints live in the store: what `faultmem://bucket/run` opens to."""
QUICK = TransferPolicy(part_bytes=5 * 2**20, max_attempts=3, backoff_s=0.01, backoff_max_s=0.02,
                       retry_after_s=0.05, retry_max_s=0.1)


@pytest.fixture
def store() -> FaultyStore:
    return FaultyStore(skip_instance_cache=True)


@pytest.fixture
def url_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultyStore]:
    """A FaultyStore that `faultmem://…` URLs open to, in this test only."""
    from fsspec.registry import _registry

    monkeypatch.setitem(_registry, PROTOCOL, FaultyStore)
    FaultyStore.clear_instance_cache()
    opened = FaultyStore()
    assert fsspec.filesystem(PROTOCOL) is opened  # fsspec's instance cache: the one a URL opens
    yield opened
    FaultyStore.clear_instance_cache()


def manager(store: FaultyStore, local: Path, **kwargs: Any) -> CheckpointManager:
    return CheckpointManager(local, upload_to=StoreRoot(store, ROOT), **{"transfer": QUICK, **kwargs})


def saved_locally(local: Path, steps: list[int]) -> Path:
    ckpt = CheckpointManager(local, keep_last=10)
    for step in steps:
        ckpt.save(expected_state(step), step, blocking=True)
    ckpt.close()
    return local


def whole_in_store(store: FaultyStore) -> tuple[list[int], list[int]]:
    """(steps the store lists complete, those of them that verify in full)."""
    listed = [info for info in list_checkpoints(store, ROOT) if info.has_manifest]
    return [i.step for i in listed], [i.step for i in listed if verify_checkpoint(store, i.path).ok]


def loaded_from_store(store: FaultyStore, where: Path) -> tuple[int, dict[str, Any]] | None:
    """What a fresh node with an empty disk resumes from."""
    fresh = manager(store, where)
    try:
        return fresh.load_latest()
    finally:
        fresh.close()


# -- retries ---------------------------------------------------------------------------------------------------


def test_writes_the_store_refuses_are_retried_with_growing_backoff(store: FaultyStore, tmp_path: Path) -> None:
    policy = TransferPolicy(part_bytes=5 * 2**20, max_attempts=6, backoff_s=0.05, backoff_max_s=0.4)
    store.faults.failing_writes = 3  # the next three writes are reset
    ckpt = manager(store, tmp_path / "local", transfer=policy)
    ckpt.save(expected_state(1), 1, blocking=True)
    ckpt.wait_uploads(60)
    ckpt.close()
    assert whole_in_store(store) == ([1], [1]) and ckpt.failed_uploads == [] and ckpt.uploaded_steps == {1}
    first = store.writes[0].path
    attempts = [write for write in store.writes if write.path == first]
    assert [write.completed for write in attempts] == [False, False, False, True]
    gaps_s = [later.started_s - earlier.started_s for earlier, later in pairwise(attempts)]
    for n, gap_s in enumerate(gaps_s, start=1):  # equal jitter: at least half of backoff_s * 2**(n-1)
        assert gap_s >= 0.5 * min(policy.backoff_s * 2 ** (n - 1), policy.backoff_max_s), gaps_s


@pytest.mark.parametrize("fault", ["every request times out", "object writes time out", "every write is reset"])
def test_a_copy_to_a_store_that_does_not_answer_is_store_unreachable_after_its_deadline(
        store: FaultyStore, tmp_path: Path, fault: str) -> None:
    local = saved_locally(tmp_path / "local", [1])
    store.faults = {"every request times out": Faults(silent=EVERY_OPERATION),
                    "object writes time out": Faults(silent=frozenset({"open"})),
                    "every write is reset": Faults(failing_writes=10**6)}[fault]
    policy = TransferPolicy(max_attempts=None, deadline_s=0.3, backoff_s=0.02, backoff_max_s=0.05)
    with pytest.raises(StoreUnreachableError) as given_up:
        install_checkpoint(local_fs(), str(local / step_dirname(1)), store, f"{ROOT}/{step_dirname(1)}", policy)
    found = re.search(r"after (\d+) attempt\(s\) over (\d+) s", str(given_up.value))
    assert found and int(found.group(1)) >= 3, given_up.value  # retried within the deadline, then given up
    assert store.objects() == []  # nothing half-written is left that could pass for a checkpoint


def test_a_store_that_does_not_answer_keeps_the_step_pending_until_it_does(store: FaultyStore,
                                                                           tmp_path: Path) -> None:
    store.faults.silent = EVERY_OPERATION
    ckpt = manager(store, tmp_path / "local")
    ckpt.save(expected_state(1), 1, blocking=True)
    with pytest.raises(CheckpointError, match=r"upload of step 1: .*after 3 attempt\(s\).*did not answer"):
        ckpt.wait_uploads(60)
    assert ckpt.failed_uploads == [1] and store.objects() == []
    assert same_state(ckpt.load(1), expected_state(1))  # nothing lost locally
    store.faults.silent = frozenset()  # the store answers again
    ckpt.close(upload_timeout_s=30)  # close() retries the pending step, with backoff, until it lands
    assert whole_in_store(store) == ([1], [1]) and ckpt.uploaded_steps == {1}
    found = loaded_from_store(store, tmp_path / "elsewhere")
    assert found is not None and found[0] == 1 and same_state(found[1], expected_state(1))


# -- a store that forgets ----------------------------------------------------------------------------------------


def test_a_store_restarted_empty_before_the_proof_listing_gets_every_file_again(store: FaultyStore,
                                                                                tmp_path: Path) -> None:
    store.faults.restarts_before_listing = 1
    ckpt = manager(store, tmp_path / "local")
    ckpt.save(expected_state(7), 7, blocking=True)
    ckpt.wait_uploads(60)
    ckpt.close()
    assert store.restarts == 1  # the store did lose the files it had acknowledged
    assert whole_in_store(store) == ([7], [7])
    sent = Counter(write.path.rsplit("/", 1)[-1] for write in store.writes if write.completed)
    assert sent.pop(MANIFEST_NAME) == 1 and sent and set(sent.values()) == {2}, sent  # data sent again, then manifest
    found = loaded_from_store(store, tmp_path / "elsewhere")
    assert found is not None and found[0] == 7 and same_state(found[1], expected_state(7))


def test_a_store_that_never_keeps_what_it_acknowledged_gets_no_manifest(store: FaultyStore, tmp_path: Path) -> None:
    store.faults.restarts_before_listing = 10**6
    local = tmp_path / "local"
    ckpt = manager(store, local)
    ckpt.save(expected_state(1), 1, blocking=True)
    with pytest.raises(CheckpointError, match="does not keep what it acknowledged"):
        ckpt.wait_uploads(60)
    assert store.restarts == PROOF_ROUNDS + 1  # every proof listing found the files gone
    assert whole_in_store(store) == ([], []) and ckpt.failed_uploads == [1]
    assert not [name for name in store.objects() if name.endswith(MANIFEST_NAME)]
    with pytest.raises(CheckpointError, match=r"steps 1;.*intact on local disk"):
        ckpt.close(upload_timeout_s=0.3)
    assert same_state(CheckpointManager(local).load(1), expected_state(1))  # nothing lost locally


# -- restoring from the store --------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["a flipped bit", "a lost object"])
def test_damage_in_the_store_is_never_loaded(store: FaultyStore, tmp_path: Path, damage: str,
                                             caplog: pytest.LogCaptureFixture) -> None:
    ckpt = manager(store, tmp_path / "local", keep_last=5)
    for step in (1, 2):
        ckpt.save(expected_state(step), step, blocking=True)
    ckpt.wait_uploads(60)
    ckpt.close()
    shard = f"{ROOT}/{step_dirname(2)}/__0_0.distcp"
    store.damage(shard, flip_byte_at=4000 if damage == "a flipped bit" else None)
    elsewhere = tmp_path / "elsewhere"
    found = loaded_from_store(store, elsewhere)
    assert found is not None and found[0] == 1 and same_state(found[1], expected_state(1))  # the older, whole one
    assert f"{ROOT}/{step_dirname(2)}" in caplog.text  # the skipped step is named
    assert sorted(path.name for path in elsewhere.iterdir()) == [step_dirname(1)]  # nothing half-downloaded left


@pytest.mark.parametrize("silent", [EVERY_OPERATION, frozenset({"open"})], ids=["nothing answers", "reads time out"])
def test_a_store_that_does_not_answer_a_restore_is_unreachable_never_empty(store: FaultyStore, tmp_path: Path,
                                                                           silent: frozenset[str]) -> None:
    ckpt = manager(store, tmp_path / "local")
    ckpt.save(expected_state(1), 1, blocking=True)
    ckpt.wait_uploads(60)
    ckpt.close()
    store.faults.silent = silent
    elsewhere = tmp_path / "elsewhere"
    fresh = manager(store, elsewhere)
    with pytest.raises(StoreUnreachableError):  # never None: the job must not start from scratch
        fresh.load_latest()
    assert list(elsewhere.iterdir()) == []  # no half-downloaded copy left behind
    store.faults.silent = frozenset()
    found = fresh.load_latest()  # the same manager, once the store answers
    fresh.close()
    assert found is not None and found[0] == 1 and same_state(found[1], expected_state(1))


# -- a store opened from its URL, and the command line ---------------------------------------------------------------


def test_a_store_is_opened_from_its_url_or_given_and_not_both(url_store: FaultyStore, tmp_path: Path) -> None:
    ckpt = CheckpointManager(tmp_path / "a", upload_to=f"{PROTOCOL}://bucket/run", transfer=QUICK)
    ckpt.save(expected_state(1), 1, blocking=True)
    ckpt.wait_uploads(60)
    ckpt.close()
    assert whole_in_store(url_store) == ([1], [1])
    with pytest.raises(CheckpointError, match="storage_options"):
        CheckpointManager(tmp_path / "b", upload_to=StoreRoot(url_store, ROOT), storage_options={"anon": True})
    assert not (tmp_path / "b").exists()


def ckpt_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`gpufleet ckpt ARGS` in this process (so that it opens the test's store): exit code, stdout, stderr."""
    with pytest.raises(SystemExit) as done:
        cli_run(["ckpt", *args])
    captured = capsys.readouterr()
    return int(done.value.code or 0), captured.out, captured.err


def unreachable_line(code: int, err: str) -> str:
    assert code == 3, (code, err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("error: store unreachable (gave up after --deadline 0.5 s)"), err
    return err


def test_ckpt_upload_and_download_exit_3_when_the_store_does_not_answer(
        url_store: FaultyStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    local = saved_locally(tmp_path / "local", [1, 2])
    url, back = f"{PROTOCOL}://bucket/run", tmp_path / "back"
    url_store.faults = Faults(silent=EVERY_OPERATION)
    for args in (["upload", str(local), url], ["download", url, str(back)]):
        line = unreachable_line(*ckpt_cli(capsys, *args, "--deadline", "0.5")[::2])
        attempts = re.search(r"after (\d+) attempt\(s\)", line)
        assert attempts and int(attempts.group(1)) >= 2 and "did not answer" in line, line
    url_store.faults = Faults(failing_writes=10**6)  # it answers reads, and resets every write: fails mid-copy
    line = unreachable_line(*ckpt_cli(capsys, "upload", str(local), url, "--deadline", "0.5", "--json")[::2])
    assert "steps copied before: none" in line and "connection reset" in line, line
    assert url_store.objects() == [] and not back.exists()
    url_store.faults = Faults()  # the store answers: the same command completes
    code, out, err = ckpt_cli(capsys, "upload", str(local), url, "--json")
    assert code == 0, err
    assert [item["step"] for item in json.loads(out)["copied"]] == [1, 2]
    code, out, err = ckpt_cli(capsys, "verify", url, "--json")
    assert code == 0 and [(c["step"], c["ok"]) for c in json.loads(out)["checkpoints"]] == [(1, True), (2, True)]
