"""CPU seconds of whole `gpufleet` processes, against the targets of issues 22 and 29.

Each command runs as its own process (the installed console script, output to /dev/null); its CPU time is the
child's user + system time from os.wait4, so start-up, imports, catalog loading and the search all count, and
other processes on a shared machine do not (they still slow it somewhat: the load average is printed).

Two states of the on-disk cache (gpufleet.disk_cache) are measured, each in its own empty $XDG_CACHE_HOME:
  cold  the first run after installing or editing gpufleet or the catalog (nothing cached yet);
  warm  every run after that (the validated catalog and the root help's command list are cached).
The targets are for warm runs. Python's bytecode is compiled by an uncounted first run of each command (into a
temporary PYTHONPYCACHEPREFIX) and read by the counted ones, as for an installed package, even where the
environment sets PYTHONDONTWRITEBYTECODE (this project's shared machines do: every import would then compile).

Run: PYTHONPATH=src .venv/bin/python benchmarks/bench_cli.py [--repeat N] [--only WORD]
(--only plan: just the commands whose line contains WORD.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: (command line, target CPU seconds) — the targets of issue 22, and issue 29's for the two plans: dense 405B on
#: 16,384 H100 within 1 s, the MoE search (DeepSeek-V3 on 2,048 H800 in FP8) within 2 s, printed side by side.
CASES: tuple[tuple[tuple[str, ...], float], ...] = (
    (("--help",), 0.4),
    (("catalog", "show", "llama3-8b"), 0.4),
    (("plan", "-m", "llama3-405b", "-t", "15T", "-g", "h100-sxm", "-n", "16384"), 1.0),
    (("plan", "-m", "deepseek-v3", "-n", "2048", "-g", "h800-sxm", "--precision", "fp8"), 2.0),
)


@dataclass(frozen=True)
class Measured:
    args: tuple[str, ...]
    target_s: float
    cold_s: float
    warm_s: list[float]


def gpufleet_command() -> list[str]:
    script = Path(sys.executable).parent / "gpufleet"
    found = str(script) if script.exists() else shutil.which("gpufleet")
    return [found] if found else [sys.executable, "-m", "gpufleet.cli.main"]


def cpu_seconds(argv: list[str], env: dict[str, str]) -> float:
    """User + system CPU seconds of one child process running argv (its exit status must be 0)."""
    pid = os.fork()
    if pid == 0:  # the child: silence it and become the command
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        try:
            os.execvpe(argv[0], argv, env)
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed (exit {os.waitstatus_to_exitcode(status)})")
    return usage.ru_utime + usage.ru_stime


def measure(args: tuple[str, ...], target_s: float, repeat: int, pycache: Path) -> Measured:
    with tempfile.TemporaryDirectory() as cache_home:
        env = {key: value for key, value in os.environ.items()
               if key not in ("GPUFLEET_CATALOG", "GPUFLEET_NO_CACHE", "PYTHONDONTWRITEBYTECODE")}
        env["PYTHONPYCACHEPREFIX"] = str(pycache)  # bytecode compiled once, as for an installed package
        argv = [*gpufleet_command(), *args]
        cpu_seconds(argv, {**env, "GPUFLEET_NO_CACHE": "1"})  # compiles what this command imports; not counted
        env["XDG_CACHE_HOME"] = cache_home
        cold = cpu_seconds(argv, env)
        warm = [cpu_seconds(argv, env) for _ in range(repeat)]
    return Measured(args, target_s, cold, warm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="warm runs per command (default 5)")
    parser.add_argument("--only", default="", help="only the commands whose line contains this word")
    arguments = parser.parse_args()
    repeat = arguments.repeat
    print(f"load average before: {', '.join(f'{load:.1f}' for load in os.getloadavg())} on {os.cpu_count()} CPUs")
    print(f"{'command':<78} {'cold':>6} {'warm median':>12} {'warm min':>9} {'target':>7}")
    failed = []
    pycache = Path(tempfile.mkdtemp(prefix="gpufleet-bench-pycache-"))
    for args, target_s in CASES:
        if arguments.only not in " ".join(args):
            continue
        found = measure(args, target_s, repeat, pycache)
        median = statistics.median(found.warm_s)
        verdict = "ok" if median <= target_s else "OVER"
        if verdict != "ok":
            failed.append(" ".join(args))
        print(f"gpufleet {' '.join(args):<69} {found.cold_s:>5.2f}s {median:>11.2f}s {min(found.warm_s):>8.2f}s "
              f"{target_s:>6.1f}s {verdict}")
    shutil.rmtree(pycache, ignore_errors=True)
    print(f"load average after: {', '.join(f'{load:.1f}' for load in os.getloadavg())}")
    if failed:
        print(f"over target (warm median): {', '.join(failed)}")


if __name__ == "__main__":
    main()
