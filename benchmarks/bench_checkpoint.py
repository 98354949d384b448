"""Checkpoint benchmark: training stall of an async save vs a blocking torch.save, and write/read
throughput vs raw sequential disk I/O, measured side by side in one run on the same disk.

    .venv/bin/python benchmarks/bench_checkpoint.py [--size-gib 2] [--dir /tmp] [--repeats 2]

Prints `name=value` lines: stall_ratio (async stall / blocking torch.save with fsync; target <= 0.05),
write_ratio (checkpoint bytes/s / `dd conv=fsync` bytes/s; target >= 0.85), read_ratio (restore
bytes/s / raw sequential read bytes/s; target >= 0.85), and the raw figures behind them. Page cache
is dropped before reads when the process may (root); otherwise reads are warm for both sides alike.

What each ratio includes: the checkpoint write time is DCP writing every shard (WRITE_THREADS files per
rank, each fsynced), the xxh3-128 of every file (hashed as the bytes are written, no read-back), the
gather, the manifest (temp + fsync + rename), the directory rename and its fsyncs and the `latest`
pointer, i.e. everything until the save is durable; retention (deleting older checkpoints) comes after
and is printed apart as retain_s. The restore time is `load_latest()` whole: listing, manifest and size
checks, reading and checksumming every file (cold), and DCP loading into an untouched `empty_like`
template (the kernel zero-fills its pages on first touch). Both baselines are single-stream: `dd` of
zeros with 8 MiB blocks and `conv=fsync`, and an 8 MiB unbuffered read loop.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from gpufleet.runtime.checkpoint import CheckpointManager


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def state_dict(total_bytes: int) -> dict[str, torch.Tensor]:
    layers = 16
    per_layer = total_bytes // layers // 4
    return {f"layer{i}.weight": torch.randn(per_layer) for i in range(layers)}


def blocking_save_s(state: dict[str, torch.Tensor], path: Path) -> float:
    start = time.perf_counter()
    with open(path, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    return time.perf_counter() - start


def dd_write_bytes_per_s(path: Path, total_bytes: int) -> float:
    block = 8 * 2**20
    start = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", f"bs={block}", f"count={total_bytes // block}",
                    "conv=fsync", "status=none"], check=True)
    return total_bytes / (time.perf_counter() - start)


def raw_read_bytes_per_s(path: Path) -> float:
    drop_caches()
    start = time.perf_counter()
    size = 0
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(8 * 2**20):
            size += len(chunk)
    return size / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gib", type=float, default=2.0)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    total_bytes = int(args.size_gib * 2**30)
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-", dir=args.dir))
    try:
        state = state_dict(total_bytes)
        size_bytes = sum(t.numel() * t.element_size() for t in state.values())
        blocking = min(blocking_save_s(state, work / "blocking.pt") for _ in range(args.repeats))
        (work / "blocking.pt").unlink()

        manager = CheckpointManager(work / "ckpt", keep_last=1)
        stalls, writes, retains = [], [], []
        for step in range(args.repeats + 1):  # the first save allocates the reusable buffers
            start = time.perf_counter()
            manager.save(state, step)
            stall_s = time.perf_counter() - start
            manager.wait()
            stats = manager.last_stats
            if step > 0 and stats is not None:
                stalls.append(stall_s)
                writes.append(stats.write_s + stats.commit_s)
                retains.append(stats.retain_s)
        write_bps = size_bytes / min(writes)

        dd_bps = max(dd_write_bytes_per_s(work / "dd.bin", size_bytes) for _ in range(args.repeats))
        raw_read_bps = raw_read_bytes_per_s(work / "dd.bin")
        (work / "dd.bin").unlink()
        template = {k: torch.empty_like(v) for k, v in state.items()}
        cold = drop_caches()
        start = time.perf_counter()
        manager.load_latest(template)
        read_bps = size_bytes / (time.perf_counter() - start)
        manager.close()

        print(f"size_bytes={size_bytes}")
        print(f"blocking_save_s={blocking:.3f}")
        print(f"async_stall_s={min(stalls):.4f}")
        print(f"stall_ratio={min(stalls) / blocking:.4f}")
        print(f"checkpoint_write_bytes_per_s={write_bps:.3e}")
        print(f"retain_s={min(retains):.3f}")
        print(f"dd_fsync_write_bytes_per_s={dd_bps:.3e}")
        print(f"write_ratio={write_bps / dd_bps:.3f}")
        print(f"restore_bytes_per_s={read_bps:.3e}")
        print(f"raw_read_bytes_per_s={raw_read_bps:.3e}")
        print(f"read_ratio={read_bps / raw_read_bps:.3f}")
        print(f"cold_cache_reads={cold}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
