"""`gpufleet doctor` for one node: every check in order, read-only, through the seams."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import InputError
from gpufleet.runtime.doctor.checks import CheckResult, NodeReport
from gpufleet.runtime.doctor.gpu import gpu_checks
from gpufleet.runtime.doctor.seams import NodeSeams
from gpufleet.runtime.doctor.system import (
    DiskSpeed,
    allocator_environment,
    clock_sync,
    disk_space,
    disk_speed,
    gdr_module,
    memlock,
    nccl_environment,
    nccl_ib_hca,
    rdma_check,
    rdma_ports,
)


@dataclass(frozen=True)
class DoctorRequest:
    """What to expect of the node; None = only report what is there."""

    expected_gpus: int | None = None
    expected_nic_gbps: float | None = None
    checkpoint_path: Path | None = None
    need_free_bytes: float | None = None
    measure_disk: Callable[[Path], DiskSpeed] | None = None  # None: no disk-speed check (it writes a scratch file)
    min_disk_write_bytes_per_s: float | None = None
    host: str | None = None

    def __post_init__(self) -> None:
        disk = self.need_free_bytes is not None or self.measure_disk or self.min_disk_write_bytes_per_s
        if disk and self.checkpoint_path is None:
            raise InputError("--need-free, --disk-speed and --min-disk-write-gbps need --checkpoint-path DIR")


def check_node(request: DoctorRequest, seams: NodeSeams | None = None) -> NodeReport:
    """Run every check; none of them changes the node."""
    seams = seams or NodeSeams()
    checks: list[CheckResult] = [*gpu_checks(seams, request.expected_gpus)]
    rdma = rdma_check(seams, request.expected_nic_gbps)
    has_rdma = bool(rdma_ports(seams))
    checks += [rdma, gdr_module(seams, has_rdma), nccl_environment(seams, has_rdma)]
    if (hca := nccl_ib_hca(seams)) is not None:  # only when NCCL_IB_HCA is set
        checks.append(hca)
    checks += [allocator_environment(seams), memlock(seams, has_rdma)]
    if request.checkpoint_path is not None:
        space = disk_space(seams, request.checkpoint_path, request.need_free_bytes)
        checks.append(space)
        if request.measure_disk is not None and space.status != "fail":
            checks.append(disk_speed(request.checkpoint_path, request.measure_disk,
                                     request.min_disk_write_bytes_per_s))
    checks.append(clock_sync(seams))
    return NodeReport(request.host or socket.gethostname(), tuple(checks))
