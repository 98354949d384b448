"""A store that forgets what it acknowledged, and the leftovers of uploads that were cut off (a real S3-compatible
server, moto on 127.0.0.1).

Before the fix: with the server killed mid-upload and restarted without its data, the uploader retried only the
file that failed and then wrote the manifest, so the step was listed complete with files missing and `close()`
reported success; a prefix cut off for a step that local retention then deleted stayed in the store forever, and
`ckpt verify s3://…` exited 1 although every complete step verified, calling it a save that "never committed".
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from _workers import expected_state, same_state  # noqa: E402

from conftest import BUCKET, S3  # noqa: E402
from gpufleet.runtime.checkpoint import (  # noqa: E402
    CheckpointError,
    CheckpointManager,
    TransferPolicy,
    list_checkpoints,
    open_url,
    verify_checkpoint,
)
from gpufleet.runtime.checkpoint.names import step_dirname  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]
SLOW = 150 * 1024  # bytes per second: one step (~0.9 MB) takes several seconds to upload


def objects(server: S3, url: str, step: int) -> list[str]:
    """The object names the store holds under `step`'s prefix, read straight from the server."""
    fs, root = open_url(url, server.options(via_proxy=False))
    fs.invalidate_cache()
    try:
        return sorted(name.rsplit("/", 1)[-1] for name in fs.ls(f"{root}/{step_dirname(step)}"))
    except FileNotFoundError:
        return []


def wait_for_first_object(server: S3, url: str, step: int, timeout_s: float = 60) -> list[str]:
    """Poll until some object of `step` has landed while its manifest has not; returns what is there."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        held = objects(server, url, step)
        assert "manifest.json" not in held, f"the upload finished before the test could cut it: {held}"
        if held:
            return held
        time.sleep(0.02)
    raise AssertionError(f"no object of step {step} reached the store in {timeout_s} s")


def stored_keys(prefix_part: str) -> list[str]:
    """The keys the (stopped) server's bucket holds whose name contains `prefix_part`, read from its own state."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    return sorted(k for k in s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets[BUCKET].keys if prefix_part in k)


def kill_moto(server: S3, *, forget: bool) -> list[str]:
    """Stop the server; with `forget`, it comes back without the objects it held (the bucket itself is re-created
    before it answers again), as a store restored from an old snapshot would. Returns the keys the store held once
    stopped (no write can land after that): what it forgot."""
    server.moto.stop()
    held = stored_keys("")
    if forget:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.moto_api._internal.models import moto_api_backend
        from moto.s3.models import s3_backends

        moto_api_backend.reset()
        s3_backends[DEFAULT_ACCOUNT_ID]["aws"].create_bucket(BUCKET, "us-east-1")
    return held


def store_steps(server: S3, url: str) -> tuple[list[int], list[int]]:
    """(steps listed complete, steps of those that verify in full)."""
    fs, root = open_url(url, server.options(via_proxy=False))
    listed = [info for info in list_checkpoints(fs, root) if info.has_manifest]
    return [i.step for i in listed], [i.step for i in listed if verify_checkpoint(fs, i.path).ok]


def test_a_store_restarted_empty_mid_upload_never_lists_a_partial_step_complete(s3: tuple[S3, str],
                                                                               tmp_path: Path) -> None:
    server, url = s3
    policy = TransferPolicy(part_bytes=5 * 2**20, max_attempts=20, backoff_s=0.2, backoff_max_s=0.5,
                            max_bytes_per_s=SLOW, retry_after_s=0.2, retry_max_s=0.5)
    manager = CheckpointManager(tmp_path / "local", upload_to=url, storage_options=server.options(via_proxy=False),
                                transfer=policy)
    manager.save(expected_state(7), 7, blocking=True)
    acknowledged = wait_for_first_object(server, url, 7)
    forgotten = kill_moto(server, forget=True)
    if any(key.endswith(f"{step_dirname(7)}/manifest.json") for key in forgotten):
        # the last small files landed between the poll and the stop (a busy machine): the step was complete and
        # acknowledged before the store lost it, which no uploader can see; the case this test is about did not
        # happen, so there is nothing to judge
        pytest.skip("the upload completed before the server stopped; the cut came too late on this machine")
    # what the store had acknowledged is gone: read from the stopped server's own state, since once it answers
    # again the uploader may already be sending files anew (that is the behaviour under test, not a failure)
    assert acknowledged and not stored_keys(step_dirname(7))
    time.sleep(0.5)  # the uploader meets a refused connection meanwhile
    server.restart_moto()
    try:
        manager.close(upload_timeout_s=120)
        closed_ok = True
    except CheckpointError:
        closed_ok = False
    complete, verified = store_steps(server, url)
    assert complete == verified, f"listed complete but not whole: {sorted(set(complete) - set(verified))}"
    assert closed_ok == (7 in verified), "close() reported success for a step the store does not hold whole"
    assert closed_ok and acknowledged, (closed_ok, acknowledged)  # the lost files were sent again
    elsewhere = CheckpointManager(tmp_path / "elsewhere", upload_to=url, storage_options=server.options())
    found = elsewhere.load_latest()
    assert found is not None and found[0] == 7 and same_state(found[1], expected_state(7))


def cli_entry(options: dict[str, Any]) -> str:
    """`gpufleet`, with s3:// URLs sent where `options` say (as a user's AWS config would)."""
    return ("import sys, gpufleet.runtime.checkpoint.store as st\n"
            f"opts = {options!r}\n"
            "real = st.open_url\n"
            "st.open_url = lambda u, o=None: real(u, opts if u.startswith('s3://') else o)\n"
            "from gpufleet.cli.main import run\n"
            "run(sys.argv[1:])\n")


def test_leftovers_are_reported_as_leftovers_then_removed_by_remote_retention(
        s3: tuple[S3, str], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server, url = s3
    caplog.set_level(logging.INFO, logger="gpufleet")
    policy = TransferPolicy(part_bytes=5 * 2**20, max_attempts=2, backoff_s=0.05, backoff_max_s=0.1,
                            max_bytes_per_s=SLOW, retry_after_s=0.2, retry_max_s=0.4)
    manager = CheckpointManager(tmp_path / "local", keep_last=1, upload_to=url,
                                storage_options=server.options(via_proxy=False), transfer=policy)
    manager.save(expected_state(1), 1, blocking=True)
    manager.wait_uploads(120)
    manager.save(expected_state(2), 2, blocking=True)
    cut_off = wait_for_first_object(server, url, 2)
    kill_moto(server, forget=False)  # the upload of step 2 fails after its first object landed
    with pytest.raises(CheckpointError, match="upload of step 2"):
        manager.wait_uploads(120)
    server.restart_moto()
    assert objects(server, url, 2) == cut_off and "manifest.json" not in cut_off

    verified = subprocess.run([sys.executable, "-c", cli_entry(server.options(via_proxy=False)), "ckpt", "verify",
                               url, "--json"], capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads(verified.stdout)
    assert [(c["step"], c["ok"]) for c in report["checkpoints"]] == [(1, True)]
    assert [item["step"] for item in report["leftovers"]] == [2]

    manager.save(expected_state(3), 3, blocking=True)  # retention deletes step 2 locally: its upload is superseded
    manager.close(upload_timeout_s=120)
    assert store_steps(server, url) == ([1, 3], [1, 3])
    assert objects(server, url, 2) == []  # the leftover is gone
    assert "never committed" not in caplog.text
    assert f"removed {url.removeprefix('s3://')}/{step_dirname(2)} from the store" in caplog.text, caplog.text
