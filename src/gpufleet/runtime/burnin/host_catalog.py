"""A host's measurements as catalog records: a "GPU" (the rank's share of the host), a node, a network and a
calibration profile, plus the burn-in model, in the shape of the built-in YAML files, so that `gpufleet plan
--catalog host.yaml` prices the burn-in on the very machine that measured it. No torch here.

How each measured figure maps onto the records (every mapping is a judgement, said in the record's `source`):
* dense bf16 peak = the best rate of any GEMM measured (a large square one and the model's own);
  gemm_fraction_16bit = 1 (the peak is already achieved, not a datasheet figure); gemm_half_dim = the d½ of the
  compute model's shape curve Π d/(d + d½) that gives the model's own GEMMs (forward and both backward ones) their
  measured total time;
* attention_fraction = measured causal attention FLOP/s (forward + backward) / that peak (capped at 1);
* "HBM" bandwidth = the bandwidth with which the compute model's element-wise bytes take the measured time of the
  block's element-wise kernels, forward and backward, with hbm_fraction = 1;
* scale-up link = the slower of the measured all-gather and reduce-scatter bus bandwidths, achievable_fraction = 1
  (the ranks share one host, so every collective stays "inside the node");
* in_training_fraction = 1: the measurements ran with every rank busy at once, and a CPU has no separate copy or
  communication engines whose contention the GPU default (0.87) stands for;
* collectives (the calibration's measured points) = the all-gather and reduce-scatter as FSDP2 runs them: the time
  FSDP2 adds to one block per micro-batch (two all-gathers, one reduce-scatter, buffer copies, hooks) against the
  bare collectives' time for the same, 2·all-gather + reduce-scatter; each bare bus bandwidth divided by that
  ratio (the extra is shared in proportion: it is bytes copied, and both move bytes);
* optimizer_s_per_param = the burn-in's AdamW step over its sharded parameters / local parameters;
* checkpoint_write_gbytes_per_s = the slowest rank's fsync'd write x ranks (all ranks wrote their shards at once).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from gpufleet.runtime.burnin.config import ModelShape

HOST_GPU_ID = "this-host"
HOST_NODE_ID = "this-host-node"
HOST_NETWORK_ID = "this-host-loopback"
#: Candidate half dimensions for the shape-curve fit: 1 .. 8192 in quarter-octave steps (a grid, not a tuned value).
HALF_DIM_GRID = tuple(sorted({max(1, round(2 ** (i / 4))) for i in range(0, 53)}))


@dataclass(frozen=True)
class HostMeasurement:
    """What the host achieved, SI units; `gemm_shapes` are (m, n, k, count per step, flop_per_s) at the model's
    sizes; `peak_gemm_flop_per_s` is the best rate of any GEMM measured."""

    hostname: str
    cpu: str
    ranks: int
    threads_per_rank: int
    peak_gemm_flop_per_s: float
    gemm_shapes: tuple[tuple[int, int, int, int, float], ...]
    attention_flop_per_s: float
    elementwise_bytes_per_s: float
    allgather_busbw_bytes_per_s: float
    reduce_scatter_busbw_bytes_per_s: float
    disk_write_bytes_per_s: float
    disk_read_bytes_per_s: float
    ram_bytes: float
    date: str
    clock: str = "wall"  # what the kernels were timed with: wall seconds or the process's CPU seconds
    fsdp_block_comm_s: float = 0.0  # FSDP2's collectives, copies and hooks for one block, per micro-batch (0: none)
    optimizer_s_per_param: float | None = None  # the optimizer step per local parameter
    block_params: int = 0  # parameters of one block, as the collectives move them
    rounds: int = 1  # measurement rounds between training steps; each figure is the median over them

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        return (f"{self.hostname}: {self.ranks} ranks x {self.threads_per_rank} threads, median of {self.rounds} "
                f"round(s); bf16 GEMM peak "
                f"{self.peak_gemm_flop_per_s / 1e9:.1f} GFLOP/s, attention {self.attention_flop_per_s / 1e9:.1f} "
                f"GFLOP/s, element-wise {self.elementwise_bytes_per_s / 1e9:.1f} GB/s, all-gather "
                f"{self.allgather_busbw_bytes_per_s / 1e9:.2f} GB/s bus, reduce-scatter "
                f"{self.reduce_scatter_busbw_bytes_per_s / 1e9:.2f} GB/s bus, disk write "
                f"{self.disk_write_bytes_per_s / 1e9:.2f} GB/s, read {self.disk_read_bytes_per_s / 1e9:.2f} GB/s; "
                f"FSDP2 adds {self.fsdp_block_comm_s * 1e3:.2f} ms per block per micro-batch; optimizer "
                f"{(self.optimizer_s_per_param or 0) * 1e9:.2f} ns per parameter")



def fit_half_dim(peak_flop_per_s: float, shapes: tuple[tuple[int, int, int, int, float], ...]) -> int:
    """The d½ of the compute model's shape curve Π d/(d + d½) with which the step's GEMMs (m, n, k, count, measured
    FLOP/s) take the time they took in total, to the nearest point of HALF_DIM_GRID (the total, not each shape:
    what a step costs is the sum, and a CPU's per-shape rates need not follow the curve)."""
    measured_s = sum(count * 2 * m * n * k / rate for m, n, k, count, rate in shapes)

    def curve_s(half: int) -> float:
        return sum(count * 2 * m * n * k / (peak_flop_per_s * (m / (m + half)) * (n / (n + half)) * (k / (k + half)))
                   for m, n, k, count, _ in shapes)

    return min(HALF_DIM_GRID, key=lambda half: abs(math.log(curve_s(half) / measured_s)))


def _vendor(cpu: str) -> str:
    """GPUSpec.vendor knows nvidia, amd and intel only: the CPU's maker, intel for any other (the field has no
    "other"; it labels the record and changes no estimate)."""
    lowered = cpu.lower()
    if "amd" in lowered or "epyc" in lowered or "ryzen" in lowered:
        return "amd"
    if "nvidia" in lowered or "grace" in lowered:
        return "nvidia"
    return "intel"


def _link_bytes_per_s(measured: HostMeasurement) -> float:
    """The slower of the measured all-gather and reduce-scatter bus bandwidths. One rank moves nothing between ranks
    (bus bandwidth 0 by nccl-tests' definition): the element-wise bandwidth stands in, a placeholder that a one-rank
    plan never uses (it has no collective to price) but that keeps the link a positive number, as the catalog needs."""
    if measured.ranks < 2:
        return measured.elementwise_bytes_per_s
    return min(measured.allgather_busbw_bytes_per_s, measured.reduce_scatter_busbw_bytes_per_s)


def host_records(measured: HostMeasurement, shape: ModelShape) -> dict[str, list[dict[str, Any]]]:
    """The catalog entries (kind -> records) that describe this host and the burn-in model."""
    measured_on = (f"measured by `gpufleet burnin --measure-host` on {measured.hostname} ({measured.cpu}), "
                   f"{measured.ranks} ranks x {measured.threads_per_rank} threads, {measured.clock} clock, "
                   f"median of {measured.rounds} round(s) between training steps, {measured.date}")
    link_bytes_per_s = _link_bytes_per_s(measured)
    peak = measured.peak_gemm_flop_per_s
    gpu = {"id": HOST_GPU_ID, "name": f"one rank's share of {measured.hostname}", "vendor": _vendor(measured.cpu),
           "dense_tflops": {"bf16": peak / 1e12},
           "hbm_gib": measured.ram_bytes / measured.ranks / 2**30, "hbm_tbps": measured.elementwise_bytes_per_s / 1e12,
           "scale_up": {"kind": "switched", "gbytes_per_s_per_direction": link_bytes_per_s / 1e9,
                        "domain_gpus": measured.ranks, "achievable_fraction": 1.0},
           "tdp_w": 1.0, "source": measured_on,
           "note": "bf16 peak = the best GEMM rate measured; hbm_tbps = element-wise kernels' bytes/s; scale-up = the "
                   "slower of the all-gather and reduce-scatter bus bandwidths (one rank: a placeholder, the "
                   "element-wise bandwidth); memory = RAM / ranks; tdp_w is a placeholder (not measured: power and "
                   "cost figures for this host mean nothing)"}
    node = {"id": HOST_NODE_ID, "name": f"{measured.hostname} as {measured.ranks} ranks", "gpu": HOST_GPU_ID,
            "gpus": measured.ranks, "nics": 1, "nic_gbps": link_bytes_per_s * 8 / 1e9,
            "default_network": HOST_NETWORK_ID, "cpu_ram_gib": measured.ram_bytes / 2**30, "max_power_w": 1.0,
            "rack_units": 1, "source": measured_on,
            "note": f"checkpoint disk: write {measured.disk_write_bytes_per_s / 1e9:.3f} GB/s with fsync, read "
                    f"{measured.disk_read_bytes_per_s / 1e9:.3f} GB/s; power a placeholder"}
    network = {"id": HOST_NETWORK_ID, "name": "loopback sockets (gloo)", "kind": "socket",
               "link_gbps": link_bytes_per_s * 8 / 1e9, "achievable_fraction": 1.0, "switch_radix": 2,
               "hop_latency_s": 1e-6, "endpoint_latency_s": 1e-5,
               "source": measured_on + "; one host: no traffic leaves it, latencies are unused placeholders"}
    half = fit_half_dim(peak, measured.gemm_shapes)
    calibration: dict[str, Any] = {"id": HOST_GPU_ID, "gemm_fraction_16bit": 1.0,
                   "attention_fraction": min(1.0, measured.attention_flop_per_s / peak), "hbm_fraction": 1.0,
                   "in_training_fraction": 1.0, "gemm_half_dim": half, "source": measured_on,
                   "note": "shape curve fitted to the burn-in model's GEMM shapes "
                           + ", ".join(f"{m}x{n}x{k} {rate / 1e9:.1f} GFLOP/s" for m, n, k, _, rate in
                                       measured.gemm_shapes)}
    calibration["checkpoint_write_gbytes_per_s"] = measured.disk_write_bytes_per_s * measured.ranks / 1e9
    if measured.optimizer_s_per_param is not None:
        calibration["optimizer_s_per_param"] = measured.optimizer_s_per_param
    calibration["collectives"] = fsdp_collectives(measured)
    return {"gpus": [gpu], "nodes": [node], "networks": [network], "calibrations": [calibration],
            "models": [shape.model_record()]}


def fsdp_collectives(measured: HostMeasurement) -> list[dict[str, Any]]:
    """The all-gather (bf16) and reduce-scatter (fp32) of one block at the bus bandwidths FSDP2 achieved with them
    (module docstring); none when FSDP2's extra time was not measured."""
    n = measured.ranks
    if measured.fsdp_block_comm_s <= 0 or measured.block_params <= 0 or n < 2:
        return []
    factor = (n - 1) / n
    gather_bytes, reduce_bytes = 2 * measured.block_params, 4 * measured.block_params
    bare_s = (2 * gather_bytes * factor / measured.allgather_busbw_bytes_per_s
              + reduce_bytes * factor / measured.reduce_scatter_busbw_bytes_per_s)
    ratio = measured.fsdp_block_comm_s / bare_s
    return [{"op": op, "size_bytes": size, "ranks": n, "ranks_per_node": n, "busbw_gbytes_per_s": busbw / ratio / 1e9}
            for op, size, busbw in (("all-gather", gather_bytes, measured.allgather_busbw_bytes_per_s),
                                    ("reduce-scatter", reduce_bytes, measured.reduce_scatter_busbw_bytes_per_s))]


def write_host_catalog(path: Path, measured: HostMeasurement, shape: ModelShape) -> None:
    """The records as a user catalog file (`--catalog FILE`), the raw measurements in a comment above them."""
    raw = yaml.safe_dump({"measured": measured.as_dict()}, sort_keys=False)
    header = "".join(f"# {line}\n" for line in raw.splitlines())
    body = yaml.safe_dump(host_records(measured, shape), sort_keys=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# gpufleet burn-in host catalog ({re.sub(r'[^ -~]', '?', measured.hostname)})\n"
                    + header + body, encoding="utf-8")
