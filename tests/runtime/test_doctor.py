"""`gpufleet doctor` on healthy and broken fake nodes (fakenode.py), the real CLI on a fake tree with a fake
nvidia-smi on PATH, and `doctor --cluster` under a real gloo torchrun."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from _torchrun import torchrun_gpufleet
from fakenode import FakeGpu, FakeNode, TiB, snapshot

from clirun import one_error_line, run_gpufleet
from gpufleet.runtime.doctor.checks import CheckResult, NodeReport
from gpufleet.runtime.doctor.cluster import RankReport, find_outliers
from gpufleet.runtime.doctor.node import DoctorRequest, check_node
from gpufleet.runtime.doctor.seams import DiskUsage
from gpufleet.runtime.doctor.system import DiskSpeed

READ_ONLY_COMMANDS = {("nvidia-smi",), ("nvidia-smi", "nvlink", "--status"), ("timedatectl",), ("chronyc",)}


def checks(node: FakeNode, tmp_path: Path, **request: object) -> dict[str, CheckResult]:
    report = check_node(DoctorRequest(checkpoint_path=tmp_path, host="fake", **request),  # type: ignore[arg-type]
                        node.build())
    return {check.id: check for check in report.checks}


def test_a_healthy_node_passes_every_check(tmp_path: Path) -> None:
    node = FakeNode(tmp_path / "node")
    found = checks(node, tmp_path, expected_gpus=8, expected_nic_gbps=400, need_free_bytes=2 * TiB)
    assert {check.status for check in found.values()} == {"ok"}, found
    assert list(found) == ["gpu-count", "ecc", "persistence", "clocks", "nvlink", "rdma-ports", "gdr-module",
                           "nccl-env", "allocator-env", "memlock", "disk-space", "clock-sync"]
    assert found["nvlink"].figures == {"links_up_min": 18}
    assert found["rdma-ports"].figures == {"ports_active": 8, "rate_gbps_min": 400}


def test_doctor_never_changes_the_node_and_only_queries(tmp_path: Path) -> None:
    node = FakeNode(tmp_path / "node", gpus=[FakeGpu(persistence="Disabled") for _ in range(8)], memlock="65536")
    seams = node.build()
    before = snapshot(tmp_path)
    check_node(DoctorRequest(checkpoint_path=tmp_path, expected_gpus=8), seams)
    assert snapshot(tmp_path) == before
    assert {command[:3] if command[1:2] == ("nvlink",) else command[:1] for command in node.commands} \
        <= READ_ONLY_COMMANDS  # never nvidia-smi -pm/-e/-r, never a write


@pytest.mark.parametrize(("broken", "check", "status", "words"), [
    ({"gpus": [FakeGpu() for _ in range(7)]}, "gpu-count", "fail", "7 GPU(s)"),
    ({"gpus": [FakeGpu(uncorrected="2" if i == 3 else "0") for i in range(8)]}, "ecc", "fail", "GPU 3: 2"),
    ({"gpus": [FakeGpu(ecc="Disabled") for _ in range(8)]}, "ecc", "warn", "ECC is off"),
    ({"gpus": [FakeGpu(persistence="Disabled" if i == 0 else "Enabled") for i in range(8)]}, "persistence", "warn",
     "GPU 0"),
    ({"gpus": [FakeGpu(hw_slowdown="Active" if i == 5 else "Not Active") for i in range(8)]}, "clocks", "fail",
     "GPU 5 throttled"),
    ({"gpus": [FakeGpu(app_clock="1410") for _ in range(8)]}, "clocks", "warn", "below 90%"),
    ({"gpus": [FakeGpu(links_down=2 if i == 2 else 0) for i in range(8)]}, "nvlink", "fail", "GPU 2: 2 of 18 down"),
    ({"ib_ports": {"mlx5_0": ("4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)"),
                   "mlx5_1": ("1: DOWN", "3: Disabled", "400 Gb/sec (4X NDR)")}}, "rdma-ports", "fail",
     "mlx5_1/1 (1: DOWN"),
    ({"ib_ports": {"mlx5_0": ("4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)"),
                   "mlx5_1": ("4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)")}}, "rdma-ports", "fail",
     "mlx5_1/1 at 200 Gb/s"),
    ({"modules": ("nvidia", "mlx5_ib")}, "gdr-module", "warn", "nvidia_peermem"),
    ({"environ": {"NCCL_IB_DISABLE": "1"}}, "nccl-env", "fail", "NCCL_IB_DISABLE=1"),
    ({"environ": {"NCCL_SOCKET_IFNAME": "bond9"}}, "nccl-env", "fail", "matches no interface"),
    ({"environ": {"NCCL_ALGO": "Tree"}}, "nccl-env", "warn", "NCCL_ALGO=Tree"),
    ({"environ": {"NCCL_TIMEOUT": "60"}}, "nccl-env", "warn", "NCCL_TIMEOUT is not an NCCL variable"),
    ({"environ": {"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}}, "nccl-ib-hca", "warn", "selects 2 of the node's 8 RDMA ports"),
    ({"environ": {"NCCL_IB_HCA": "=mlx5_9"}}, "nccl-ib-hca", "fail", "falls back to TCP"),
    ({"environ": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segment:True"}}, "allocator-env", "warn",
     "expandable_segment"),
    ({"memlock": "65536"}, "memlock", "fail", "64 KiB"),
    ({"disk": DiskUsage(10 * TiB, TiB // 2)}, "disk-space", "warn", "under 10%"),
    ({"ntp": "no"}, "clock-sync", "fail", "not NTP-synchronised"),
    ({"ntp": None, "chrony_leap": "Not synchronised"}, "clock-sync", "fail", "Not synchronised"),
])
def test_each_broken_part_is_named(tmp_path: Path, broken: dict[str, object], check: str, status: str,
                                   words: str) -> None:
    found = checks(FakeNode(tmp_path / "node", **broken), tmp_path, expected_gpus=8)  # type: ignore[arg-type]
    assert found[check].status == status, found[check]
    assert words in found[check].message
    assert found[check].fix
    others = {name for name, result in found.items() if result.status not in ("ok", "skip") and name != check}
    assert not others, others  # one broken part, one finding


def test_bracketed_allocator_values_and_chrony_and_need_free(tmp_path: Path) -> None:
    node = FakeNode(tmp_path / "node", ntp=None, chrony_leap="Normal", environ={
        "PYTORCH_CUDA_ALLOC_CONF": "roundup_power2_divisions:[256:1,512:2],expandable_segments:True"})
    found = checks(node, tmp_path, need_free_bytes=8 * TiB)
    assert found["allocator-env"].status == "ok" and found["clock-sync"].status == "ok"
    assert found["disk-space"].status == "fail" and "need 8 TiB" in found["disk-space"].message


def test_nccl_names_are_checked_against_nccls_documented_list(tmp_path: Path) -> None:
    # the seed's snippet (seed 000 l.32-39) plus NCCL_TIMEOUT (seed 002 l.124) and a misspelt real name
    env = {"NCCL_IB_GID_INDEX": "3", "NCCL_NTHREADS": "256", "NCCL_IB_SL": "0", "NCCL_IB_QPS_PER_CONNECTION": "8",
           "NCCL_DEBUG": "INFO", "NCCL_TIMEOUT": "60", "NCCL_SOCKET_IFACE": "eth0", "NCCL_ASYNC_ERROR_HANDLING": "1",
           "NCCL_IB_TIMEOUT": "0x14", "NCCL_LL_THRESHOLD": "0"}
    found = checks(FakeNode(tmp_path / "node", environ=env), tmp_path)["nccl-env"]
    assert found.status == "warn"
    by_id: dict[str, list[str]] = {}
    for finding in found.findings:
        by_id.setdefault(finding.id, []).append(finding.message)
    unknown = " ".join(by_id["nccl-env-unknown"])
    assert len(by_id["nccl-env-unknown"]) == 3  # NCCL_TIMEOUT, NCCL_SOCKET_IFACE, NCCL_ASYNC_ERROR_HANDLING
    assert "NCCL_TIMEOUT is not an NCCL variable" in unknown and "init_process_group(timeout" in unknown
    assert "NCCL_SOCKET_IFACE is not an NCCL variable" in unknown and "nearest NCCL variable: NCCL_SOCKET_IFNAME" \
        in unknown
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" in unknown
    # the page's defaults: IB_SL 0 and IB_TIMEOUT 20 (= 0x14) change nothing; 3, 256, 8, INFO are real settings
    assert sorted(by_id["nccl-env-default"]) == ["NCCL_IB_SL=0 is NCCL's default (no effect)",
                                                 "NCCL_IB_TIMEOUT=0x14 is NCCL's default (no effect)"]
    assert by_id["nccl-env-removed"] == ["NCCL_LL_THRESHOLD=0: removed in NCCL 2.5, no effect on a current NCCL"]
    assert "NCCL_IB_SL=0 is NCCL's default" in found.message


def test_documented_real_names_raise_nothing(tmp_path: Path) -> None:
    env = {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7",
           "NCCL_IB_GID_INDEX": "3", "NCCL_DEBUG": "WARN", "NCCL_IB_QPS_PER_CONNECTION": "4"}  # gpufleet's nccl.env
    found = checks(FakeNode(tmp_path / "node", environ=env), tmp_path)
    assert found["nccl-env"].status == "ok" and found["nccl-env"].findings == ()
    assert found["nccl-ib-hca"].status == "ok" and found["nccl-ib-hca"].figures == {"ports_selected": 8,
                                                                                   "ports_present": 8}


def test_ib_hca_ports_prefixes_and_exclusion(tmp_path: Path) -> None:
    ports = {f"mlx5_{i}": ("4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)") for i in (0, 1, 10, 11)}
    for hca, selected in (("mlx5_1", 3),  # a prefix: mlx5_1, mlx5_10, mlx5_11 (NCCL's own warning)
                          ("=mlx5_1", 1), ("^=mlx5_0", 3), ("mlx5_0:1,mlx5_1:1", 4), ("=mlx5_0:2", 0)):
        found = checks(FakeNode(tmp_path / hca, ib_ports=ports, environ={"NCCL_IB_HCA": hca}), tmp_path)
        assert found["nccl-ib-hca"].figures.get("ports_selected") == selected, (hca, found["nccl-ib-hca"])


def test_ib_hca_without_visible_ports_says_it_could_not_check(tmp_path: Path) -> None:
    node = FakeNode(tmp_path / "node", ib_ports={}, environ={"NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1"})
    found = checks(node, tmp_path)["nccl-ib-hca"]
    assert found.status == "skip" and "could not be checked" in found.message and found.fix


@pytest.mark.parametrize(("conf", "default_noted"), [
    ("expandable_segments:False", True), ("expandable_segments:false", True), ("backend:native", True),
    ("expandable_segments:True", False), ("max_split_size_mb:128", False)])
def test_allocator_settings_that_are_pytorchs_default_say_so(tmp_path: Path, conf: str, default_noted: bool) -> None:
    found = checks(FakeNode(tmp_path / "node", environ={"PYTORCH_CUDA_ALLOC_CONF": conf}), tmp_path)["allocator-env"]
    assert found.status == "ok"
    assert ("PyTorch's default: no effect" in found.message) == default_noted


def test_a_cpu_node_skips_what_it_lacks_and_memlock_only_warns(tmp_path: Path) -> None:
    node = FakeNode(tmp_path / "node", gpus=[], ib_ports={}, memlock="8388608")
    found = checks(node, tmp_path)
    assert found["gpu-count"].status == "skip" and found["rdma-ports"].status == "skip"
    assert found["memlock"].status == "warn"  # no RDMA: a small limit hurts nothing yet
    assert "nvlink" not in found
    with_expectation = checks(FakeNode(tmp_path / "node2", gpus=[]), tmp_path, expected_gpus=8)
    assert with_expectation["gpu-count"].status == "fail"


def test_disk_speed_below_the_minimum_fails(tmp_path: Path) -> None:
    found = checks(FakeNode(tmp_path / "node"), tmp_path, measure_disk=lambda path: DiskSpeed(0.4e9, 2e9),
                   min_disk_write_bytes_per_s=1e9)
    assert found["disk-speed"].status == "fail" and found["disk-speed"].figures["write_bytes_per_s"] == 0.4e9


def _rank(rank: int, gemm: float, links: int = 18) -> RankReport:
    report = NodeReport("h", (CheckResult("nvlink", "ok", "", figures={"links_up_min": links}),))
    return RankReport(rank, f"node{rank}", report, {"gemm_flops_per_s": gemm})


def test_outliers_are_figures_far_below_the_median() -> None:
    # medians: gemm (98 + 100) / 2 = 99 -> node3 at 40 is 0.40 of it; links 18 -> node1 at 14 is 0.78
    reports = [_rank(0, 100e12), _rank(1, 98e12, links=14), _rank(2, 102e12), _rank(3, 40e12)]
    found = {(o.label, o.figure): round(o.fraction, 3) for o in find_outliers(reports)}
    assert found == {("node3/rank3", "bench.gemm_flops_per_s"): round(40 / 99, 3),
                     ("node1/rank1", "nvlink.links_up_min"): round(14 / 18, 3)}
    assert find_outliers([_rank(0, 100e12), _rank(1, 85e12)]) == []  # 85 / 92.5 = 0.92: within the band


def _fake_nvidia_smi(folder: Path, node: FakeNode) -> Path:
    folder.mkdir()
    script = folder / "nvidia-smi"
    csv, nvlink = folder / "query.csv", folder / "nvlink.txt"
    csv.write_text(node.nvidia_smi_csv())
    nvlink.write_text(node.nvlink_status())
    script.write_text(f'#!/bin/sh\nif [ "$1" = nvlink ]; then cat {nvlink}; else cat {csv}; fi\n')
    clock = folder / "timedatectl"  # the fake node's clock is synchronised, whatever the test host's is
    clock.write_text("#!/bin/sh\necho yes\n")
    for path in (script, clock):
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder


def test_cli_on_a_broken_fake_node_exits_1_naming_each_failure(tmp_path: Path) -> None:
    node = FakeNode(tmp_path / "node", gpus=[FakeGpu(uncorrected="1" if i == 6 else "0", links_down=1 if i == 6
                                                     else 0) for i in range(8)], memlock="65536")
    node.build()
    bin_dir = _fake_nvidia_smi(tmp_path / "bin", node)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "NCCL_IB_DISABLE": "1"}
    args = ("doctor", "--gpus", "8", "--sysfs-root", str(node.root / "sys"), "--proc-root", str(node.root / "proc"))
    result = run_gpufleet(*args, "--json", env=env)
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert set(data["failed"]) == {"ecc", "nvlink", "nccl-env", "memlock"}
    nccl_env = next(row for row in data["checks"] if row["id"] == "nccl-env")
    assert nccl_env["findings"] == []  # NCCL_IB_DISABLE=1 is a real, non-default setting
    [line] = result.stderr.splitlines()
    assert "4 failed" in line and all(name in line for name in ("ecc", "nvlink", "nccl-env", "memlock"))
    table = run_gpufleet(*args, env=env)
    assert table.returncode == 1 and "GPU 6: 1 of 18 down" in table.stdout


def test_cli_bad_input_is_one_line(tmp_path: Path) -> None:
    assert "--checkpoint-path" in one_error_line(run_gpufleet("doctor", "--need-free", "1TB"))
    assert "byte size" in one_error_line(run_gpufleet("doctor", "--checkpoint-path", str(tmp_path),
                                                      "--need-free", "lots"))
    assert "process group" in one_error_line(run_gpufleet("doctor", "--cluster"))


@pytest.mark.timeout(300)
def test_cluster_gathers_every_rank_under_a_real_torchrun() -> None:
    result = torchrun_gpufleet(3, "doctor", "--cluster", "--no-bench", "--json")
    data = json.loads(result.stdout)
    assert sorted(rank["rank"] for rank in data["ranks"]) == [0, 1, 2]
    assert data["outliers"] == []  # three ranks of one node: the same figures
    failed = {tuple(rank["failed"]) for rank in data["ranks"]}
    assert len(failed) == 1  # one node, one verdict
    # this machine's own checks decide the exit code (a CI host whose clock is not NTP-synchronised fails one)
    assert result.returncode == (1 if failed != {()} else 0), result.stderr[-3000:]


@pytest.mark.timeout(300)
def test_cluster_with_bench_figures_under_a_real_torchrun() -> None:
    result = torchrun_gpufleet(2, "doctor", "--cluster", "--json")
    assert result.returncode in (0, 1), result.stderr[-3000:]  # two processes on 2 shared cores may differ
    data = json.loads(result.stdout)
    assert len(data["ranks"]) == 2
    for rank in data["ranks"]:
        assert rank["figures"]["bench.gemm_flops_per_s"] > 0 and rank["figures"]["bench.memory_bytes_per_s"] > 0
    if result.returncode == 1:  # an outlier (two processes on two shared cores) or a failed check of this host
        assert data["outliers"] or any(rank["failed"] for rank in data["ranks"])
