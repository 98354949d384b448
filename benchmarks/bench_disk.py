"""`gpufleet bench disk` vs `dd conv=fsync` on the same file size and disk, side by side.

    .venv/bin/python benchmarks/bench_disk.py [--size 1GiB] [--dir /tmp] [--repeats 3]

Prints `name=value` lines: write_ratio (bench disk's fsync'd write bytes/s / `dd if=/dev/zero bs=8M
conv=fsync` bytes/s; target >= 0.9) and the raw figures. Both sides write the same size with 8 MiB blocks and
count until fsync returns; dd writes zeros, bench disk random bytes (what a checkpoint looks like to a
compressing store). Best of --repeats for each side, interleaved so that both see the same disk state.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from gpufleet.runtime.bench.disk import DEFAULT_BLOCK_BYTES, bench_disk
from gpufleet.units import parse_bytes


def dd_write_s(folder: Path, size_bytes: int) -> float:
    target = folder / "dd-bench.tmp"
    count = size_bytes // DEFAULT_BLOCK_BYTES
    start = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=8M", f"count={count}", "conv=fsync"],
                   check=True, capture_output=True)
    elapsed = time.perf_counter() - start
    target.unlink()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    size = int(parse_bytes(args.size)) // DEFAULT_BLOCK_BYTES * DEFAULT_BLOCK_BYTES
    folder = Path(args.dir)
    ours, dd = [], []
    for _ in range(args.repeats):
        ours.append(bench_disk(folder, (size,))[0].write_s)
        dd.append(dd_write_s(folder, size))
    ours_bps, dd_bps = size / min(ours), size / min(dd)
    print(f"size_bytes={size}")
    print(f"bench_disk_write_bytes_per_s={ours_bps:.4g}")
    print(f"dd_fsync_write_bytes_per_s={dd_bps:.4g}")
    print(f"write_ratio={ours_bps / dd_bps:.3f}")
    print(f"cpus={os.cpu_count()}")


if __name__ == "__main__":
    main()
