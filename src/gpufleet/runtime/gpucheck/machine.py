"""What gpu-check runs on: whether a usable NVIDIA GPU is here (nvidia-smi answers and torch sees CUDA), its name,
compute capability and catalog id; and the context every step shares (folders, environment, artifacts)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: nvidia-smi's names (`--query-gpu=name`) -> catalog GPU ids, most specific first; the memory size tells the
#: A100 40/80 GB and H100 80/96 GB apart.
_NAMES: tuple[tuple[str, int | None, str], ...] = (
    ("H200", None, "h200-sxm"), ("H800", None, "h800-sxm"), ("H100 PCIE", None, "h100-pcie"),
    ("H100", 90, "h100-sxm-96gb"), ("H100", None, "h100-sxm"), ("GB200", None, "gb200"), ("B200", None, "b200"),
    ("A100", 60, "a100-sxm-80gb"), ("A100", None, "a100-sxm-40gb"))
#: the catalog GPU the dry path prices against: the GPU this check is written for (it is not measured there)
DRY_STAND_IN_GPU = "h200-sxm"
DETECT_TIMEOUT_S = 60.0


def catalog_gpu_id(name: str, memory_gib: float | None) -> str | None:
    """The catalog id for an nvidia-smi GPU name (None: not in the catalog)."""
    upper = name.upper()
    for needle, min_gib, gpu_id in _NAMES:
        if needle in upper and (min_gib is None or (memory_gib or 0) >= min_gib):
            return gpu_id
    return None


@dataclass(frozen=True)
class Machine:
    hostname: str
    gpu_name: str | None = None
    gpu_count: int = 0
    memory_gib: float | None = None
    capability: tuple[int, int] | None = None
    driver: str | None = None
    catalog_gpu: str | None = None
    why_no_gpu: str | None = None  # None when a GPU is usable

    @property
    def on_gpu(self) -> bool:
        return self.why_no_gpu is None

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "capability": None if self.capability is None else list(self.capability)}


def _nvidia_smi() -> tuple[list[str] | None, str | None]:
    """The first GPU's name, memory.total (MiB), driver, and the GPU count; or why none."""
    if shutil.which("nvidia-smi") is None:
        return None, "no nvidia-smi on PATH (no NVIDIA driver)"
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True,
                              timeout=DETECT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return None, f"nvidia-smi did not answer within {DETECT_TIMEOUT_S:.0f} s"
    rows = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not rows:
        return None, f"nvidia-smi found no GPU: {(done.stderr or done.stdout).strip()[:200]}"
    return [*[cell.strip() for cell in rows[0].split(",")], str(len(rows))], None


_TORCH_PROBE = ("import json, torch; ok = torch.cuda.is_available(); print(json.dumps({'cuda': ok, "
                "'capability': list(torch.cuda.get_device_capability(0)) if ok else None}))")


def detect(env: dict[str, str]) -> Machine:
    """Ask nvidia-smi, then torch in a child process (so this process never holds a CUDA context)."""
    host = socket.gethostname()
    smi, why = _nvidia_smi()
    if smi is None:
        return Machine(hostname=host, why_no_gpu=why)
    name, memory_mib, driver, count = smi
    memory_gib = float(memory_mib) / 1024 if memory_mib.replace(".", "", 1).isdigit() else None
    found = Machine(hostname=host, gpu_name=name, gpu_count=int(count), memory_gib=memory_gib, driver=driver,
                    catalog_gpu=catalog_gpu_id(name, memory_gib))
    try:
        done = subprocess.run([sys.executable, "-c", _TORCH_PROBE], capture_output=True, text=True, env=env,
                              timeout=DETECT_TIMEOUT_S, check=False)
        probe = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError):
        return Machine(**{**asdict(found), "why_no_gpu": "torch could not be asked about CUDA"})
    if not probe["cuda"]:
        return Machine(**{**asdict(found), "why_no_gpu": "nvidia-smi sees a GPU but this torch has no CUDA"})
    return Machine(**{**asdict(found), "capability": tuple(probe["capability"])})


@dataclass
class Context:
    """What the steps share: the output folder, a work folder per step, the child environment, the machine, the
    catalog GPU the figures are compared with, files earlier steps made, and the running step's deadline."""

    out: Path
    env: dict[str, str]
    machine: Machine
    gpu: str  # catalog GPU id (the dry path: DRY_STAND_IN_GPU)
    artifacts: dict[str, Any] = field(default_factory=dict)
    deadline: float = 0.0

    @property
    def dry(self) -> bool:
        return not self.machine.on_gpu

    def work(self, step: str) -> Path:
        folder = self.out / "work" / step
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def left_s(self) -> float:
        return max(self.deadline - time.monotonic(), 0.1)
