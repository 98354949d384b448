"""The Python API refuses what the CLI refuses: a PlanRequest built with a value `gpufleet plan` would refuse raises
one InputError naming the field, never a crash deep in the planner (precision "int3" was an AttributeError,
tokens inf an OverflowError, tokens nan a ValueError, gpus True a plan for one GPU)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clirun import one_error_line
from clirun import run_gpufleet as gpufleet
from gpufleet.errors import InputError
from gpufleet.planner.plan import PlanRequest
from gpufleet.planner.plan_command import PlanCommand

NOT_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
NOT_WHOLE = st.one_of(st.booleans(), st.floats(allow_nan=True).filter(lambda x: not float(x).is_integer()),
                      st.text(max_size=5), st.none())
NOT_A_NAME = st.one_of(st.just(""), st.just("   "), st.integers(), st.floats(), st.none())
UNLISTED = st.text(max_size=12)

#: field -> values the CLI refuses for its flag (a literal outside its choices, a number outside its range)
REFUSED = {
    "model": NOT_A_NAME,
    "gpu": NOT_A_NAME,
    "tokens": st.one_of(NOT_FINITE, st.floats(max_value=0), st.booleans(), st.text(max_size=4)),
    "gpus": st.one_of(NOT_WHOLE.filter(lambda x: x is not None), st.integers(max_value=0),
                      st.integers(min_value=2**20 + 1)),
    "oversubscription": st.one_of(NOT_FINITE, st.floats(max_value=0.999), st.booleans()),
    "seq_len": st.one_of(NOT_WHOLE.filter(lambda x: x is not None), st.integers(max_value=0)),
    "global_batch": st.one_of(NOT_WHOLE.filter(lambda x: x is not None), st.integers(max_value=0)),
    "top": st.one_of(NOT_WHOLE.filter(lambda x: x is not None), st.integers(max_value=0)),
    "sites": st.one_of(NOT_WHOLE.filter(lambda x: x is not None), st.integers(max_value=0)),
    "wan_gbps": st.one_of(NOT_FINITE, st.floats(max_value=0), st.booleans()),
    "wan_latency_s": st.one_of(NOT_FINITE, st.floats(max_value=-1e-12), st.booleans()),
    "precision": UNLISTED.filter(lambda s: s not in ("bf16", "fp16", "fp8")),
    "topology": UNLISTED.filter(lambda s: s not in ("fat-tree", "leaf-spine", "rail-optimized", "dragonfly+")),
    "rank_by": UNLISTED.filter(lambda s: s not in ("time", "cost")),
    "fabric_model": UNLISTED.filter(lambda s: s not in ("analytical", "sim")),
    "attention_kernel": UNLISTED.filter(lambda s: s not in ("flash", "cudnn", "flash-v1", "materialized")),
    "options": st.one_of(st.none(), st.integers(), st.text(max_size=3)),
}


@given(st.sampled_from(sorted(REFUSED)).flatmap(lambda name: st.tuples(st.just(name), REFUSED[name])))
def test_every_refused_value_is_one_input_error_naming_its_field(case: tuple[str, object]) -> None:
    name, value = case
    with pytest.raises(InputError) as raised:
        PlanRequest(**{name: value})  # type: ignore[arg-type]
    assert str(raised.value).startswith(name), str(raised.value)
    assert "\n" not in str(raised.value)


def test_the_cases_the_issue_names() -> None:
    for fields, says in (({"precision": "int3"}, "precision must be one of bf16, fp16, fp8"),
                         ({"tokens": math.inf}, "tokens must be a finite number"),
                         ({"tokens": math.nan}, "tokens must be a finite number"),
                         ({"gpus": True}, "gpus must be a whole number")):
        with pytest.raises(InputError, match=says):
            PlanRequest(**fields)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="--budget must be a positive number"):
        PlanCommand(budget_usd=math.nan)


def test_a_request_the_cli_accepts_is_accepted() -> None:
    request = PlanRequest(model="llama3-70b", tokens=15e12, gpus=1024, oversubscription=2, seq_len=8192,
                          global_batch=512, precision="fp8", top=3, rank_by="cost", sites=1, topology="leaf-spine")
    assert request.oversubscription == 2 and request.precision == "fp8"


@pytest.mark.parametrize(("flag", "value"), [("--precision", "int3"), ("--tokens", "inf"), ("--tokens", "nan"),
                                             ("--budget", "nan"), ("--oversubscription", "nan:1")])
def test_the_cli_refuses_the_same_values(flag: str, value: str) -> None:
    line = one_error_line(gpufleet("plan", "-n", "64", flag, value))
    assert flag.lstrip("-").split("-")[0] in line
