"""Fixtures for the checkpoint runtime: a real S3-compatible server (moto) on 127.0.0.1 and a proxy
in front of it that injects 5xx responses or refuses connections on demand."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from _net import free_port

try:
    import torch  # noqa: F401
except ImportError:  # the model half's tests run without the runtime extra
    collect_ignore_glob = ["test_*.py"]

BUCKET = "ckpt"
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


@dataclass
class Faults:
    """What the proxy does to the next requests: fail `fail_writes` PUT/POSTs with `status`."""

    fail_writes: int = 0
    status: int = 503
    seen_writes: int = 0
    failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def should_fail(self, method: str) -> bool:
        with self.lock:
            if method in ("PUT", "POST"):
                self.seen_writes += 1
                if self.fail_writes > 0:
                    self.fail_writes -= 1
                    self.failed += 1
                    return True
            return False


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 that forwards to moto and injects faults."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.faults = Faults()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = b""
                    while True:
                        size = int(self.rfile.readline().strip().split(b";")[0], 16)
                        if size == 0:
                            while self.rfile.readline().strip():
                                pass
                            return data
                        data += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))

            def _handle(self) -> None:
                body = self._body()
                if proxy.faults.should_fail(self.command):
                    payload = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>ServiceUnavailable"
                               b"</Code><Message>injected</Message></Error>")
                    self.send_response(proxy.faults.status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                finally:
                    conn.close()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in HOP_HEADERS and key.lower() != "content-length":
                        self.send_header(key, value)
                length = response.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@dataclass
class S3:
    """The running server: `moto` itself, the `proxy` in front, and fsspec options for either."""

    moto: Any
    moto_port: int
    proxy: FaultProxy

    def options(self, via_proxy: bool = True) -> dict[str, Any]:
        port = self.proxy.port if via_proxy else self.moto_port
        return {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"},
            "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1, "read_timeout": 10,
                              "request_checksum_calculation": "when_required"},
            "skip_instance_cache": True,
        }

    def restart_moto(self) -> None:
        from moto.server import ThreadedMotoServer

        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=self.moto_port, verbose=False)
        self.moto.start()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3]:
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    proxy = FaultProxy(port)
    proxy.start()
    boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    s3 = S3(server, port, proxy)
    yield s3
    proxy.stop()
    s3.moto.stop()


@pytest.fixture
def s3(s3_server: S3, request: pytest.FixtureRequest) -> Iterator[tuple[S3, str]]:
    """The server with a fresh prefix for this test and its faults reset; yields (server, url)."""
    s3_server.proxy.faults = Faults()
    yield s3_server, f"s3://{BUCKET}/{request.node.name}"
    s3_server.proxy.faults = Faults()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "stress: long fault-injection runs; selected only by `-m stress`")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "stress" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="stress test: run with `pytest -m stress`")
    for item in items:
        if "stress" in item.keywords:
            item.add_marker(skip)
