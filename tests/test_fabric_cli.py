"""`gpufleet fabric` through the real entry point."""

from __future__ import annotations

import json

import pytest

from clirun import one_error_line
from clirun import run_gpufleet as run
from gpufleet.errors import InputError


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


@pytest.mark.parametrize("command", ["build", "simulate"])
def test_a_cluster_too_large_for_its_topology_is_refused_before_building(command: str) -> None:
    """10^8 GPUs on radix-64 switches used to build a graph until the kernel killed it; the limit (k^3/4 = 65,536
    GPUs for a three-tier fat tree, Al-Fares) is arithmetic and is reported at once."""
    out = run("fabric", command, "--gpus", "100000000", timeout=60)
    line = one_error_line(out)
    assert "at most 65,536 GPUs" in line and "radix 64" in line


@pytest.mark.parametrize("command", ["build", "simulate"])
def test_a_node_that_holds_another_gpu_is_refused(command: str) -> None:
    line = one_error_line(run("fabric", command, "--gpus", "64", "--gpu", "mi300x", "--node", "dgx-h100"))
    assert "--node dgx-h100" in line and "--gpu mi300x" in line


def test_simulate_needs_at_least_two_gpus() -> None:
    line = one_error_line(run("fabric", "simulate", "--gpus", "1"))
    assert "--gpus" in line and "at least 2" in line


def test_simulate_seed_without_ecmp_is_refused() -> None:
    """ndr400 routes by spray unless told otherwise: a hash seed would change nothing."""
    line = one_error_line(run("fabric", "simulate", "--gpus", "64", "--seed", "7"))
    assert "--seed" in line and "--routing ecmp" in line


def test_build_and_facility_count_the_same_fabric_watts() -> None:
    # ndr400 has no switch power in the catalog: both commands use facility.yaml's per-switch default
    from gpufleet.catalog.registry import load_catalog
    from gpufleet.economics.defaults import facility_defaults

    per_switch_w = facility_defaults(load_catalog()).switch_power_w
    built = json.loads(run("fabric", "build", "--gpus", "512", "--json").stdout)
    facility = json.loads(run("facility", "--gpus", "512", "--gpu", "h100-sxm", "--json").stdout)
    assert built["fabric_power_w"] == built["switches"] * per_switch_w
    assert built["switch_power_w"] + built["optics_power_w"] == built["fabric_power_w"]
    assert "facility default" in built["switch_power_source"]
    assert facility["switches"] == built["switches"] and facility["fabric_power_w"] == built["fabric_power_w"]


def test_an_all_to_all_over_the_simulators_limit_is_refused_at_once_with_what_fits() -> None:
    """65,536 GPUs is the three-tier NDR fat tree's maximum, so the count is accepted, but simulating an all-to-all
    over it used to be OOM-killed (24 GB). The work estimate refuses it before anything is built."""
    out = run("fabric", "simulate", "--gpus", "1024,65536", "--collective", "all-to-all", timeout=120)
    line = one_error_line(out)
    assert out.stdout == ""  # checked before the first (allowed) 1,024-GPU simulation ran
    assert "all-to-all over 65,536 GPUs" in line and "about 60 s" in line
    assert "--fabric-model analytical" in line
    fits = int(line.split("--gpus ")[1].split(" fits")[0])
    assert 1024 <= fits < 65536
    # the largest power of two that fits is named: it passes the same check, twice as many GPUs do not
    from gpufleet.catalog.registry import load_catalog
    from gpufleet.cli.fabric import block_span
    from gpufleet.fabric.graph import estimate_fabric_size
    from gpufleet.fabric.simulate import check_work, estimate_work, shape_of_span
    from gpufleet.fabric.topology import Cluster, Fabric

    catalog = load_catalog()
    node = catalog.node("dgx-h100")
    for count, allowed in ((fits, True), (2 * fits, False)):
        c = Cluster(catalog.gpu(node.gpu), node, count, Fabric(catalog.network("ndr400"), "fat-tree"))
        work = estimate_work("all-to-all", "auto", "spray", shape_of_span(c, block_span(c, "block")),
                             estimate_fabric_size(c))
        if allowed:
            check_work(work)
        else:
            with pytest.raises(InputError):
                check_work(work)


def test_send_recv_at_the_three_tier_maximum_runs() -> None:
    """It used to try to allocate 16 GiB (every flow's own copy of its ~2,000-link spray path)."""
    out = run("fabric", "simulate", "--gpus", "65536", "--collective", "send-recv", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["gpus"] == 65536 and 0 < data["busbw_gbps"] <= 400 / 8


def test_a_one_byte_buffer_is_shown_in_bytes_with_a_nonzero_bandwidth() -> None:
    table = run("fabric", "simulate", "--gpus", "16", "--size", "1")
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.startswith("│ 16"))
    assert "1 B" in row and "e-07 MiB" not in row
    data = json.loads(run("fabric", "simulate", "--gpus", "16", "--size", "1", "--json").stdout)
    assert data["size_bytes"] == 1 and data["algbw_gbps"] > 0


@pytest.mark.parametrize("size", ["2TiB", "1PiB", "1PB", "1e30", "0.5", "0"])
def test_a_buffer_outside_one_byte_to_one_tib_is_refused(size: str) -> None:
    line = one_error_line(run("fabric", "simulate", "--gpus", "16", "--size", size))
    assert f"--size {size}" in line and "1 byte" in line and "1 TiB" in line


def test_one_tib_per_rank_is_accepted() -> None:
    out = run("fabric", "simulate", "--gpus", "16", "--size", "1TiB", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["size_bytes"] == 2**40


def test_simulate_help_says_what_it_accepts() -> None:
    text = " ".join(run("fabric", "simulate", "--help").stdout.split())
    assert "a bare number is bytes" in text and "1 TiB" in text
    assert "range 64-1024" in text
    for suffix in (".png", ".svg", ".pdf", ".html"):
        assert suffix in text
