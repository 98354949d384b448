"""The shipped alert rules: promtool checks and unit-tests them, every alert has a firing test case, and every metric
they (and the dashboard) name is one the exporter or StepMonitor really serves."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.runtime.monitor.exporter import ExporterConfig, build_registry, open_reader, scrape
from gpufleet.runtime.monitor.plan_target import PlanTarget
from gpufleet.runtime.monitor.step_monitor import StepMonitor

ASSETS = Path(str(resources.files("gpufleet.runtime.monitor") / "assets"))
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool not installed (Debian package prometheus)")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120, check=False, cwd=ASSETS)


@needs_promtool
def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_test_rules() -> None:
    result = promtool("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_test_case_where_it_fires() -> None:
    rules = yaml.safe_load((ASSETS / "alerts.yml").read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"] if "alert" in rule}
    tests = yaml.safe_load((ASSETS / "alerts_test.yml").read_text())["tests"]
    firing = {case["alertname"] for test in tests for case in test.get("alert_rule_test", []) if case["exp_alerts"]}
    quiet = {case["alertname"] for test in tests for case in test.get("alert_rule_test", []) if not case["exp_alerts"]}
    assert alerts == firing, alerts ^ firing
    assert len(quiet) >= 8  # most also have a case where they must stay silent


def served_names(tmp_path: Path) -> set[str]:
    """Every series name the exporter (every fault injected) and a StepMonitor serve."""
    (tmp_path / "step_000000000001").mkdir()
    ib = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (ib / "counters").mkdir(parents=True)
    (ib / "state").write_text("4: ACTIVE")
    (ib / "rate").write_text("400 Gb/sec (4X NDR)")
    for name in ("port_xmit_data", "port_rcv_data", "link_downed", "symbol_error", "port_rcv_errors",
                 "link_error_recovery", "port_xmit_discards"):
        (ib / "counters" / name).write_text("1")
    config = ExporterConfig(fake_gpus=2, fake_events=("0:xid=79",), checkpoint_dirs=(tmp_path,),
                            sysfs_root=tmp_path / "sys", plan=PlanTarget(1.0, 1000.0, 0.4))
    monitor = StepMonitor(plan=PlanTarget(1.0, 1000.0, 0.4), rank=0, world_size=1, straggler_every=1)
    monitor.record_step(1.0, tokens=1000)
    monitor.check_stragglers = lambda: None  # type: ignore[assignment,method-assign,return-value]
    monitor.metrics.score.set(1.0)
    names = set()
    for text in (scrape(build_registry(config, open_reader(config))), scrape(monitor.registry)):
        for family in text_string_to_metric_families(text):
            names |= {sample.name for sample in family.samples}
    return names


def test_rules_and_dashboard_only_name_metrics_that_are_served(tmp_path: Path) -> None:
    names = served_names(tmp_path)
    rules = (ASSETS / "alerts.yml").read_text()
    dashboard = json.loads((ASSETS / "dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    used = set(re.findall(r"\bgpufleet_[a-z_]+", rules + "\n".join(exprs)))
    assert used, "no gpufleet metric named"
    assert used <= names, used - names


def test_the_dashboard_is_well_formed() -> None:
    dashboard = json.loads((ASSETS / "dashboard.json").read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    assert graphs and all(panel["targets"] and panel["datasource"]["type"] == "prometheus" for panel in graphs)
    cells = set()
    for panel in graphs:  # no two panels overlap on the 24-column grid
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & mine, panel["title"]
        cells |= mine
