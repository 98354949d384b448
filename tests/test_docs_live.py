"""Docs quote live output: each figure README.md and docs/*.md quote from a `gpufleet` command is compared with what
that command prints today (its --json, run in process), within the doc's own rounding.

Not arithmetic on constants: when the model, the catalog or a default changes, the command's output moves and the
doc's figure must move with it. docs/validation.md is checked by its own tests. A figure is found by a marker near
it (`figure_after`): the first number after the marker's first occurrence in the file.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from clirun import run_gpufleet
from gpufleet.catalog.registry import load_catalog
from gpufleet.fabric.collectives import collective_cost
from gpufleet.fabric.placement import GroupSpan
from gpufleet.fabric.topology import Cluster, Fabric

ROOT = Path(__file__).resolve().parent.parent
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def doc(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def doc_section(name: str, heading: str) -> str:
    """The text of `name` from `heading` up to the next second-level heading."""
    text = doc(name)
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end >= 0 else len(text)]


def figure_after(text: str, marker: str, *, nth: int = 0) -> tuple[float, int]:
    """The `nth` number after the first occurrence of `marker` in `text`, and its decimals (its rounding)."""
    start = text.find(marker)
    assert start >= 0, f"marker {marker!r} not found"
    found = NUMBER.findall(text[start + len(marker):start + len(marker) + 400])
    assert len(found) > nth, f"no number #{nth} after {marker!r}"
    raw = found[nth].replace(",", "")
    decimals = len(raw.split(".")[1]) if "." in raw else 0
    return float(raw), decimals


def assert_quotes(text: str, marker: str, value: float, *, nth: int = 0, scale: float = 1.0) -> None:
    """The doc's figure after `marker` is `value` × `scale` rounded as the doc rounds it."""
    quoted, decimals = figure_after(text, marker, nth=nth)
    assert quoted == pytest.approx(round(value * scale, decimals), abs=0.51 * 10 ** -decimals), (
        f"{marker!r}: the doc says {quoted}, the command gives {value * scale}")


@cache
def command_json(*args: str) -> Any:
    result = run_gpufleet(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# ---- README.md ------------------------------------------------------------------------------------------

def test_readme_shipped_validation_figures() -> None:
    """The shipped median, run counts and memory rejections (these change with the model: update the README)."""
    data = command_json("validate")
    summary, runs = data["summary"], data["runs"]
    readme = doc("README.md")
    assert_quotes(readme, "## How good is the model?\n\n`gpufleet validate` predicts ", len(runs))
    shipped = "With no arguments,\n`gpufleet validate` predicts "
    assert_quotes(readme, shipped, summary["all"]["runs"])
    assert_quotes(readme, shipped, len(runs), nth=1)
    assert_quotes(readme, shipped, len(summary["skipped"]), nth=2)
    assert_quotes(readme, "with a median abs error of", summary["all"]["median_abs_error"], scale=100)
    assert_quotes(readme, "the memory model rejects", summary["memory_rejected"]["runs"])
    held = data["held_out"]
    marker = "held out of every fit (`catalog/runs/*_holdout.yaml`, in no fit's set):\n"
    assert_quotes(readme, marker, held["summary"]["all"]["runs"])
    assert_quotes(readme, marker, held["summary"]["all"]["median_abs_error"], nth=1, scale=100)
    assert_quotes(readme, marker, held["interval"]["inside"], nth=2)


def test_readme_links_only_inside_the_repository() -> None:
    readme = doc("README.md")
    assert "../shared" not in readme and "DESIGN.md" not in readme
    assert "(docs/design.md)" in readme and (ROOT / "docs" / "design.md").is_file()
    assert not re.search(r"\bissue \d+\b", readme), "the README tells today's figures, not internal issue history"


# ---- docs/seed-claims.md --------------------------------------------------------------------------------

def test_idle_capacity_figures() -> None:
    """S0-01: the rates `cost --json` gives and the two valuations the doc derives from them."""
    onprem = command_json("cost", "--gpu-hours", "438000", "--gpus", "512")["onprem"]
    claims = doc("docs/seed-claims.md")
    owned, energy, useful = (onprem["usd_per_gpu_hour_owned"], onprem["idle_energy_usd_per_gpu_hour"],
                             onprem["usd_per_gpu_hour"])
    assert_quotes(claims, '"usd_per_gpu_hour_owned":', owned)
    assert_quotes(claims, '"idle_energy_usd_per_gpu_hour":', energy)
    assert_quotes(claims, "(`usd_per_gpu_hour`, per useful hour: `", useful)
    assert_quotes(claims, "$2.25 per GPU-hour of the year, busy or idle: 438,000 × 2.25 = **$", owned * 438_000,
                  scale=1e-6)
    assert_quotes(claims, "438,000 × 0.0455 = **$", energy * 438_000, scale=1e-3)
    assert_quotes(claims, "an idle GPU still draws its node's idle\n  power, ", energy / (1.3 * 0.08) * 1e3)
    assert_quotes(claims, "70 % utilized, $22.15M capex, $", onprem["annual_usd"], scale=1e-6)
    assert_quotes(claims, "70 % utilized, $", onprem["capex_usd"], scale=1e-6)


def test_facility_figures() -> None:
    """S0-08, S0-09, S0-10, S2-28, S2-54: racks, rack power, cooling and power as `facility` prints them."""
    claims = doc("docs/seed-claims.md")
    base = command_json("facility", "--gpus", "512", "--node", "dgx-h100")
    assert_quotes(claims, "`gpufleet facility --gpus 512 --node dgx-h100` → `racks │ ", base["racks"])
    assert_quotes(claims, "`gpufleet facility --gpus 512 --node dgx-h100` → `racks │ ", base["nodes_per_rack"], nth=1)
    assert_quotes(claims, "`gpufleet facility --gpus 512 --node dgx-h100` → `racks │ ", base["rack_power_w"],
                  nth=2, scale=1e-3)
    assert f"`gpufleet facility --gpus 512 --node dgx-h100` → `cooling │ {base['cooling']}`" in claims
    assert_quotes(claims, "`IT power, max │ ", base["it_power_max_w"], scale=1e-3)
    assert_quotes(claims, "`facility power │ ", base["facility_power_w"], scale=1e-3)
    small = command_json("facility", "--gpus", "512", "--node", "dgx-h100", "--rack-kw", "15")
    assert_quotes(claims, "--rack-kw 15` → `racks │ ", small["racks"])
    assert_quotes(claims, "--rack-kw 15` → `racks │ ", small["rack_power_w"], nth=2, scale=1e-3)
    assert f"with `--rack-kw 15` → `cooling │ {small['cooling']}`" in claims
    dense = command_json("facility", "--gpus", "32", "--node", "dgx-h100", "--rack-kw", "41")
    marker = "`gpufleet facility --gpus 32 --node dgx-h100 --rack-kw 41` → `racks │ "
    assert_quotes(claims, marker, dense["nodes_per_rack"], nth=1)
    assert_quotes(claims, marker, dense["rack_power_w"], nth=2, scale=1e-3)
    assert f"(40.8 kW per rack)`, `cooling │ {dense['cooling']}`" in claims
    assert dense["cooling"] == "rear-door"  # NVIDIA's own 4 x DGX H100 reference rack is air-cooled


def test_ndr_fraction_of_line_rate() -> None:
    """S0-16: one NDR port at NCCL's achievable fraction, in Gb/s and GB/s."""
    ndr = command_json("catalog", "show", "ndr400")
    record = ndr.get("record", ndr)
    gbps = record["link_gbps"] * record["achievable_fraction"]
    claims = doc("docs/seed-claims.md")
    assert_quotes(claims, "one NDR port at NCCL's measured 96 % is ", gbps)
    assert_quotes(claims, "one NDR port at NCCL's measured 96 % is ", gbps / 8, nth=1)
    assert_quotes(claims, "`gpufleet catalog show ndr400` → `achievable_fraction │ ", record["achievable_fraction"])


def test_socket_transport_judgement_is_stated() -> None:
    socket = command_json("catalog", "show", "socket")
    record = socket.get("record", socket)
    assert "JUDGEMENT" in record["note"] and "nccl#1447" in record["source"]
    per_node = record["link_gbps"] * record["achievable_fraction"] * 8
    assert_quotes(doc("docs/seed-claims.md"), "(8 × 40 Gb/s = ", per_node)


def test_every_summary_row_has_five_cells() -> None:
    """A summary row of docs/seed-claims.md is one line with id, where, claim, verdict and command."""
    lines = doc("docs/seed-claims.md").splitlines()
    rows = [line for line in lines if re.match(r"\| S[02]-\d\d \|", line)]
    assert len(rows) == 102
    for row in rows:
        cells = row.strip().strip("|").split(" | ")
        assert len(cells) == 5, row
        command = cells[4].strip()
        assert command == "—" or command.startswith("see ") or command.startswith("— (") or (
            command.startswith("`") and command.endswith("`")), row


# ---- the NVLink answer: a GPU's NVLink bandwidth is its total to all peers ------------------------------

def test_nvlink_is_shared_by_peers() -> None:
    """900 GB/s (450 each way) is an H100's total over its NVSwitch links: one pair gets it only alone.

    A send-recv to one peer moves S bytes at the full line; an all-to-all of 8 sends 7/8 S from each GPU, S/8 to
    each of 7 peers at once, and takes 7/8 of the send-recv's time: each peer gets a seventh of the line."""
    catalog = load_catalog()
    h100 = catalog.gpu("h100-sxm")
    node = Cluster(h100, catalog.node("dgx-h100"), 8, Fabric(catalog.network("ndr400")))
    span = GroupSpan(size=8, per_node=8, nodes=1, nodes_per_leaf=1, leaves=1)
    pair = GroupSpan(size=2, per_node=2, nodes=1, nodes_per_leaf=1, leaves=1)
    size = 1e9
    line = h100.scale_up.bytes_per_s_per_direction * h100.scale_up.achievable_fraction
    assert h100.scale_up.bytes_per_s_per_direction == 450e9  # the 900 GB/s is both directions together
    alone = collective_cost("send-recv", size, pair, node)
    assert alone.bus_bytes_per_s == pytest.approx(line)
    everyone = collective_cost("all-to-all", size, span, node)
    per_peer = (size / 8) / everyone.time_s  # each of the 7 peers' share, all sent over the same time
    assert per_peer * 7 == pytest.approx(line, rel=0.01)
    assert per_peer < line / 6
