"""nccl.env: only documented variables, each explained, the fabric's transport specifics, readable by bash."""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from emit_specs import spec_from_plan
from gpufleet.catalog.registry import load_catalog
from gpufleet.emit import nccl_env, slurm
from gpufleet.emit.spec import LaunchSpec
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.planner.plan import PlanRequest

DOCUMENTED = Path(__file__).parent / "data" / "nccl_torch_env_documented.txt"


def documented() -> dict[str, str]:
    rows = [line.split("\t") for line in DOCUMENTED.read_text().splitlines() if line and not line.startswith("#")]
    return {name: source for name, source in rows}


@pytest.fixture(scope="module")
def ib() -> LaunchSpec:
    return spec_from_plan(PlanRequest(model="llama3-8b", gpus=64, top=1))


def _on(spec: LaunchSpec, network: str) -> LaunchSpec:
    cluster = spec.cluster
    fabric = Fabric(load_catalog().network(network))
    return replace(spec, cluster=Cluster(cluster.gpu, cluster.node, cluster.gpus, fabric))


@pytest.fixture(scope="module")
def specs(ib: LaunchSpec) -> dict[str, LaunchSpec]:
    nvl72 = spec_from_plan(PlanRequest(model="llama3-70b", gpu="gb200", gpus=144, top=1))
    return {"ib": ib, "roce": _on(ib, "roce400"), "socket": _on(ib, "socket"), "nvl72": nvl72}


def read_with_bash(text: str, tmp_path: Path) -> dict[str, str]:
    """What a shell sees after `set -a; . nccl.env`: the real parser of the file's format."""
    path = tmp_path / "nccl.env"
    path.write_text(text)
    out = subprocess.run(["env", "-i", "bash", "-c", f"set -a; . {path}; env -0"], capture_output=True,
                         check=True).stdout.decode()
    pairs = (entry.split("=", 1) for entry in out.split("\0") if "=" in entry)
    return {k: v for k, v in pairs if k.startswith(("NCCL_", "TORCH_"))}


@pytest.mark.parametrize("kind", ["ib", "roce", "socket", "nvl72"])
def test_every_variable_is_documented_and_explained(specs: dict[str, LaunchSpec], kind: str,
                                                    tmp_path: Path) -> None:
    text = nccl_env.env_file_text(specs[kind])
    names = list(read_with_bash(text, tmp_path))
    assert names and set(names) <= set(documented()), set(names) - set(documented())
    assert "NCCL_TIMEOUT" not in names  # the seeds' invention: the timeout is init_process_group(timeout=)
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if re.match(r"[A-Z_]+=", line):
            assert lines[index - 1].startswith("# ") and len(lines[index - 1]) > 10, line


def test_sbatch_exports_only_documented_nccl_and_torch_names(specs: dict[str, LaunchSpec]) -> None:
    for spec in specs.values():
        exported = re.findall(r"^export ((?:NCCL|TORCH)_[A-Z_]+)=", slurm.sbatch_script(spec), re.M)
        assert exported and set(exported) <= set(documented())


def test_infiniband_names_each_compute_hca(specs: dict[str, LaunchSpec], tmp_path: Path) -> None:
    # DGX H100: 8 ConnectX-7 per host; a GB200 compute tray: 72 NICs / 18 trays = 4
    ib = read_with_bash(nccl_env.env_file_text(specs["ib"]), tmp_path)
    assert ib["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}" for i in range(8))
    assert "NCCL_IB_GID_INDEX" not in ib and "NCCL_IB_DISABLE" not in ib
    tray = read_with_bash(nccl_env.env_file_text(specs["nvl72"]), tmp_path)
    assert tray["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1,mlx5_2,mlx5_3"


def test_roce_selects_the_roce_v2_gid(specs: dict[str, LaunchSpec], tmp_path: Path) -> None:
    roce = read_with_bash(nccl_env.env_file_text(specs["roce"]), tmp_path)
    assert roce["NCCL_IB_GID_INDEX"] == "3"
    assert roce["NCCL_IB_HCA"].startswith("=mlx5_0")


def test_socket_transport_turns_ib_off(specs: dict[str, LaunchSpec], tmp_path: Path) -> None:
    sock = read_with_bash(nccl_env.env_file_text(specs["socket"]), tmp_path)
    assert sock["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in sock
    assert sock["NCCL_SOCKET_IFNAME"] == "^lo,docker"


def test_documented_list_names_its_sources() -> None:
    rows = documented()
    assert all(source.startswith("https://") for source in rows.values())
    assert all(name.startswith(("NCCL_", "TORCH_NCCL_")) for name in rows)
