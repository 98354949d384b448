"""A real Prometheus (Debian's package) scrapes `gpufleet exporter --fake-gpus` and a StepMonitor rank on 127.0.0.1,
evaluates the shipped rules, and answers queries: the series, the GPU-to-rank join, a firing alert, and every
dashboard query (each with data: the faults injected leave no panel empty)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from _net import free_port

sys.path.insert(0, str(Path(__file__).parents[1]))
from clirun import entry_point
from gpufleet.runtime.monitor.plan_target import PlanTarget
from gpufleet.runtime.monitor.step_monitor import StepMonitor

ASSETS = Path(str(resources.files("gpufleet.runtime.monitor") / "assets"))
pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("prometheus") is None,
                                                   reason="prometheus not installed (Debian package prometheus)")]


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def wait_until(what: str, check: Any, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; last answer: {last!r}")


class Prom:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = get(f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert answer["status"] == "success", answer
        return list(answer["data"]["result"])


def fake_sysfs(tmp_path: Path) -> Path:
    port = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "counters" / "port_xmit_data").write_text("250\n")
    return tmp_path / "sys"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Prom, StepMonitor]]:
    exporter_port, rank_port, prom_port = free_port(), free_port(), free_port()
    exporter = subprocess.Popen([*entry_point(), "exporter", "--fake-gpus", "4",
                                 "--listen", f"127.0.0.1:{exporter_port}",
                                 "--fake-event", "2:hw_thermal", "--fake-event", "1:xid=79", "--fake-event", "3:fail",
                                 "--checkpoint-dir", str(tmp_path), "--sysfs-root", str(fake_sysfs(tmp_path)),
                                 "--duration", "120"],
                                stderr=subprocess.PIPE, text=True)
    monitor = StepMonitor(plan=PlanTarget(1.0, 1000.0, 0.5), port=rank_port, rank=0, local_rank=0, world_size=1,
                          gpu_index=2, straggler_every=1, window=4)
    for _ in range(4):
        monitor.record_step(1.25, tokens=800)  # 0.8 of plan
    shutil.copy(ASSETS / "alerts.yml", tmp_path / "alerts.yml")
    (tmp_path / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: [alerts.yml]
scrape_configs:
  - job_name: gpufleet-node
    static_configs: [{{targets: ["127.0.0.1:{exporter_port}"]}}]
  - job_name: gpufleet-train
    static_configs: [{{targets: ["127.0.0.1:{rank_port}"]}}]
""")
    prometheus = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tmp_path / 'data'}",
                                   f"--web.listen-address=127.0.0.1:{prom_port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        prom = Prom(prom_port)
        wait_until("both targets up", lambda: len(prom.query("up == 1")) == 2)
        yield prom, monitor
    finally:
        prometheus.terminate()
        exporter.terminate()
        monitor.close()
        for proc in (prometheus, exporter):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.mark.timeout(180)
def test_prometheus_scrapes_the_exporter_and_a_rank(stack: tuple[Prom, StepMonitor]) -> None:
    prom, _ = stack
    up = {int(r["metric"]["gpu"]): float(r["value"][1]) for r in prom.query("gpufleet_gpu_up")}
    assert up == {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.0}  # GPU 3 was made to fail: marked, the others unaffected
    hot = prom.query('gpufleet_gpu_throttled{reason="hw_thermal"} == 1')
    assert [r["metric"]["gpu"] for r in hot] == ["2"]
    clock = prom.query('gpufleet_gpu_sm_clock_hertz{gpu="2"}')
    assert float(clock[0]["value"][1]) == 1410e6
    ratio = prom.query("gpufleet_train_plan_ratio")
    assert float(ratio[0]["value"][1]) == pytest.approx(0.8)
    # the recording rule joins GPU 2's throttling to the rank running on it
    joined = wait_until("the recording rule", lambda: prom.query("gpufleet:rank_gpu_slowed == 1"))
    assert [(r["metric"]["rank"], r["metric"]["gpu"]) for r in joined] == [("0", "2")]


@pytest.mark.timeout(180)
def test_the_xid_alert_fires_in_prometheus(stack: tuple[Prom, StepMonitor]) -> None:
    prom, _ = stack

    def firing() -> list[dict[str, Any]]:
        alerts = get(f"{prom.base}/api/v1/alerts")["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "GpufleetXid" and a["state"] == "firing"]

    (alert,) = wait_until("GpufleetXid firing", firing)
    assert alert["labels"]["gpu"] == "1" and alert["labels"]["xid"] == "79"
    rules = get(f"{prom.base}/api/v1/rules")["data"]["groups"]
    assert all(rule["health"] == "ok" for group in rules for rule in group["rules"]), rules


@pytest.mark.timeout(180)
def test_every_dashboard_query_returns_series(stack: tuple[Prom, StepMonitor]) -> None:
    prom, _ = stack
    wait_until("two scrapes of each target", lambda: prom.query("rate(gpufleet_gpu_energy_joules_total[5m]) > 0")
               and prom.query("rate(gpufleet_train_steps_total[5m])"))
    dashboard = json.loads((ASSETS / "dashboard.json").read_text())
    exprs = [t["expr"].replace("$hostname", ".*") for p in dashboard["panels"] for t in p.get("targets", [])]
    assert [expr for expr in exprs if not prom.query(expr)] == []
