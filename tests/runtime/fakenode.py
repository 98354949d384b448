"""A fake node for `gpufleet doctor`: a sysfs and procfs tree under a temporary folder and canned answers of the
query commands (nvidia-smi in its --query-gpu CSV and `nvlink --status` formats, timedatectl), healthy by default;
each test breaks one thing."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.runtime.doctor.gpu import GPU_QUERY_FIELDS
from gpufleet.runtime.doctor.seams import CommandResult, DiskUsage, NodeSeams

TiB = 2**40


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    persistence: str = "Enabled"
    ecc: str = "Enabled"
    uncorrected: str = "0"
    app_clock: str = "1980"
    max_clock: str = "1980"
    hw_slowdown: str = "Not Active"
    thermal: str = "Not Active"
    links_down: int = 0


@dataclass
class FakeNode:
    root: Path
    gpus: list[FakeGpu] = field(default_factory=lambda: [FakeGpu() for _ in range(8)])
    nvlinks: int = 18
    ib_ports: dict[str, tuple[str, str, str]] = field(default_factory=lambda: {
        f"mlx5_{i}": ("4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)") for i in range(8)})
    interfaces: tuple[str, ...] = ("lo", "eth0", "ib0")
    modules: tuple[str, ...] = ("nvidia", "nvidia_uvm", "nvidia_peermem", "mlx5_ib", "ib_core")
    memlock: str = "unlimited"
    environ: dict[str, str] = field(default_factory=lambda: {
        "NCCL_SOCKET_IFNAME": "eth0", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    ntp: str | None = "yes"  # timedatectl's answer; None: not installed
    chrony_leap: str | None = None  # chronyc's Leap status; None: not installed
    disk: DiskUsage = field(default_factory=lambda: DiskUsage(10 * TiB, 6 * TiB))
    commands: list[tuple[str, ...]] = field(default_factory=list)

    def nvidia_smi_csv(self) -> str:
        return "".join(
            ", ".join([str(i), g.name, g.persistence, g.ecc, g.uncorrected, g.app_clock, g.max_clock, g.hw_slowdown,
                       g.thermal]) + "\n" for i, g in enumerate(self.gpus))

    def nvlink_status(self) -> str:
        lines = []
        for i, gpu in enumerate(self.gpus):
            lines.append(f"GPU {i}: {gpu.name} (UUID: GPU-{i:08d}-0000-0000-0000-000000000000)")
            lines += [f"\t Link {link}: " + ("<inactive>" if link < gpu.links_down else "26.562 GB/s")
                      for link in range(self.nvlinks)]
        return "\n".join(lines) + "\n"

    def run(self, argv: Sequence[str]) -> CommandResult:
        self.commands.append(tuple(argv))
        if argv[0] == "nvidia-smi":
            if not self.gpus:
                return CommandResult(found=False)
            if argv[1:3] == ["nvlink", "--status"]:
                return CommandResult(True, 0, self.nvlink_status())
            assert argv[1] == f"--query-gpu={','.join(GPU_QUERY_FIELDS)}"
            return CommandResult(True, 0, self.nvidia_smi_csv())
        if argv[0] == "timedatectl":
            return CommandResult(found=False) if self.ntp is None else CommandResult(True, 0, self.ntp + "\n")
        if argv[0] == "chronyc":
            if self.chrony_leap is None:
                return CommandResult(found=False)
            return CommandResult(True, 0, f"Reference ID    : 0A000001 (ntp1)\nLeap status     : {self.chrony_leap}\n")
        return CommandResult(found=False)

    def build(self) -> NodeSeams:
        sysfs, proc = self.root / "sys", self.root / "proc"
        for device, (state, phys, rate) in self.ib_ports.items():
            port = sysfs / "class" / "infiniband" / device / "ports" / "1"
            port.mkdir(parents=True)
            for name, value in (("state", state), ("phys_state", phys), ("rate", rate), ("link_layer", "InfiniBand")):
                (port / name).write_text(value + "\n")
        for interface in self.interfaces:
            (sysfs / "class" / "net" / interface).mkdir(parents=True)
        (proc / "self").mkdir(parents=True)
        (proc / "modules").write_text("".join(f"{name} 16384 0 - Live 0xffffffffc0000000\n" for name in self.modules))
        (proc / "self" / "limits").write_text(
            "Limit                     Soft Limit           Hard Limit           Units     \n"
            "Max open files            1048576              1048576              files     \n"
            f"Max locked memory         {self.memlock:<20} {self.memlock:<20} bytes     \n")
        return NodeSeams(sysfs_root=sysfs, proc_root=proc, environ=dict(self.environ), run=self.run,
                         disk_usage=lambda path: self.disk)


def snapshot(root: Path) -> dict[str, tuple[bytes, float, int]]:
    """Every file's bytes, mtime and mode under `root` (to show a doctor run changed nothing)."""
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            info = path.stat()
            found[str(path)] = (path.read_bytes(), info.st_mtime, stat.S_IMODE(info.st_mode))
    return found
