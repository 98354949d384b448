"""Every prediction the step model makes for the shipped, test and vTrain runs and for a few plans, as JSON.

A refactor of the model must leave this output unchanged, float for float:

    python scripts/prediction_snapshot.py --out /tmp/before.json
    ... change the code ...
    python scripts/prediction_snapshot.py --out /tmp/after.json --compare /tmp/before.json

Runs: each run file's predictions as `gpufleet validate` makes them (planner's predict_run), with the layout and
every step part, plus validate's summary. Plans: `gpufleet plan --json` (and a sweep, a deadline, a budget and
`gpufleet cost`) run as whole commands, minus the version header.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"

#: (label, gpufleet arguments) of the commands whose JSON is compared
COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("plan llama3-405b 16384 h100-sxm", ("plan", "-m", "llama3-405b", "-t", "15T", "-n", "16384", "-g", "h100-sxm",
                                         "--top", "5")),
    ("plan llama3-8b 64 h100-sxm", ("plan", "-m", "llama3-8b", "-n", "64", "-g", "h100-sxm", "--top", "5")),
    ("plan deepseek-v3 256 h800-sxm fp8", ("plan", "-m", "deepseek-v3", "-t", "14.8T", "-n", "256", "-g",
                                           "h800-sxm", "--precision", "fp8", "--top", "3")),
    ("plan mixtral-8x7b 64 h100-sxm", ("plan", "-m", "mixtral-8x7b", "-n", "64", "-g", "h100-sxm", "--top", "5")),
    ("plan qwen3-30b-a3b 16 megatron-bridge", ("plan", "-m", "qwen3-30b-a3b", "-n", "16", "-g", "h100-sxm",
                                               "--stack", "megatron-bridge", "--top", "5")),
    ("plan llama3-70b 256 torchtitan", ("plan", "-m", "llama3-70b", "-n", "256", "-g", "h100-sxm", "--stack",
                                        "torchtitan", "--top", "5")),
    ("plan llama3-70b budget", ("plan", "-m", "llama3-70b", "-t", "2T", "-n", "512", "--budget", "5e6")),
    ("plan llama3-70b sweep deadline", ("plan", "-m", "llama3-70b", "-t", "2T", "-n", "256-2048",
                                        "--deadline", "30d")),
    ("cost gpu-hours", ("cost", "--gpu-hours", "1e6", "--gpu", "h100-sxm", "--gpus", "1024")),
)


def _run_files() -> list[tuple[str, Path, list[Path], str | None, dict[str, Any]]]:
    """(label, run file, extra catalogs, node, StepOptions fields) for every run set validate and the tests use."""
    from gpufleet.planner.published_runs import fitted_run_paths, shipped_runs_path

    files: list[tuple[str, Path, list[Path], str | None, dict[str, Any]]] = [
        ("published", shipped_runs_path(), [], None, {}),
        ("vtrain", shipped_runs_path("vtrain_runs.yaml"), [DATA / "vtrain_cluster.yaml"], "vtrain-a100-node",
         {"dp_overlap": False}),
    ]
    files += [(path.stem, path, [], None, {}) for path in fitted_run_paths()[1:]]
    return files


def _step_dict(step: Any) -> dict[str, Any]:
    return {"step_s": step.step_s, "tokens_per_s_per_gpu": step.tokens_per_s_per_gpu, "mfu": step.mfu,
            "hfu": step.hfu, "bubble_fraction": step.bubble_fraction, "micro_batches": step.micro_batches,
            "hardware_flops_per_step_per_gpu": step.hardware_flops_per_step_per_gpu,
            "parts": {name: [part.exposed_s, part.hidden_s, part.link] for name, part in step.parts.items()}}


def run_predictions() -> dict[str, Any]:
    from gpufleet.catalog.registry import load_catalog
    from gpufleet.perf.step import StepOptions
    from gpufleet.planner.published_runs import load_runs
    from gpufleet.planner.ranking import rank_groups
    from gpufleet.planner.validate import predict_run, summarize

    out: dict[str, Any] = {}
    for label, path, catalogs, node, fields in _run_files():
        catalog = load_catalog(catalogs) if catalogs else load_catalog()
        options = StepOptions(**fields)
        runs = load_runs(path)
        predictions = [predict_run(run, catalog, options, node_id=node) for run in runs]
        rows = {}
        for p in predictions:
            row = p.as_dict()
            row["step"] = _step_dict(p.step) if p.step is not None else None
            rows[p.id] = row
        out[label] = {"runs": rows, "summary": _plain(summarize(predictions)),
                      "ranking": _plain(rank_groups(runs, predictions))}
    return out


def _plain(value: Any) -> Any:
    """JSON-ready: dataclasses with as_dict() and plain containers."""
    if hasattr(value, "as_dict"):
        return _plain(value.as_dict())
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def command_outputs() -> dict[str, Any]:
    gpufleet = Path(sys.executable).with_name("gpufleet")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out: dict[str, Any] = {}
    for label, args in COMMANDS:
        done = subprocess.run([str(gpufleet), *args, "--json"], capture_output=True, text=True, env=env, check=False)
        try:
            data = json.loads(done.stdout)
        except json.JSONDecodeError:
            data = {"stdout": done.stdout, "stderr": done.stderr}
        if isinstance(data, dict):
            data.pop("gpufleet_version", None)
        out[label] = {"exit": done.returncode, "json": data}
    return out


def compare(before: Any, after: Any, where: str = "") -> tuple[int, float, list[str]]:
    """(numbers compared, largest relative difference, paths that differ other than by a number)."""
    if isinstance(before, dict) and isinstance(after, dict):
        count, worst, problems = 0, 0.0, []
        for key in sorted(set(before) | set(after)):
            if key not in before or key not in after:
                problems.append(f"{where}/{key}: only in {'after' if key in after else 'before'}")
                continue
            c, w, p = compare(before[key], after[key], f"{where}/{key}")
            count, worst, problems = count + c, max(worst, w), problems + p
        return count, worst, problems
    if isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            return 0, 0.0, [f"{where}: {len(before)} items before, {len(after)} after"]
        count, worst, problems = 0, 0.0, []
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            c, w, p = compare(b, a, f"{where}[{i}]")
            count, worst, problems = count + c, max(worst, w), problems + p
        return count, worst, problems
    numbers = (int, float)
    if isinstance(before, numbers) and isinstance(after, numbers) and not isinstance(before, bool):
        if before == after or (isinstance(before, float) and math.isnan(before) and math.isnan(after)):
            return 1, 0.0, []
        scale = max(abs(before), abs(after))
        return 1, abs(before - after) / scale, [f"{where}: {before!r} -> {after!r}"]
    return 0, 0.0, [] if before == after else [f"{where}: {before!r} -> {after!r}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write the JSON here (default: stdout)")
    parser.add_argument("--compare", type=Path, help="a snapshot to compare with: exit 1 on any difference")
    parser.add_argument("--runs-only", action="store_true", help="only the run predictions (no commands)")
    args = parser.parse_args()
    snapshot = {"runs": run_predictions(), "commands": {} if args.runs_only else command_outputs()}
    text = json.dumps(snapshot, indent=1, sort_keys=True)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    if args.compare:
        before = json.loads(args.compare.read_text(encoding="utf-8"))
        if args.runs_only:
            before["commands"] = {}
        count, worst, problems = compare(before, json.loads(text))
        print(f"{count} numbers compared; largest relative difference {worst:.3g}; {len(problems)} differences",
              file=sys.stderr)
        for problem in problems[:40]:
            print(f"  {problem}", file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
