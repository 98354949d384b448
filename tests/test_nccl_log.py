"""The NCCL log reader on excerpts in NCCL's real log format (tests/data/nccl_logs/, each citing where its line
shapes come from). Expected counts and findings were read off the fixture files by hand. Pure: no torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clirun import one_error_line, run_gpufleet
from gpufleet.errors import InputError
from gpufleet.runtime.doctor.nccl_log import read_nccl_log, summarize, transport_kind

LOGS = Path(__file__).parent / "data" / "nccl_logs"


def report(name: str):  # type: ignore[no-untyped-def]
    return read_nccl_log((LOGS / name).read_text())


def ids(name: str) -> set[str]:
    return {finding.id for finding in report(name).findings}


@pytest.mark.parametrize(("via", "kind"), [
    ("NET/Socket/0", "net-socket"),
    ("NET/IB/2/GDRDMA", "net-ib"),
    ("NET/IBext_v8/0/GDRDMA", "net-ib"),
    ("NET/AWS Libfabric/0/GDRDMA", "net-plugin"),
    ("P2P/CUMEM/read", "p2p"),
    ("P2P/IPC/read", "p2p"),
    ("P2P/direct pointer", "p2p"),
    ("SHM/direct/direct", "shm"),
    ("direct shared memory", "shm"),
])
def test_transport_kind_of_nccls_via_words(via: str, kind: str) -> None:
    assert transport_kind(via) == kind


def test_tcp_fallback_is_found_and_blames_the_environment_variable() -> None:
    result = report("tcp_fallback.log")
    summary = result.summary
    # 6 `via NET/Socket/N` lines and 2 `via P2P/IPC/read` lines in the fixture.
    assert summary.transport_counts() == {"net-socket": 6, "p2p": 2}
    assert summary.networks == ("Socket",)
    assert summary.bootstrap_interfaces == ("ib0:10.8.0.11<0>", "ib0:10.8.0.12<0>")
    assert (summary.ranks, summary.nodes, summary.version) == (16, 2, "2.18.5+cuda12.2")
    assert summary.rings and not summary.trees
    [finding] = result.failed
    assert finding.id == "tcp-fallback" and "6 of 6" in finding.message
    assert "NCCL_IB_DISABLE" in finding.fix


def test_a_healthy_ib_log_has_no_findings() -> None:
    result = report("healthy_ib.log")
    summary = result.summary
    assert result.findings == ()
    assert summary.transport_counts() == {"net-ib": 5, "p2p": 2}
    assert all(c.gdr for c in summary.connections if c.kind == "net-ib")
    assert summary.net_devices == ("mlx5_0:1/IB", "mlx5_1:1/IB", "mlx5_2:1/IB", "mlx5_3:1/IB")
    assert summary.rings and summary.trees and summary.nvls_available and summary.nvls_channels == 16
    assert summary.gdr_enabled_hcas == ("mlx5_0",)
    # the links table: rank 15 -> 0 is carried by 2 channels on NET/IB/0 (receive side) and 1 on NET/IB/3 (send)
    links = {(link.src_rank, link.dst_rank, link.via): link.channels for link in summary.links()}
    assert links[(15, 0, "NET/IB/0/GDRDMA")] == 2 and links[(15, 0, "NET/IB/3/GDRDMA")] == 1


def test_gdr_disabled_names_the_hcas_the_count_and_the_forcing_variable() -> None:
    result = report("gdr_disabled_roce.log")
    [finding] = result.findings
    assert finding.id == "no-gdrdma" and finding.severity == "warning"
    assert "2 of 3" in finding.message and "mlx5_0, mlx5_1" in finding.message
    assert "NCCL_NET_GDR_LEVEL is LOC" in finding.fix


def test_loopback_across_nodes_is_an_error_and_socket_gdr_lines_are_not_hcas() -> None:
    result = report("loopback_socket.log")
    assert {f.id for f in result.failed} == {"tcp-fallback", "virtual-interface"}
    assert result.summary.gdr_disabled_hcas == ()  # `NET/Socket : GPU Direct RDMA Disabled for HCA 0 'lo'`
    assert "no-gdrdma" not in ids("loopback_socket.log")


def test_no_ib_device_on_an_old_nccl_with_ring_lines() -> None:
    result = report("no_ib_device_old.log")
    assert result.summary.no_ib_device
    assert result.summary.transport_counts() == {"net-socket": 1, "shm": 1}
    assert {f.id for f in result.findings} == {"tcp-fallback", "intra-node-shm"}
    assert "no IB device" in result.failed[0].fix


def test_nvls_available_but_unused_and_forced_algorithm() -> None:
    result = report("nvls_unused.log")
    assert {f.id: f.severity for f in result.findings} == {"nvls-unused": "warning", "forced-tuning": "info"}
    assert "NCCL_NVLS_ENABLE=0" in next(f.fix for f in result.findings if f.id == "nvls-unused")
    assert result.summary.environment["NCCL_ALGO"] == "Ring"


def test_watchdog_timeouts_are_grouped_per_collective_behind_launcher_prefixes() -> None:
    result = report("watchdog_timeout.log")
    timeouts = result.summary.timeouts
    assert sorted(t.rank for t in timeouts) == [0, 2, 3]
    assert {(t.seq, t.op, t.timeout_ms) for t in timeouts} == {(808, "ALLREDUCE", 600000)}
    [timeout] = result.failed
    assert timeout.id == "watchdog-timeout" and "rank(s) 0, 2, 3" in timeout.message and "600 s" in timeout.message
    assert any(f.id == "nccl-warn" and "socketFinalizeAccept" in f.message for f in result.findings)


def test_newer_nccl_spelling_without_space_before_the_colon() -> None:
    # NCCL 2.27 prints `Bootstrap: Using ...` (https://github.com/NVIDIA/nccl/issues/1866).
    summary = summarize(["cl4-gpu03-vm:1134070:1134070 [0] NCCL INFO Bootstrap: Using docker0:172.17.0.1<0>"])
    assert summary.bootstrap_interfaces == ("docker0:172.17.0.1<0>",)
    result = read_nccl_log("cl4-gpu03-vm:1:1 [0] NCCL INFO Bootstrap: Using docker0:172.17.0.1<0>\n")
    assert [(f.id, f.severity) for f in result.findings] == [("virtual-interface", "warning")]


def test_a_log_without_nccl_lines_is_refused() -> None:
    with pytest.raises(InputError, match="no NCCL log line"):
        read_nccl_log((LOGS / "not_nccl.log").read_text(), source="not_nccl.log")


FIXTURES = sorted(path.name for path in LOGS.glob("*.log") if path.name != "not_nccl.log")


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(FIXTURES), seed=st.randoms(use_true_random=False),
       noise=st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
                              max_size=40), max_size=5))
def test_findings_do_not_depend_on_line_order_or_foreign_lines(name: str, seed, noise: list[str]) -> None:  # type: ignore[no-untyped-def]
    """Interleaved ranks print in any order and jobs mix NCCL lines with their own output: neither may change
    what is found (the version line is order-free too: every line of a fixture agrees)."""
    lines = (LOGS / name).read_text().splitlines()
    shuffled = [*lines, *(f"step 1 loss 2.0 {text}" for text in noise)]
    seed.shuffle(shuffled)
    before = {(f.id, f.severity) for f in read_nccl_log("\n".join(lines)).findings}
    after = {(f.id, f.severity) for f in read_nccl_log("\n".join(shuffled)).findings}
    assert after == before


def test_cli_exits_1_naming_each_failed_finding() -> None:
    result = run_gpufleet("doctor", "nccl-log", str(LOGS / "loopback_socket.log"), "--json")
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert {row["id"] for row in data["findings"] if row["severity"] == "error"} == {"tcp-fallback",
                                                                                     "virtual-interface"}
    [line] = result.stderr.splitlines()
    assert "tcp-fallback" in line and "virtual-interface" in line and "2 failed" in line


def test_cli_healthy_log_exits_0_with_the_links_table() -> None:
    result = run_gpufleet("doctor", "nccl-log", str(LOGS / "healthy_ib.log"))
    assert result.returncode == 0, result.stderr
    assert "NET/IB/0/GDRDMA" in result.stdout and "no findings" in result.stdout
    data = json.loads(run_gpufleet("doctor", "nccl-log", str(LOGS / "healthy_ib.log"), "--json").stdout)
    assert data["transports"] == {"net-ib": 5, "p2p": 2} and data["algorithms"]["nvls_channels"] == 16


@pytest.mark.parametrize(("target", "words"), [
    ("not_nccl.log", "no NCCL log line"),
    ("missing.log", "cannot read"),
    (".", "is a folder"),
])
def test_cli_bad_input_is_one_line_exit_2(target: str, words: str) -> None:
    assert words in one_error_line(run_gpufleet("doctor", "nccl-log", str(LOGS / target)))
