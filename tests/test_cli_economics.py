"""`gpufleet cost|facility|reliability` through the installed entry point, as a user runs them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from clirun import one_error_line
from clirun import run_gpufleet as run


def run_json(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = run(*args, "--json", env=env)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_facility_json() -> None:
    data = run_json("facility", "--gpus", "512", "--node", "dgx-h100")
    assert data["it_power_max_w"] == pytest.approx(680_896)
    assert data["it_power_typical_w"] == pytest.approx(476_096)
    assert data["racks"] == 22
    assert data["cooling"] == "rear-door"
    assert data["facility_power_w"] == pytest.approx(680_896 * 1.3)
    assert data["annual_energy_kwh"] == pytest.approx(476_096 * 1.3 * 8.76)


def test_facility_flags_override_defaults() -> None:
    data = run_json("facility", "--gpus", "512", "--gpu", "h100-sxm", "--rack-kw", "25", "--pue", "1.5",
                    "--usd-per-kwh", "0.1")
    assert data["nodes_per_rack"] == 2 and data["racks"] == 32 and data["cooling"] == "air"
    assert data["annual_energy_usd"] == pytest.approx(476_096 * 1.5 * 8.76 * 0.1)


def test_reliability_json_llama3() -> None:
    data = run_json("reliability", "--gpus", "16384", "--checkpoint-gb", "5670", "--write-gbps", "500",
                    "--restart-min", "10")
    assert data["mtti_hours"] == pytest.approx(54 * 24 / 419)
    assert data["interruptions_per_day"] == pytest.approx(419 / 54)
    assert data["checkpoint_write_s"] == pytest.approx(11.34)
    assert data["optimal_interval_min"] == pytest.approx(8.25, abs=0.01)
    assert 0.9 < data["goodput"] < 0.91


def test_reliability_from_params_and_train_time() -> None:
    data = run_json("reliability", "--gpus", "1024", "--params", "70B", "--train-time", "30d")
    assert data["checkpoint_gb"] == pytest.approx(980)  # 70e9 x 14 B
    assert data["wall_time_days"] == pytest.approx(30 / data["goodput"])


def test_cost_json() -> None:
    data = run_json("cost", "--gpu-hours", "1M", "--gpu", "h100-sxm", "--offer", "aws-p5-on-demand")
    p5 = next(o for o in data["offers"] if o["name"] == "aws-p5-on-demand")
    assert p5["usd"] == pytest.approx(6.88e6)
    assert [o["usd"] for o in data["offers"]] == sorted(o["usd"] for o in data["offers"])
    onprem = data["onprem"]
    assert set(onprem) >= {"usd_per_gpu_hour", "breakeven_utilization", "breakeven_months"}
    assert 0 < onprem["breakeven_utilization"] < 1  # owning beats $6.88/GPU-h at some utilization
    assert onprem["breakeven_months"] > 0


def test_cost_uses_user_quote(tmp_path: Path) -> None:
    quote = tmp_path / "quote.yaml"
    quote.write_text(
        "cloud_offers:\n"
        "  - {id: our-h100-deal, provider: Acme, sku: 8x H100, gpu: h100-sxm, pricing: committed,\n"
        "     usd_per_gpu_hour: 1.5, as_of: '2026-12-01', source: signed quote}\n"
    )
    via_flag = run_json("cost", "--gpu-hours", "1000", "--catalog", str(quote))
    via_env = run_json("cost", "--gpu-hours", "1000", env={"GPUFLEET_CATALOG": str(quote)})
    for data in (via_flag, via_env):
        assert data["offers"][0]["name"] == "our-h100-deal"
        assert data["offers"][0]["usd"] == pytest.approx(1500)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("cost", "--gpu-hours", "1000", "--utilization", "1.5"), "--utilization"),
        (("cost", "--gpu-hours", "1000", "--offer", "aws-p5-ondemand"), "did you mean"),
        (("cost", "--gpu-hours", "1e400", "--gpu", "h100-sxm"), "--gpu-hours must be a finite number"),
        (("reliability", "--gpus", "64", "--params", "70B", "--train-time", "1e400d"),
         "--train-time must be a finite number"),
        (("cost", "--gpu-hours", "-3"), "--gpu-hours"),
        (("cost", "--gpu-hours", "1000", "--gpus", "0"), "--gpus"),
        (("facility", "--gpus", "0", "--node", "dgx-h100"), "at least 1"),
        (("facility", "--gpus", "8", "--node", "dgx-h100", "--pue", "0.9"), "--pue"),
        (("facility", "--gpus", "8"), "--node"),
        (("reliability", "--gpus", "0", "--checkpoint-gb", "10"), "at least 1"),
        (("reliability", "--gpus", "8"), "--checkpoint-gb"),
        (("reliability", "--gpus", "8", "--checkpoint-gb", "10", "--restart-min", "-1"), "--restart-min"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: tuple[str, ...], fragment: str) -> None:
    result = run(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert fragment in lines[0]
    assert "Traceback" not in result.stderr


def test_negative_price_in_user_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "cloud_offers:\n"
        "  - {id: mine, provider: X, sku: y, gpu: h100-sxm, pricing: on-demand,\n"
        "     usd_per_gpu_hour: -2, as_of: '2026-12', source: test}\n"
    )
    result = run("cost", "--gpu-hours", "10", "--catalog", str(bad))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "usd_per_gpu_hour" in result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("cost", "--gpu-hours", "1000", "--years", "0"), "--years must be greater than 0, got 0"),
        (("cost", "--gpu-hours", "1000", "--usd-per-kwh", "-1"), "--usd-per-kwh must be greater than 0"),
        (("facility", "--gpus", "8", "--gpu", "h100-sxm", "--rack-kw", "0"), "--rack-kw must be greater than 0"),
        (("facility", "--gpus", "8", "--gpu", "h100-sxm", "--pue", "5"), "--pue must be in [1, 3], got 5"),
        (("facility", "--gpus", "8", "--gpu", "h100-sxm", "--mfu", "2"), "--mfu must be in (0, 1]"),
        (("reliability", "--gpus", "8", "--checkpoint-gb", "10", "--restart-min", "-1"),
         "--restart-min must be at least 0"),
        (("reliability", "--gpus", "64", "--checkpoint-gb", "10", "--write-gbps", "1e308"),
         "--write-gbps must be between"),
        (("reliability", "--gpus", "64", "--checkpoint-gb", "10", "--interval-min", "1e9"),
         "--interval-min 1e+09 leaves the job no progress"),
        (("reliability", "--gpus", "64", "--checkpoint-gb", "10", "--failures", "nope"), "--failures"),
    ],
)
def test_a_bad_value_is_reported_by_its_flag_and_allowed_range(args: tuple[str, ...], expected: str) -> None:
    assert expected in one_error_line(run(*args))


def test_interval_refusal_names_the_range_that_makes_progress() -> None:
    """The range is real: its ends run, and the job's MTTI is not blamed for the user's interval."""
    line = one_error_line(run("reliability", "--gpus", "64", "--checkpoint-gb", "10", "--interval-min", "1e9"))
    assert "too short" not in line
    found = re.search(r"between (\S+) and (\S+) min", line)
    assert found, line
    for end in found.groups():
        assert run("reliability", "--gpus", "64", "--checkpoint-gb", "10", "--interval-min", end).returncode == 0


@pytest.mark.parametrize(
    ("args", "flags"),
    [
        (("reliability", "--gpus", "64", "--checkpoint-gb", "10", "--params", "70B"), ("--checkpoint-gb", "--params")),
        (("reliability", "--gpus", "64", "--checkpoint-gb", "10", "--write-gbps", "50", "--gpus-per-node", "4"),
         ("--write-gbps", "--gpus-per-node")),
        (("facility", "--gpus", "64", "--gpu", "mi300x", "--node", "dgx-h100"), ("--gpu mi300x", "--node dgx-h100")),
        (("cost", "--gpu-hours", "1000", "--gpu", "mi300x", "--node", "dgx-h100"),
         ("--gpu mi300x", "--node dgx-h100")),
    ],
)
def test_flags_that_contradict_each_other_are_refused(args: tuple[str, ...], flags: tuple[str, ...]) -> None:
    line = one_error_line(run(*args))
    assert all(flag in line for flag in flags), line


def test_unknown_pricing_lists_the_pricing_models() -> None:
    line = one_error_line(run("cost", "--gpu-hours", "1000", "--pricing", "foo"))
    assert "--pricing 'foo'" in line and "on-demand, spot, reserved-1y" in line


def test_facility_help_says_node_or_gpu_is_required() -> None:
    shown = run("facility", "--help")
    assert shown.returncode == 0
    assert "one of them is required" in " ".join(shown.stdout.split())
