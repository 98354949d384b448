"""The checkpoint commands' request objects refuse what `gpufleet ckpt` refuses, with the same message, and answer
as the CLI does."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from clirun import run_gpufleet
from gpufleet.errors import InputError
from gpufleet.runtime.checkpoint.requests import (
    DEFAULT_DEADLINE_S,
    CopyRequest,
    PruneRequest,
    VerifyRequest,
    verify_root,
)


def _cli_error(*args: str) -> str:
    result = run_gpufleet(*args)
    assert result.returncode == 2, result.stderr
    return result.stderr.strip().removeprefix("error: ")


@pytest.mark.parametrize(("build", "args"), [
    (lambda: PruneRequest(where="/nowhere", keep_last=0), ["prune", "/nowhere", "--keep-last", "0"]),
    (lambda: PruneRequest(where="/nowhere", keep_last=1, keep_every=0),
     ["prune", "/nowhere", "--keep-last", "1", "--keep-every", "0"]),
    (lambda: VerifyRequest(where="/nowhere", step=-1), ["verify", "/nowhere", "--step", "-1"]),
    (lambda: CopyRequest(source="/a", destination="/b", deadline_s=0), ["upload", "/a", "/b", "--deadline", "0"]),
    (lambda: CopyRequest(source="/a", destination="/b", max_mib_per_s=-1),
     ["upload", "/a", "/b", "--max-mib-per-s", "-1"]),
])
def test_ckpt_requests_refuse_what_the_cli_refuses(build: Callable[[], object], args: list[str]) -> None:
    with pytest.raises(InputError) as refused:
        build()
    assert str(refused.value) == _cli_error("ckpt", *args)


def test_ckpt_verify_of_an_empty_root_fails_the_check_as_the_cli_does(tmp_path: Path) -> None:
    answer = verify_root(VerifyRequest(where=str(tmp_path)))
    result = run_gpufleet("ckpt", "verify", str(tmp_path), "--json")
    assert result.returncode == 1
    assert {**answer.data, "error": answer.failure} == json.loads(result.stdout)
    assert CopyRequest(source="/a", destination="/b").deadline_s == DEFAULT_DEADLINE_S
