"""A real Slurm on 127.0.0.1 for the tests: munged, slurmctld and one `slurmd -N hostK` per host.

Debian's slurm-wlm is built with multiple-slurmd support, so every host of a generated slurm.conf gets its own
slurmd (own port, spool and log) on this machine. Hosts may carry fake GPUs (`Gres=gpu:N`, gres.conf entries on
empty files in the cluster folder, AutoDetect=off): enough for Slurm to count and hand out GPUs, and for a CPU job
to run under the same sbatch a GPU job would use. Everything lives under one folder; `stop` ends every daemon this
cluster started, by the pid it recorded.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel")
START_TIMEOUT_S = 60.0


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def free_ports(count: int) -> list[int]:
    """Ports free right now on 127.0.0.1 (held open together so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class Host:
    name: str
    cpus: int = 4
    gpus: int = 0


@dataclass
class SlurmCluster:
    root: Path
    hosts: list[Host]
    topology_conf: str | None = None
    #: how long a job credential stays valid (AuthInfo cred_expire; Slurm's default, None, is 120 s). A requeued
    #: job may start again only after it (slurmctld sets its BeginTime to now + this + 1 s), so a test that requeues
    #: sets it short.
    cred_expire_s: int | None = None
    pids: list[int] = field(default_factory=list)
    started_s: float = 0.0

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    def env(self, path_prefix: str | None = None) -> dict[str, str]:
        env = {**os.environ, "SLURM_CONF": str(self.conf)}
        if path_prefix:
            env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
        return env

    def run(self, *args: str, check: bool = True, timeout: float = 60.0, **kwargs: object) -> str:
        result = subprocess.run(list(args), env=self.env(), capture_output=True, text=True, timeout=timeout,
                                check=False, **kwargs)  # type: ignore[call-overload]
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return str(result.stdout) + str(result.stderr)

    # --- start and stop ------------------------------------------------------------------------------------------

    def start(self) -> SlurmCluster:
        begin = time.monotonic()
        for folder in ("etc", "munge", "spool", "log", "run", "gpu"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        self._start_munge()
        ports = free_ports(1 + len(self.hosts))
        self._write_conf(ports)
        self._daemon(["slurmctld", "-i"], self.root / "run" / "slurmctld.pid")
        for host in self.hosts:
            (self.root / "spool" / host.name).mkdir(exist_ok=True)
            self._daemon(["slurmd", "-N", host.name], self.root / "run" / f"slurmd-{host.name}.pid")
        self._wait_idle()
        self.started_s = time.monotonic() - begin
        return self

    def _start_munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        munge = self.root / "munge"
        subprocess.run(["munged", "--force", f"--socket={munge / 'socket'}", f"--key-file={key}",
                        f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
                        f"--seed-file={munge / 'seed'}"], check=True, capture_output=True, timeout=30)
        self._record_pid(munge / "munged.pid")

    def _daemon(self, command: list[str], pid_file: Path) -> None:
        result = subprocess.run(command, env=self.env(), capture_output=True, text=True, timeout=60, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()}\n{self.logs()}")
        self._record_pid(pid_file)

    def _record_pid(self, pid_file: Path) -> None:
        deadline = time.monotonic() + 10
        while not pid_file.exists() or not pid_file.read_text().strip():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{pid_file} never appeared\n{self.logs()}")
            time.sleep(0.05)
        self.pids.append(int(pid_file.read_text().split()[0]))

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
            states = dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)
            if len(states) == len(self.hosts) and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.2)
        raise RuntimeError(f"Slurm hosts not idle after {START_TIMEOUT_S:.0f} s:\n{out}\n{self.logs()}")

    def stop(self) -> None:
        for pid in reversed(self.pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + 15
        for pid in self.pids:
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.pids.clear()

    def logs(self) -> str:
        parts = []
        for log in sorted((self.root / "log").glob("*.log")):
            parts.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts)

    # --- configuration -------------------------------------------------------------------------------------------

    def _write_conf(self, ports: list[int]) -> None:
        root = self.root
        lines = [
            "ClusterName=gpufleettest",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={ports[0]}",
            f"SlurmUser={getpass.getuser()}",
            f"SlurmdUser={getpass.getuser()}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={root / 'munge' / 'socket'}"
            + (f",cred_expire={self.cred_expire_s}" if self.cred_expire_s is not None else ""),
            f"StateSaveLocation={root / 'spool'}",
            f"SlurmdSpoolDir={root / 'spool' / '%n'}",
            f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'run' / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1",
            "SlurmdParameters=config_overrides",  # hosts may claim more CPUs than this machine has
            "ReturnToService=2",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "KillWait=5",
            "GresTypes=gpu",
        ]
        if self.topology_conf is not None:
            lines.append("TopologyPlugin=topology/tree")
            (root / "etc" / "topology.conf").write_text(self.topology_conf)
        gres = ["AutoDetect=off"]
        for host, port in zip(self.hosts, ports[1:], strict=True):
            gpus = f" Gres=gpu:{host.gpus}" if host.gpus else ""
            lines.append(f"NodeName={host.name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
                         f"CPUs={host.cpus} RealMemory=1000{gpus} State=UNKNOWN")
            if host.gpus:
                for index in range(host.gpus):
                    (root / "gpu" / f"nvidia{index}").touch()
                gres.append(f"NodeName={host.name} Name=gpu File={root / 'gpu'}/nvidia[0-{host.gpus - 1}]")
        lines.append("PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        (root / "etc" / "gres.conf").write_text("\n".join(gres) + "\n")

    # --- jobs ----------------------------------------------------------------------------------------------------

    def job_field(self, job_id: str, name: str) -> str | None:
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        for word in out.split():
            if word.startswith(f"{name}="):
                return word.split("=", 1)[1]
        return None

    def wait_state(self, job_id: str, states: set[str], timeout_s: float = 180.0) -> str:
        """Poll until the job reaches one of `states` (or a final state); returns the state."""
        final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}
        deadline = time.monotonic() + timeout_s
        state = None
        while time.monotonic() < deadline:
            state = self.job_field(job_id, "JobState")
            if state in states or state in final:
                return state or ""
            time.sleep(0.3)
        raise TimeoutError(f"job {job_id} still {state} after {timeout_s:.0f} s\n{self.logs()}")


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie waiting for its parent to reap it has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"
