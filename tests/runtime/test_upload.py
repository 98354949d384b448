"""Upload to a real S3-compatible server (moto on 127.0.0.1): 5xx responses retried, the server
stopped mid-upload, a partial upload never listed complete, and resume from the store."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from _workers import expected_state, same_state  # noqa: E402

from conftest import S3  # noqa: E402
from gpufleet.runtime.checkpoint import (  # noqa: E402
    CheckpointManager,
    TransferPolicy,
    list_checkpoints,
    open_url,
    verify_checkpoint,
)

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]
FAST_RETRY = TransferPolicy(part_bytes=5 * 2**20, max_attempts=6, backoff_s=0.05, backoff_max_s=0.5)


def test_5xx_responses_are_retried_and_resume_from_store_works(s3: tuple[S3, str], tmp_path: Path) -> None:
    server, url = s3
    manager = CheckpointManager(tmp_path / "local", keep_last=2, upload_to=url,
                                storage_options=server.options(), transfer=FAST_RETRY)
    manager.save(expected_state(1), 1, blocking=True)
    manager.wait_uploads(60)
    server.proxy.faults.fail_writes = 3  # the next three PUT/POSTs answer 503
    manager.save(expected_state(2), 2, blocking=True)
    manager.wait_uploads(60)
    manager.close()
    assert server.proxy.faults.failed == 3
    fs, root = open_url(url, server.options(via_proxy=False))
    infos = list_checkpoints(fs, root)
    assert [(i.step, i.has_manifest) for i in infos] == [(1, True), (2, True)]
    for info in infos:
        assert verify_checkpoint(fs, info.path).ok
    shutil.rmtree(tmp_path / "local")  # the node is gone: only the store has the checkpoints
    fresh = CheckpointManager(tmp_path / "local", upload_to=url, storage_options=server.options(),
                              transfer=FAST_RETRY)
    found = fresh.load_latest()
    fresh.close()
    assert found is not None and found[0] == 2 and same_state(found[1], expected_state(2))
    assert fresh.steps() == [2]


def test_store_down_mid_upload_is_never_listed_complete_then_retried(s3: tuple[S3, str], tmp_path: Path) -> None:
    server, url = s3
    slow = TransferPolicy(part_bytes=5 * 2**20, max_attempts=8, backoff_s=0.3, backoff_max_s=1.0,
                          max_bytes_per_s=8 * 2**20)
    manager = CheckpointManager(tmp_path / "local", upload_to=url, storage_options=server.options(via_proxy=False),
                                transfer=slow)
    state = {"w": torch.randn(6 * 2**20 // 4 * 4)}  # 24 MiB: a multipart upload of ~3 s at the cap
    manager.save(state, 5, blocking=True)
    time.sleep(0.8)
    server.moto.stop()  # the real server goes away mid-upload
    fs, root = open_url(url, server.options(via_proxy=False))
    seen_while_down: list[bool] = []

    def restart_later() -> None:
        time.sleep(1.5)
        server.restart_moto()

    thread = threading.Thread(target=restart_later)
    thread.start()
    thread.join()
    seen_while_down = [i.has_manifest for i in list_checkpoints(fs, root)]
    assert seen_while_down in ([], [False])  # a partial upload is never complete
    manager.wait_uploads(120)
    manager.close()
    infos = list_checkpoints(fs, root)
    assert [(i.step, i.has_manifest) for i in infos] == [(5, True)]
    assert verify_checkpoint(fs, infos[0].path).ok


def test_cli_upload_and_download(s3: tuple[S3, str], tmp_path: Path) -> None:
    import subprocess
    import sys

    server, url = s3
    manager = CheckpointManager(tmp_path / "a")
    manager.save(expected_state(3), 3, blocking=True)
    code = (
        "import sys, gpufleet.runtime.checkpoint.store as st\n"
        f"opts = {server.options(via_proxy=False)!r}\n"
        "real = st.open_url\n"
        "st.open_url = lambda u, o=None: real(u, opts if u.startswith('s3://') else o)\n"
        "from gpufleet.cli.main import run; run(sys.argv[1:])\n"
    )
    for args in (["upload", str(tmp_path / "a"), url], ["download", url, str(tmp_path / "b")],
                 ["verify", url], ["verify", str(tmp_path / "b")]):
        proc = subprocess.run([sys.executable, "-c", code, "ckpt", *args], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
    found = CheckpointManager(tmp_path / "b").load_latest()
    assert found is not None and same_state(found[1], expected_state(3))
