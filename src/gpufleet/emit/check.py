"""`launch --check`: are existing launch files consistent? Degrees against the GPU count, batch arithmetic, whole
micro-batches, the frameworks' own key sets and parsers, and (with a model) memory fit, step time and MFU. All but
the frameworks' own checks need no framework; those that did not run (a framework's extra is not installed) are
reported as skipped, one line per framework naming the extra that runs them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from gpufleet.catalog.registry import Catalog
from gpufleet.emit.read import ReadConfig, Skipped, read_file
from gpufleet.errors import GpufleetError, InputError, LayoutError


@dataclass
class CheckReport:
    files: list[ReadConfig]
    gpus: int | None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    expected: dict[str, Any] | None = None

    @property
    def skipped(self) -> dict[Skipped, list[str]]:
        """Each framework's skipped checks (one per framework and cause) -> the files they were skipped on."""
        grouped: dict[Skipped, list[str]] = {}
        for item in self.files:
            for skip in item.skipped:
                grouped.setdefault(skip, []).append(item.path.name)
        return grouped

    def skipped_lines(self) -> list[str]:
        return [skip.line(files) for skip, files in self.skipped.items()]

    def as_dict(self) -> dict[str, Any]:
        return {"files": [{"path": str(f.path), "kind": f.kind, "degrees": f.degrees, "micro_batch": f.micro_batch,
                           "global_batch": f.global_batch, "gradient_accumulation": f.gradient_accumulation,
                           "gpus": f.gpus, "sharding": f.sharding, "precision": f.precision} for f in self.files],
                "gpus": self.gpus, "consistent": not self.problems, "problems": self.problems, "notes": self.notes,
                "skipped": [skip.as_dict(files) for skip, files in self.skipped.items()],
                "expected": self.expected}

    def render(self, console: Console) -> None:
        for item in self.files:
            stated = ", ".join(f"{k} {v}" for k, v in item.degrees.items()) or "no degrees stated"
            if item.kind == "fsdp":  # what an FSDP dict states instead
                stated += f", sharding {item.sharding or '?'}, precision {item.precision or 'not set'}"
            console.print(f"{item.path} ({item.kind}): {stated}")
        for note in self.notes:
            console.print(f"  note: {note}")
        for problem in self.problems:
            console.print(f"  [red]problem:[/red] {problem}")
        if self.expected:
            e = self.expected
            console.print(f"expected on {e['gpus']} x {e['gpu']}: {e['peak_memory_bytes'] / 2**30:.1f} GiB of "
                          f"{e['hbm_bytes'] / 2**30:.0f} GiB per GPU, step {e['step_s']:.2f} s{_band(e)}, "
                          f"MFU {e['mfu']:.1%}")
            if e["bubble_fraction"] > 0:
                console.print(f"pipeline bubble {e['parts_s'].get('bubble', 0.0):.2f} s = {e['bubble_fraction']:.1%} "
                              f"of the step ({e['micro_batches']} micro-batches; --json: expected.parts_s)")
        for line in self.skipped_lines():
            console.print(f"  skipped: {line}", soft_wrap=True)  # one line: its pip command copies whole
        if not self.problems:
            console.print("[green]consistent[/green]" + (" in what was checked" if self.skipped else ""))


def _merged(files: list[ReadConfig], report: CheckReport) -> dict[str, int]:
    """One value per degree across the files; a degree two files state differently is a problem."""
    merged: dict[str, int] = {}
    for item in files:
        for degree, value in item.degrees.items():
            if degree in merged and merged[degree] != value:
                report.problems.append(f"{degree} is {merged[degree]} in one file and {value} in {item.path.name}")
            merged.setdefault(degree, value)
    return merged


def _gpu_count(files: list[ReadConfig], gpus: int | None, report: CheckReport) -> int | None:
    implied = [(item.gpus, item.path.name) for item in files if item.gpus is not None]
    for count, name in implied:
        if gpus is not None and count != gpus:
            report.problems.append(f"{name} asks for {count:,} GPUs, not the {gpus:,} given (--gpus)")
    return gpus if gpus is not None else (implied[0][0] if implied else None)


def _refuse_degrees_below_one(files: list[ReadConfig]) -> None:
    """A parallel degree is a count of GPUs: one below 1 (tp -8, pp 0) is not a layout to check but a file to fix,
    refused in one line naming the file and the degree."""
    for item in files:
        for degree, value in item.degrees.items():
            if value < 1:
                raise InputError(f"{item.path.name}: {degree} is {value}; a parallel degree is a whole number of at "
                                 "least 1")


def _check_degrees(degrees: dict[str, int], gpus: int | None, report: CheckReport) -> int | None:
    """The data-parallel size: stated, or what the GPU count leaves; a product that misses the count is a problem."""
    model_parallel = degrees.get("tp", 1) * degrees.get("pp", 1) * degrees.get("cp", 1)
    if gpus is None:
        if "dp" not in degrees:
            report.notes.append("degrees not checked against a GPU count: give --gpus (or an sbatch script)")
        return degrees.get("dp")
    if "dp" in degrees:
        product = model_parallel * degrees["dp"]
        if product != gpus:
            terms = " × ".join(f"{name} {degrees.get(name, 1):,}" for name in ("dp", "pp", "tp", "cp"))
            report.problems.append(f"degrees multiply to {product:,} GPUs ({terms}), not {gpus:,}")
        return degrees["dp"]
    if gpus % model_parallel:
        report.problems.append(f"tp × pp × cp = {model_parallel} does not divide the {gpus:,} GPUs")
        return None
    return gpus // model_parallel


def _check_batch(item: ReadConfig, dp: int | None, report: CheckReport) -> None:
    """global = micro × accumulation × dp exactly, with a whole micro-batch."""
    batch, micro, accumulation = item.global_batch, item.micro_batch, item.gradient_accumulation
    if batch is None or dp is None:
        return
    name = item.path.name
    if micro is None and accumulation is not None:
        implied = batch / (accumulation * dp)
        if implied != int(implied):
            report.problems.append(f"{name}: the micro-batch per GPU works out to {batch:,} / ({accumulation} × "
                                   f"{dp:,} dp) = {implied:g}, not a whole number")
    elif micro is not None and accumulation is None:
        implied = batch / (micro * dp)
        if implied != int(implied) or implied < 1:
            report.problems.append(f"{name}: gradient accumulation works out to {batch:,} / ({micro:g} × {dp:,} dp) "
                                   f"= {implied:g}, not a whole number of micro-batches")
    elif micro is not None and accumulation is not None and micro * accumulation * dp != batch:
        report.problems.append(f"{name}: batch {batch:,} ≠ micro {micro:g} × accumulation {accumulation} × dp "
                               f"{dp:,} = {micro * accumulation * dp:,g}")
    if micro is not None and micro != int(micro):
        report.problems.append(f"{name}: micro-batch {micro:g} is not a whole number")


def _check_placement(files: list[ReadConfig], degrees: dict[str, int], report: CheckReport) -> None:
    """Slurm's --distribution against the plan's rank order: gpufleet places consecutive ranks on one node (tensor
    parallelism innermost, on NVLink), which is Slurm's block distribution. cyclic deals consecutive ranks to
    different nodes; plane=N keeps N together."""
    tp = degrees.get("tp", 1)
    for item in files:
        together, per_node = item.ranks_per_node_block, item.tasks_per_node
        if item.kind != "sbatch" or item.distribution is None or together is None:
            continue
        if per_node is None:
            if together == 1:
                report.notes.append(f"{item.path.name}: --distribution={item.distribution} not checked: no "
                                    "--ntasks-per-node (with one task per GPU it puts consecutive ranks on different "
                                    "nodes)")
            continue
        if per_node <= 1 or together >= per_node:
            continue  # one task per node (torchrun numbers the GPUs), or block
        where = (f"--distribution={item.distribution} keeps {together} consecutive rank(s) on a node of "
                 f"{per_node} tasks")
        if together % tp:
            report.problems.append(f"{item.path.name}: {where}, so each tensor-parallel group of {tp} spans more "
                                   "than one node and rides the network, not NVLink; use --distribution=block (the "
                                   "plan's rank order)")
        elif tp == 1 and together == 1:
            report.problems.append(f"{item.path.name}: {where}: consecutive ranks on different nodes, not the block "
                                   "order gpufleet's plans assume (pipeline and data-parallel neighbours on one "
                                   "node); use --distribution=block")
        else:
            report.notes.append(f"{item.path.name}: {where}: tensor-parallel groups of {tp} stay in a node, but the "
                                "rank order is not the block order the plan's other groups assume")


def _torchtitan_dims(files: list[ReadConfig], gpus: int | None, report: CheckReport) -> None:
    from gpufleet.emit.read_torchtitan import parallel_dims

    for item in files:
        if item.kind == "torchtitan" and item.framework_config is not None and gpus is not None:
            try:
                parallel_dims(item.framework_config, gpus)
            except Exception as error:
                report.problems.append(f"{item.path.name}: torchtitan's ParallelDims refuses it on {gpus} GPUs: "
                                       f"{' '.join(str(error).split()) or type(error).__name__}")


def check_files(catalog: Catalog, paths: list[Path], model: str | None, gpu: str, gpus: int | None) -> CheckReport:
    """Read every file, then check them together; `model` (a catalog id) adds memory fit, step time and MFU."""
    files = [read_file(path) for path in paths]
    _refuse_degrees_below_one(files)
    report = CheckReport(files, gpus)
    for item in files:
        report.problems += item.problems
        report.notes += [f"{item.path.name}: {note}" for note in item.notes]
    report.gpus = _gpu_count(files, gpus, report)
    degrees = _merged(files, report)
    dp = _check_degrees(degrees, report.gpus, report)
    for item in files:
        _check_batch(item, dp, report)
    _check_placement(files, degrees, report)
    _torchtitan_dims(files, report.gpus, report)
    if model is None:
        report.notes.append("memory, step time and MFU not estimated: give --model")
    elif not report.problems and report.gpus is not None and dp is not None:
        report.expected = _expected(catalog, files, degrees, dp, model, gpu, report)
    _startup_rules(files, dp, report)
    return report


def _startup_rules(files: list[ReadConfig], dp: int | None, report: CheckReport) -> None:
    """What the framework refuses at start-up (the layout itself, priced above, is well defined)."""
    from gpufleet.emit.megatron_rules import batch_rules

    for item in files:
        report.problems += item.startup_problems
        if item.kind == "megatron" and isinstance(item.framework_config, dict) and dp is not None:
            report.problems += batch_rules(item.path.name, item.framework_config, dp)


def _expected(catalog: Catalog, files: list[ReadConfig], degrees: dict[str, int], dp: int, model_id: str, gpu_id: str,
              report: CheckReport) -> dict[str, Any] | None:
    """Memory per GPU and step time of the layout the files describe, through gpufleet's model."""
    from gpufleet.emit.expected import expected_step
    from gpufleet.planner.stack import TARGET_STACKS

    first = {attr: next((getattr(f, attr) for f in files if getattr(f, attr) is not None), None)
             for attr in ("micro_batch", "global_batch", "seq_len", "sharding", "recompute", "precision")}
    stack = next((TARGET_STACKS[kind] for kind in (f.kind for f in files) if kind in TARGET_STACKS), None)
    try:
        return expected_step(catalog, model_id, gpu_id, report.gpus or 0, degrees, dp, first, stack)
    except (LayoutError, GpufleetError) as error:
        report.problems.append(f"the layout does not hold for {model_id}: {error}")
        return None
    except (ArithmeticError, ValueError) as error:
        raise InputError(f"cannot estimate the layout: {error}") from error


__all__ = ["CheckReport", "check_files"]


def _band(expected: dict[str, Any]) -> str:
    """` (low–high)`: the step's 80 % interval, where the estimate carries one."""
    band = expected.get("step_interval")
    return f" ({band['low']:.3g}–{band['high']:.3g}, 80% interval)" if isinstance(band, dict) else ""
