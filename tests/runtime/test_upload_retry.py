"""Uploads that fail are retried (a real S3-compatible server, moto on 127.0.0.1, behind a proxy that answers 503
or a port nobody listens on), and `ckpt upload/download` give up on an unreachable store after --deadline with one
exit code, 3, wherever the failure hits.

Before the fix, a background upload that failed during an outage was reported once and never tried again (the
store lacked that step until a newer save uploaded), and `ckpt upload` exited 1 or 2 depending on where the
failure hit, after 50-110 s; `ckpt upload ROOT memory://x/y` exited 0 into a store that vanished with the process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from _net import free_port  # noqa: E402
from _workers import expected_state, same_state  # noqa: E402

from conftest import S3  # noqa: E402
from gpufleet.runtime.checkpoint import (  # noqa: E402
    CheckpointError,
    CheckpointManager,
    TransferPolicy,
    list_checkpoints,
    open_url,
    verify_checkpoint,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]
OUTAGE = 10**6  # PUT/POSTs answered 503: the store is down for writes until the test says otherwise
QUICK = TransferPolicy(part_bytes=5 * 2**20, max_attempts=1, backoff_s=0.05, backoff_max_s=0.1,
                       retry_after_s=0.2, retry_max_s=0.4)


def in_store(server: S3, url: str) -> list[int]:
    """The steps the store holds whole (manifest present, every byte verified)."""
    fs, root = open_url(url, server.options(via_proxy=False))
    return [info.step for info in list_checkpoints(fs, root)
            if info.has_manifest and verify_checkpoint(fs, info.path).ok]


def manager(server: S3, url: str, root: Path, **kwargs: Any) -> CheckpointManager:
    return CheckpointManager(root, upload_to=url, storage_options=server.options(), transfer=QUICK, **kwargs)


def test_a_failed_upload_is_retried_by_a_later_save(s3: tuple[S3, str], tmp_path: Path) -> None:
    server, url = s3
    ckpt = manager(server, url, tmp_path / "local", keep_last=5)
    server.proxy.faults.fail_writes = OUTAGE
    ckpt.save(expected_state(1), 1, blocking=True)
    with pytest.raises(CheckpointError, match="upload of step 1"):
        ckpt.wait_uploads(60)
    assert ckpt.failed_uploads == [1] and in_store(server, url) == []
    server.proxy.faults.fail_writes = 0  # the outage ends
    time.sleep(QUICK.retry_max_s)  # past the step's backoff
    ckpt.save(expected_state(2), 2, blocking=True)
    ckpt.wait_uploads(60)
    assert in_store(server, url) == [1, 2] and ckpt.failed_uploads == [] and ckpt.uploaded_steps == {1, 2}
    ckpt.close()


def test_close_retries_a_failed_upload_until_it_lands(s3: tuple[S3, str], tmp_path: Path) -> None:
    server, url = s3
    ckpt = manager(server, url, tmp_path / "local")
    server.proxy.faults.fail_writes = OUTAGE
    ckpt.save(expected_state(3), 3, blocking=True)
    with pytest.raises(CheckpointError):
        ckpt.wait_uploads(60)

    def outage_ends() -> None:
        time.sleep(1.0)
        server.proxy.faults.fail_writes = 0

    ender = threading.Thread(target=outage_ends)
    ender.start()
    ckpt.close(upload_timeout_s=120)  # the last save of a job: close() keeps trying, with backoff
    ender.join()
    assert in_store(server, url) == [3]
    found = CheckpointManager(tmp_path / "elsewhere", upload_to=url, storage_options=server.options()).load_latest()
    assert found is not None and found[0] == 3 and same_state(found[1], expected_state(3))


def test_retention_supersedes_a_failed_upload_and_close_gives_up_naming_what_is_left(s3: tuple[S3, str],
                                                                                      tmp_path: Path) -> None:
    server, url = s3
    ckpt = manager(server, url, tmp_path / "local", keep_last=1)
    server.proxy.faults.fail_writes = OUTAGE
    ckpt.save(expected_state(1), 1, blocking=True)
    ckpt.save(expected_state(2), 2, blocking=True)  # retention deletes step 1 locally: its upload is superseded
    with pytest.raises(CheckpointError):
        ckpt.wait_uploads(60)
    assert ckpt.failed_uploads == [2]
    with pytest.raises(CheckpointError, match=r"steps 2;.*intact on local disk") as given_up:
        ckpt.close(upload_timeout_s=1.0)
    assert "step 1" not in str(given_up.value) and in_store(server, url) == []
    assert ckpt.steps() == [2]


# -- the command line ----------------------------------------------------------------------------------------


def entry(options: dict[str, Any]) -> str:
    """`gpufleet`, with s3:// URLs sent where `options` say (as a user's AWS config would)."""
    return ("import sys, gpufleet.runtime.checkpoint.store as st\n"
            f"opts = {options!r}\n"
            "real = st.open_url\n"
            "st.open_url = lambda u, o=None: real(u, opts if u.startswith('s3://') else o)\n"
            "from gpufleet.cli.main import run\n"
            "run(sys.argv[1:])\n")


def ckpt_cli(entry_code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", entry_code, "ckpt", *args], capture_output=True, text=True,
                          timeout=240)


def unreachable_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: store unreachable (gave up after --deadline 2 s)"), proc.stderr
    return proc.stderr


def test_an_unreachable_store_exits_3_wherever_the_failure_hits(s3: tuple[S3, str], tmp_path: Path) -> None:
    server, url = s3
    local = tmp_path / "local"
    saved = CheckpointManager(local, keep_last=5)
    for step in (1, 2):
        saved.save(expected_state(step), step, blocking=True)
    saved.close()
    nobody = dict(server.options(), client_kwargs={"endpoint_url": f"http://127.0.0.1:{free_port()}",
                                                   "region_name": "us-east-1"})
    refused = entry(nobody)  # nothing listens: every connection is refused, from the first request on
    for args in (["upload", str(local), url], ["download", url, str(tmp_path / "back")]):
        line = unreachable_line(ckpt_cli(refused, *args, "--deadline", "2"))
        attempts = int(re.search(r"after (\d+) attempt\(s\)", line).group(1))  # type: ignore[union-attr]
        assert "Could not connect" in line and attempts >= 2, line  # retried until the deadline, then gave up
    server.proxy.faults.fail_writes = OUTAGE  # reads work, every write answers 503: fails mid-copy instead
    proc = ckpt_cli(entry(server.options()), "upload", str(local), url, "--deadline", "2", "--json")
    line = unreachable_line(proc)
    assert "steps copied before: none" in line and "injected" in line, line  # the 503s the proxy sent
    assert server.proxy.faults.failed > 2  # retried within the deadline, not given up at the first answer
    server.proxy.faults.fail_writes = 0
    proc = ckpt_cli(entry(server.options()), "upload", str(local), url, "--json")
    assert proc.returncode == 0, proc.stderr  # the same command, once the store answers, completes
    assert [item["step"] for item in json.loads(proc.stdout)["copied"]] == [1, 2]


def test_an_in_memory_destination_and_a_meaningless_deadline_are_refused(tmp_path: Path) -> None:
    saved = CheckpointManager(tmp_path / "local")
    saved.save(expected_state(1), 1, blocking=True)
    saved.close()
    plain = "import sys\nfrom gpufleet.cli.main import run\nrun(sys.argv[1:])\n"
    for args, words in ((["upload", str(tmp_path / "local"), "memory://x/y"], "in-memory store"),
                        (["download", "memory://x/y", str(tmp_path / "back")], "in-memory store"),
                        (["upload", str(tmp_path / "local"), str(tmp_path / "d"), "--deadline", "0"], "--deadline")):
        proc = ckpt_cli(plain, *args)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "back").exists() and not (tmp_path / "d").exists()
