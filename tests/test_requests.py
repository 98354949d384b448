"""Request objects are the Python API: they refuse what the CLI refuses, with the same message, and keep its
defaults (one definition, next to the owner)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from clirun import run_gpufleet
from gpufleet.catalog.registry import load_catalog
from gpufleet.errors import InputError
from gpufleet.parallel.memory_request import MemoryRequest
from gpufleet.planner.memory_report import memory_report


def _cli_error(*args: str) -> str:
    result = run_gpufleet(*args)
    assert result.returncode == 2, result.stderr
    return result.stderr.strip().removeprefix("error: ")


@pytest.mark.parametrize(("fields", "flags"), [
    ({"recompute": "some"}, ["--recompute", "some"]),
    ({"recompute": "full", "selective_policy": "op"}, ["--recompute", "full", "--selective-policy", "op"]),
    ({"sharding": "zero4"}, ["--sharding", "zero4"]),
    ({"precision": "fp4"}, ["--precision", "fp4"]),
    ({"gpus": 12, "tp": 8}, ["--gpus", "12", "--tp", "8"]),
])
def test_memory_request_refuses_what_the_cli_refuses(fields: dict[str, object], flags: list[str]) -> None:
    base = {"model": "llama3-8b", "gpu": "h100-sxm", "gpus": 8}
    with pytest.raises(InputError) as refused:
        MemoryRequest(**{**base, **fields})
    cli_flags = ["--gpus", "8"] if "gpus" not in fields else []
    assert str(refused.value) == _cli_error("memory", "-m", "llama3-8b", "-g", "h100-sxm", *cli_flags, *flags)


def test_memory_request_ranges_and_defaults() -> None:
    with pytest.raises(ValidationError):
        MemoryRequest(model="llama3-8b", gpu="h100-sxm", gpus=0)
    with pytest.raises(ValidationError):
        MemoryRequest(model="llama3-8b", gpu="h100-sxm", gpus=8, unknown=1)  # type: ignore[call-arg]
    request = MemoryRequest(model="llama3-8b", gpu="h100-sxm", gpus=64, tp=8, pp=2)
    assert (request.data_parallel, request.batch) == (4, 8)
    report = memory_report(request, load_catalog([]))
    assert report.data["fits"] and not report.problems()
