"""The NCCL log reader on excerpts in NCCL's real log format (tests/data/nccl_logs/, each citing where its line
shapes come from). Expected counts and findings were read off the fixture files by hand. Pure: no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clirun import entry_point, one_error_line, run_gpufleet
from gpufleet.errors import InputError
from gpufleet.fsio import FileTooLarge, open_regular_file
from gpufleet.runtime.doctor.nccl_log import (
    MAX_LINE_BYTES,
    MAX_LOG_BYTES,
    _log_lines,
    read_nccl_log,
    read_nccl_log_file,
    summarize,
    transport_kind,
)

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
    ("missing.log", "does not exist"),
    (".", "is a folder"),
])
def test_cli_bad_input_is_one_line_exit_2(target: str, words: str) -> None:
    assert words in one_error_line(run_gpufleet("doctor", "nccl-log", str(LOGS / target)))


# --- issue 31: the three gaps of a real log ------------------------------------------------------------------------


def test_a_log_cut_off_before_its_connections_still_finds_the_tcp_fallback() -> None:
    # cut_off_socket.log: `NET/Socket : Using`, `Using network Socket`, `... nranks 32 ... - Init START`, no `via`.
    result = report("cut_off_socket.log")
    assert result.summary.connections == () and result.summary.nodes is None
    assert result.summary.ranks == 32  # from the Init START line: more ranks than one host holds
    [finding] = result.failed
    assert finding.id == "tcp-fallback" and "32 ranks" in finding.message and "ends before" in finding.message
    assert "no IB device" in finding.fix  # the log's `NET/IB : No device found.`


def test_a_cut_off_socket_log_that_cannot_tell_the_node_count_warns() -> None:
    lines = [line for line in (LOGS / "cut_off_socket.log").read_text().splitlines() if "Init START" not in line]
    result = read_nccl_log("\n".join(lines))
    assert result.summary.ranks is None and result.failed == ()
    assert [(f.id, f.severity) for f in result.findings] == [("tcp-fallback", "warning")]


def test_cli_cut_off_log_exits_1_and_shows_the_rank_count() -> None:
    result = run_gpufleet("doctor", "nccl-log", str(LOGS / "cut_off_socket.log"))
    assert result.returncode == 1
    assert "ranks 32" in result.stdout and "ranks ?" not in result.stdout
    [line] = result.stderr.splitlines()
    assert "tcp-fallback" in line


def test_the_largest_communicator_gives_the_rank_count() -> None:
    lines = ["h:1:1 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 0 nranks 64 cudaDev 0 nvmlDev 0 busId 18000 "
             "commId 0x2 - Init START",
             "h:1:1 [0] NCCL INFO ncclCommSplit comm 0x3 rank 0 nranks 8 cudaDev 0 nvmlDev 0 busId 18000 parent 0x1 "
             "color 1 key 0 commId 0x4 - Init START"]
    assert summarize(lines).ranks == 64


def test_gpu_direct_rdma_per_gpu_and_hca_is_counted() -> None:
    # gdr_gpu_hca.log: `GPU Direct RDMA Enabled for GPU 18000 / HCA 0 ...` and `Disabled for GPU 5d000 / HCA 1 ...`,
    # HCA 0 and 1 being mlx5_0 and mlx5_1 in the `NET/IB : Using` line.
    result = report("gdr_gpu_hca.log")
    assert result.summary.gdr_enabled_hcas == ("mlx5_0",)
    assert result.summary.gdr_disabled_hcas == ("mlx5_1 (GPU 5d000)",)
    [finding] = result.findings
    assert finding.id == "no-gdrdma" and "1 of 3" in finding.message and "mlx5_1 (GPU 5d000)" in finding.message


def test_gpu_direct_rdma_enabled_per_gpu_shows_in_the_cli() -> None:
    lines = [line for line in (LOGS / "gdr_gpu_hca.log").read_text().splitlines()
             if "[3]" not in line]  # only the GPU whose RDMA is on
    result = read_nccl_log("\n".join(lines))
    assert result.findings == () and result.summary.gdr_enabled_hcas == ("mlx5_0",)


# --- issue 31: reads regular files only, streamed, bounded ----------------------------------------------------------

#: Seconds a refused special file may take through a real process on a loaded machine (the old reader never ended).
REFUSAL_LIMIT_S = 60


@pytest.mark.parametrize(("target", "kind"), [("/proc/kmsg", "a /proc or /sys file"), ("/dev/zero", "device"),
                                              ("pipe", "a named pipe")])
def test_special_files_are_refused_unread_in_one_line(tmp_path: Path, target: str, kind: str) -> None:
    if target == "pipe":
        target = str(tmp_path / "pipe.log")
        os.mkfifo(target)
    line = one_error_line(run_gpufleet("doctor", "nccl-log", target, timeout=REFUSAL_LIMIT_S))
    assert kind in line and "not a regular file" in line


#: The issue's bound: a 20 MB one-line log answered in under 30 s (it took over 40 s; now about a second).
ONE_LINE_LIMIT_S = 30


def test_a_20_mb_single_line_log_is_read_in_seconds(tmp_path: Path) -> None:
    log = tmp_path / "one_line.log"
    log.write_text("h:1:1 [0] NCCL INFO Using network Socket " + "a" * 20_000_000, encoding="utf-8")
    started = time.monotonic()
    result = run_gpufleet("doctor", "nccl-log", str(log), "--json", timeout=ONE_LINE_LIMIT_S * 2)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert elapsed < ONE_LINE_LIMIT_S, f"{elapsed:.1f} s"
    assert json.loads(result.stdout)["networks"] == ["Socket"]  # the line's start is read, the rest skipped


def test_long_lines_that_made_the_patterns_quadratic_are_read_in_linear_time() -> None:
    # each pattern's worst line: runs of one character where a pattern used to try every start
    hostile = ["h:1:1 [0] NCCL INFO " + "a" * 8000, "h:1:1 [0] NCCL INFO " + "1" * 8000,
               "h:1:1 [0] NCCL INFO " + "GPU Direct RDMA " * 500, "h:1:1 [0] NCCL INFO NCCL_X set by environment to"
               + " " * 8000 + "x", "a" * 8000 + " [0] NCCL INFO x", "[Rank 1] Watchdog caught " + "(" * 8000]
    started = time.monotonic()
    summary = summarize(hostile * 50)
    assert time.monotonic() - started < 10  # quadratic, these 300 lines took minutes
    assert summary.nccl_lines == 200


def test_a_line_past_the_cap_is_cut_and_the_next_line_still_read(tmp_path: Path) -> None:
    log = tmp_path / "long.log"
    log.write_bytes(b"x" * (MAX_LINE_BYTES * 3) + b"\nh:1:1 [0] NCCL INFO Using network IB\n")
    summary = read_nccl_log_file(log).summary
    assert summary.networks == ("IB",) and summary.nccl_lines == 1


def test_a_log_over_the_size_limit_is_refused_with_how_to_cut_it(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    with log.open("wb") as handle:  # sparse: no disk is used
        handle.truncate(MAX_LOG_BYTES + 1)
    started = time.monotonic()
    line = one_error_line(run_gpufleet("doctor", "nccl-log", str(log), timeout=REFUSAL_LIMIT_S))
    assert time.monotonic() - started < REFUSAL_LIMIT_S
    assert "4 GiB" in line and "grep" in line


def test_a_log_that_grows_past_the_limit_while_read_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "grows.log"
    log.write_bytes(b"h:1:1 [0] NCCL INFO Using network IB\n" * 10)
    with pytest.raises(InputError, match="more than the 100 B read"):  # its size at open: refused unread
        read_nccl_log_file(log, max_bytes=100)
    # the bytes read are counted too: a file within bounds when opened that grows is stopped
    with pytest.raises(FileTooLarge) as grew, open_regular_file(log, 10**6) as handle:
        list(_log_lines(handle, log, 100))
    assert grew.value.grew


#: Python that runs one command and prints the peak memory of that command alone (its only child), in KiB.
PEAK_OF_CHILD = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
                 "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


@pytest.mark.timeout(300)
def test_a_3_gb_sparse_log_is_streamed_in_bounded_memory(tmp_path: Path) -> None:
    log = tmp_path / "sparse.log"
    with log.open("wb") as handle:
        handle.truncate(3 * 10**9)
    probe = subprocess.run([sys.executable, "-c", PEAK_OF_CHILD, *entry_point(), "doctor", "nccl-log", str(log)],
                           capture_output=True, text=True, timeout=240, check=True)
    code, peak_kib = map(int, probe.stdout.split())
    assert code == 2 and "no NCCL log line" in probe.stderr
    assert peak_kib < 500 * 1024, f"{peak_kib / 1024:.0f} MiB"  # it grew past 3 GiB before
