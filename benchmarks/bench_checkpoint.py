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
checks, and reading every shard once (cold), each file front to back by its own thread, hashing every
byte as it arrives and comparing each file's xxh3-128 at its end, with contiguous tensors read straight into
the template. read_ratio loads into an initialised template (`zeros_like`: a resume loads into a model and
optimizer that are already built, so their pages exist); read_ratio_untouched_template loads into
`empty_like`, whose pages the kernel zero-fills on first touch (printed apart, not hidden). Each repeat
measures the raw read and both restores side by side; the best of each is reported. Both write baselines
are single-stream: `dd` of zeros with 8 MiB blocks and `conv=fsync`, and an 8 MiB unbuffered read loop.
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
        raw_reads: list[float] = []
        restores: list[float] = []
        restores_untouched: list[float] = []
        cold = True
        for _ in range(args.repeats):  # side by side, each repeat: raw read, then both restores
            raw_reads.append(raw_read_bytes_per_s(work / "dd.bin"))
            for untouched, results in ((False, restores), (True, restores_untouched)):
                # A resume loads into a model and optimizer that are already built and initialised, so the
                # template's pages exist; `empty_like` (pages the kernel must still zero on first touch)
                # is measured too and printed apart.
                template = {k: torch.empty_like(v) if untouched else torch.zeros_like(v) for k, v in state.items()}
                cold = drop_caches() and cold
                start = time.perf_counter()
                manager.load_latest(template)
                results.append(size_bytes / (time.perf_counter() - start))
                del template
        (work / "dd.bin").unlink()
        raw_read_bps, read_bps, untouched_bps = max(raw_reads), max(restores), max(restores_untouched)
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
        print(f"restore_untouched_template_bytes_per_s={untouched_bps:.3e}")
        print(f"read_ratio_untouched_template={untouched_bps / raw_read_bps:.3f}")
        print(f"cold_cache_reads={cold}")
        print("read_ratio_template=initialised (zeros_like, as a resume into a built model); "
              "read_ratio_untouched_template uses empty_like")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
