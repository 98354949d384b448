"""What the uploader calls a refusal, and what `close()` says about it: a refused step never reached the store, so
`close()` names it; and an object the store acknowledged but then does not hold is no refusal, it is sent again.

Found by tests/runtime/test_store_forgets.py on a busy machine (2026-12-06): the store restarted empty between the
PUT of a file and the size check after it; the check's FileNotFoundError was taken as a refusal (never retried)
and `close()` returned as if every step had landed."""

from __future__ import annotations

from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from gpufleet.runtime.checkpoint.errors import CheckpointError
from gpufleet.runtime.checkpoint.store import TransferPolicy, _Throttle, copy_file, with_retries
from gpufleet.runtime.checkpoint.uploads import Uploader


def test_close_names_a_refused_step() -> None:
    def upload(step: int) -> bool:
        if step == 3:
            raise PermissionError("the store holds a different checkpoint of step 3")
        return True

    uploader = Uploader(upload, retry_after_s=0.01, retry_max_s=0.02)
    uploader.submit(2)
    uploader.submit(3)
    with pytest.raises(CheckpointError, match=r"steps 3;.*different checkpoint of step 3"):
        uploader.close(timeout_s=10)
    assert uploader.uploaded == {2}


def test_a_refused_step_that_lands_later_is_not_named() -> None:
    tries: list[int] = []

    def upload(step: int) -> bool:
        tries.append(step)
        if len(tries) == 1:
            raise PermissionError("not yet")
        return True

    uploader = Uploader(upload, retry_after_s=0.01, retry_max_s=0.02)
    uploader.submit(5)
    with pytest.raises(CheckpointError, match="not yet"):
        uploader.wait(10)  # reported once, as before
    uploader.submit(5)  # the user saves it again
    uploader.close(timeout_s=10)  # and it landed: nothing left to name
    assert uploader.uploaded == {5} and tries == [5, 5]


class _ForgetsOnce(MemoryFileSystem):
    """A store that acknowledges the first write of each file and then, once, does not hold it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.forgotten: set[str] = set()

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        if path not in self.forgotten:
            self.forgotten.add(path)
            self.rm(path)
            raise FileNotFoundError(path)
        return super().info(path, **kwargs)


def test_an_object_the_store_acknowledged_and_lost_is_sent_again() -> None:
    src = fsspec.filesystem("memory")
    src.pipe("/src/shard.bin", b"x" * 1000)
    dst = _ForgetsOnce(skip_instance_cache=True)
    policy = TransferPolicy(max_attempts=3, backoff_s=0.0, backoff_max_s=0.0)
    with pytest.raises(OSError) as lost:  # one try: an OSError worth retrying, not FileNotFoundError (a refusal)
        copy_file(src, "/src/shard.bin", dst, "/dst/a.bin", 1000, policy, _Throttle(None))
    assert type(lost.value) is OSError and "does not hold them" in str(lost.value)
    sent = with_retries(lambda: copy_file(src, "/src/shard.bin", dst, "/dst/b.bin", 1000, policy, _Throttle(None)),
                        "copy", policy)
    assert isinstance(sent, str) and dst.info("/dst/b.bin")["size"] == 1000


def test_a_copy_cut_off_by_retention_is_not_named() -> None:
    # retention deletes step 1 locally while its copy runs: the copy then finds a half-deleted checkpoint (a
    # verification failure, which is a refusal) but the step is superseded, not owed to the store
    running: list[Uploader] = []

    def upload(step: int) -> bool:
        running[0].forget(step)  # retention's deletion lands while this copy runs
        raise CheckpointError(f"checkpoint step {step} failed verification: manifest.json: missing")

    uploader = Uploader(upload, retry_after_s=0.01, retry_max_s=0.02)
    running.append(uploader)
    uploader.submit(1)
    with pytest.raises(CheckpointError, match="failed verification"):
        uploader.wait(10)  # the error is still reported once
    uploader.close(timeout_s=10)  # but close owes the store nothing
