"""`gpufleet fabric` through the real entry point."""

from __future__ import annotations

import json

import pytest

from clirun import run_gpufleet as run


def test_build_json_matches_superpod_two_su() -> None:
    out = run("fabric", "build", "--topology", "rail-optimized", "--gpus", "512", "--network", "ndr400", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["leaf_switches"], data["spine_switches"], data["core_switches"]) == (16, 8, 0)
    assert data["optical_cables"] == 512 + 512  # 64 nodes x 8 NICs, plus 16 leaves x 32 uplinks


def test_simulate_json_fields() -> None:
    out = run("fabric", "simulate", "--collective", "all-reduce", "--size", "1GiB", "--gpus", "256", "--topology",
              "leaf-spine", "--oversubscription", "4:1", "--network", "roce200", "--placement", "scatter", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    for key in ("time_s", "algbw_gbps", "busbw_gbps", "analytical_busbw_gbps", "bottlenecks"):
        assert key in data
    assert 0 < data["busbw_gbps"] <= 8 * 200 / 8


def test_simulate_plot_html(tmp_path: object) -> None:
    from pathlib import Path

    target = Path(str(tmp_path)) / "bus.html"
    out = run("fabric", "simulate", "--size", "1MiB,64MiB", "--gpus", "32", "--network", "ndr400,roce200",
              "--plot", str(target))
    assert out.returncode == 0, out.stderr
    text = target.read_text()
    assert "bus bandwidth" in text and "ndr400" in text and "roce200" in text


@pytest.mark.parametrize("args", [
    ("fabric", "build", "--gpus", "16384", "--topology", "leaf-spine"),
    ("fabric", "build", "--gpus", "64", "--oversubscription", "0.5:1"),
    ("fabric", "build", "--gpus", "64", "--network", "nope"),
    ("fabric", "simulate", "--gpus", "64", "--collective", "all-sum"),
])
def test_bad_input_one_line_exit_2(args: tuple[str, ...]) -> None:
    out = run(*args)
    assert out.returncode == 2
    assert out.stderr.startswith("error:") and out.stderr.count("\n") == 1
