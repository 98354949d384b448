"""The step model's judgement constants, as data (`judgements/step_model.yaml`): each value with why it was chosen.

These are neither catalog numbers with a published source nor recorded fits (`data/fits.yaml`): they are calls made
by reasoning about kernels and frameworks, kept in one file so that they are visible, documented and checked on
load. `step_judgements()` reads and validates the file once.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpufleet.errors import CatalogError
from gpufleet.input_files import load_yaml

_Strict = ConfigDict(frozen=True, extra="forbid")


class _Judged(BaseModel):
    """A judgement constant's reason: `source` starts with "judgement"."""

    model_config = _Strict
    source: str = Field(min_length=3)

    @field_validator("source")
    @classmethod
    def _says_judgement(cls, source: str) -> str:
        if not source.startswith("judgement"):
            raise ValueError("a judgement constant's source must start with 'judgement'")
        return source


class JudgedFloat(_Judged):
    value: float = Field(gt=0)


class JudgedFraction(_Judged):
    value: float = Field(gt=0, le=1)


class JudgedInt(_Judged):
    value: int = Field(gt=0)


class StepJudgements(BaseModel):
    """The step model's judgement constants (the YAML file documents each)."""

    model_config = _Strict
    router_gemm_fraction: JudgedFraction
    cpu_adam_slowdown: JudgedFloat
    backward_forward_ratio: JudgedFloat
    ep_imbalance: JudgedFloat
    step_overhead_s: JudgedFloat
    moe_fixed_kernels_fwd: JudgedInt
    moe_kernels_per_local_expert_fwd: JudgedInt
    moe_backward_kernel_ratio: JudgedFloat


def judgements_path() -> Path:
    return Path(str(resources.files("gpufleet.catalog") / "judgements" / "step_model.yaml"))


def load_step_judgements(path: Path) -> StepJudgements:
    """Read and validate a judgements file; anything wrong is one CatalogError line."""
    data = load_yaml(path, "judgements file", CatalogError)
    try:
        return StepJudgements.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise CatalogError(f"{path}: {where}: {first['msg']}") from error


@lru_cache(maxsize=1)
def step_judgements() -> StepJudgements:
    """The shipped judgement constants (read once)."""
    return load_step_judgements(judgements_path())
