"""A ds_config.json as DeepSpeed reads it: its own top-level key set and its own config class (DeepSpeedConfig).
What the file states (degrees, batch, ZeRO stage, precision) is read without DeepSpeed; its two own checks need it
(the deepspeed extra) and are recorded as skipped where it is not installed."""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

from gpufleet.emit.read import ReadConfig, _silenced, one_line, skipped
from gpufleet.extras import MissingExtraError, require_extra

#: Keys people write for degrees DeepSpeed takes elsewhere (mpu / PipelineModule / model code): read so that their
#: stated degrees can be checked, and reported as keys DeepSpeed ignores.
STATED_DEGREES = {"data_parallel_size": "dp", "pipeline_parallel_size": "pp", "tensor_parallel_size": "tp",
                  "model_parallel_size": "tp", "expert_parallel_size": "ep", "context_parallel_size": "cp"}
#: Top-level keys read by DeepSpeed outside DeepSpeedConfig (source: deepspeed 0.19 runtime/engine.py reads
#: sequence_parallel_size for Ulysses; runtime/config.py reads it only under torch.distributed).
READ_ELSEWHERE = frozenset({"sequence_parallel_size"})
ZERO_SHARDING = {0: "none", 1: "zero1", 2: "zero2", 3: "zero3"}
#: What DeepSpeed itself checks here, for the line that says they were skipped.
OWN_CHECKS = ("its top-level key set", "its config class DeepSpeedConfig on the file's sections")


class _RecordingKeys:
    def __init__(self, data: dict[str, Any], seen: set[str]) -> None:
        self.data, self.seen = data, seen

    def __contains__(self, key: object) -> bool:
        self.seen.add(str(key))
        return key in self.data

    def __iter__(self) -> Any:
        return iter(list(self.data))

    def __len__(self) -> int:
        return len(self.data)


class _RecordingDict(dict[str, Any]):
    """A dict that notes every top-level key looked up in it (DeepSpeedConfig probes each key it knows)."""

    seen: set[str]

    def __getitem__(self, key: Any) -> Any:
        self.seen.add(str(key))
        return dict.__getitem__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        self.seen.add(str(key))
        return dict.get(self, key, default)

    def __contains__(self, key: object) -> bool:
        self.seen.add(str(key))
        return dict.__contains__(self, key)

    def keys(self) -> Any:
        return _RecordingKeys(dict(self), self.seen)


def _deepspeed_config_class() -> Any:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # no CUDA: DeepSpeed's CPU accelerator, no ops built
    from deepspeed.runtime.config import DeepSpeedConfig

    return DeepSpeedConfig


@functools.lru_cache(maxsize=1)
def deepspeed_keys() -> frozenset[str]:
    """Every top-level key DeepSpeedConfig looks up, found by letting it read a minimal config (its own key set,
    whatever the installed version)."""
    probe = _RecordingDict({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1})
    probe.seen = set()
    _silenced(_silenced(_deepspeed_config_class), probe)
    return frozenset(probe.seen) | READ_ELSEWHERE


def deepspeed_version() -> str:
    """The installed DeepSpeed's version; MissingExtraError (the deepspeed extra) when it is not installed."""
    module = _silenced(require_extra, "deepspeed", "checking a DeepSpeed config")
    return str(module.__version__)


def _own_parser_problems(path: Path, data: dict[str, Any], known: frozenset[str]) -> list[str]:
    """Run DeepSpeedConfig on the file's known keys. Batch arithmetic is gpufleet's check (it depends on the data-
    parallel size, which DeepSpeed takes from torch.distributed), so the batch keys go in as a consistent set for
    one rank; everything else (ZeRO, offload, precision sections) is DeepSpeed's own validation."""
    trial = {key: copy.deepcopy(value) for key, value in data.items() if key in known}
    trial.pop("train_batch_size", None)
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        if not isinstance(trial.get(key), int) or trial[key] < 1:
            trial[key] = 1
    try:
        _silenced(_silenced(_deepspeed_config_class), trial)
    except Exception as error:
        return [f"{path.name}: DeepSpeed's config class refuses it: {one_line(error)}"]
    return []


def read(path: Path, data: dict[str, Any]) -> ReadConfig:
    found = ReadConfig(path, "deepspeed")
    for key, degree in STATED_DEGREES.items():
        if isinstance(data.get(key), int):
            found.degrees[degree] = data[key]
    tensor = data.get("tensor_parallel")
    if isinstance(tensor, dict) and isinstance(tensor.get("autotp_size"), int):
        found.degrees["tp"] = tensor["autotp_size"]
    batch, micro, accumulation = (data.get(key) for key in (
        "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"))
    found.global_batch = batch if isinstance(batch, int) else None
    found.micro_batch = micro if isinstance(micro, int | float) else None
    found.gradient_accumulation = accumulation if isinstance(accumulation, int) else None
    zero = data.get("zero_optimization")
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0
    found.sharding = ZERO_SHARDING.get(stage) if isinstance(stage, int) else None
    found.precision = next((name for name in ("bf16", "fp16") if isinstance(data.get(name), dict)
                            and data[name].get("enabled") is True), None)
    if found.degrees.get("pp", 1) > 1 and isinstance(stage, int) and stage >= 2:
        found.problems.append(f"{path.name}: ZeRO stage {stage} with pipeline parallelism "
                              f"{found.degrees['pp']}: DeepSpeed's PipelineEngine allows ZeRO-1 at most")
    try:
        version, known = deepspeed_version(), deepspeed_keys()
    except MissingExtraError as missing:
        found.skipped.append(skipped("deepspeed", OWN_CHECKS, missing))
        return found
    _own_checks(found, data, version, known)
    return found


def _own_checks(found: ReadConfig, data: dict[str, Any], version: str, known: frozenset[str]) -> None:
    """DeepSpeed's own: keys it does not have, and what its config class refuses."""
    path = found.path
    unknown = sorted(key for key in data if key not in known)
    if unknown:
        found.problems.append(f"{path.name}: {', '.join(unknown)}: not keys DeepSpeed {version} has (it ignores "
                              "them)")
    found.problems += _own_parser_problems(path, data, known)
