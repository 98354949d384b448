"""Real processes for the gpu-check steps: `python -m gpufleet ...` and torchrun, each in its own session so that a
step's timeout ends the whole process tree it started (torchrun and its workers), and nothing else."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class StepFailed(Exception):
    """A step's check did not hold; the message is the one-line reason the report shows."""


@dataclass(frozen=True)
class Done:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def last_line(self) -> str:
        """The last non-empty line of stderr (else stdout): what a failed command said."""
        for text in (self.stderr, self.stdout):
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            if lines:
                return lines[-1][:400]
        return f"exit code {self.returncode}, no output"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment children run in: this gpufleet importable first, one OpenMP thread, no user catalog."""
    env = dict(os.environ if base is None else base)
    src = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("GPUFLEET_CATALOG", None)
    return env


@dataclass
class Proc:
    """A started process whose stdout and stderr go to files `<name>.out` and `<name>.err` in its folder (a pipe
    nobody reads while it runs could fill and stall it; the files stay behind for a look)."""

    popen: subprocess.Popen[bytes]
    out_path: Path
    err_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def stop(self) -> None:
        """SIGKILL the process group it leads (its own session: torchrun's workers too)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()

    def done(self) -> Done:
        read = lambda path: path.read_text(encoding="utf-8", errors="replace")  # noqa: E731
        return Done(tuple(map(str, self.popen.args)), self.popen.wait(), read(self.out_path),  # type: ignore[arg-type]
                    read(self.err_path))


def start(args: Sequence[str], cwd: Path, env: Mapping[str, str], name: str) -> Proc:
    cwd.mkdir(parents=True, exist_ok=True)
    out_path, err_path = cwd / f"{name}.out", cwd / f"{name}.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        popen = subprocess.Popen(list(args), cwd=cwd, env=dict(env), stdout=out, stderr=err, start_new_session=True)
    return Proc(popen, out_path, err_path)


def finish(proc: Proc, timeout_s: float) -> Done:
    """Wait for `proc` up to `timeout_s`; past it, end its whole group and fail the step."""
    try:
        proc.popen.wait(timeout=max(timeout_s, 0.1))
    except subprocess.TimeoutExpired:
        proc.stop()
        raise StepFailed(f"timed out after {timeout_s:.0f} s: {' '.join(map(str, proc.popen.args))[:200]}"  # type: ignore[arg-type]
                         ) from None
    return proc.done()


def run(args: Sequence[str], cwd: Path, env: Mapping[str, str], timeout_s: float, name: str, *,
        check: bool = True) -> Done:
    done = finish(start(args, cwd, env, name), timeout_s)
    if check and done.returncode != 0:
        raise StepFailed(f"`{' '.join(args[2:5])} ...` exited {done.returncode}: {done.last_line()}")
    return done


def gpufleet(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpufleet", *args]


def torchrun(nproc: int, *args: str, max_restarts: int = 0) -> list[str]:
    """torchrun on loopback with an explicit c10d rendezvous on a free port (docs/burnin.md: not --standalone)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts",
            str(max_restarts), "--monitor-interval", "0.2", "-m", "gpufleet", *args]


def json_document(stdout: str) -> dict[str, Any]:
    """The JSON document a `--json` command printed (after any lines a launcher put before it)."""
    start_at = 0 if stdout.startswith("{") else stdout.find("\n{") + 1
    if stdout[start_at:start_at + 1] != "{":
        raise StepFailed(f"no JSON document in the output: {stdout.strip()[-200:]!r}")
    document, _ = json.JSONDecoder().raw_decode(stdout[start_at:])
    if not isinstance(document, dict):
        raise StepFailed("the JSON output is not an object")
    return document


def worker_pids(parent: int) -> dict[int, int]:
    """rank -> pid of the worker processes torchrun `parent` started (read from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            env = dict(item.split("=", 1) for item in (entry / "environ").read_text().split("\0") if "=" in item)
        except (OSError, IndexError, ValueError):
            continue
        if "RANK" in env:
            found[int(env["RANK"])] = int(entry.name)
    return found


def wait_until(condition: Callable[[], bool], proc: Proc, deadline: float, what: str) -> None:
    """Poll `condition()` every 10 ms until it holds; fail if `proc` ends first or the deadline passes."""
    while not condition():
        if proc.poll() is not None:
            raise StepFailed(f"the process ended (exit {proc.poll()}) before {what}: {proc.done().last_line()}")
        if time.monotonic() > deadline:
            proc.stop()
            raise StepFailed(f"timed out waiting for {what}")
        time.sleep(0.01)
