"""Comparing today's output with a recorded one (the regression guards): floats within a stated tolerance.

A regression guard pins what the model gave when the guard was written. The model's floats go through libm (exp,
log, pow) and numpy, whose results may differ in the last bit or two between machines, CPUs and numpy builds (SIMD
paths, summation order): an exact comparison would fail on such a difference while the answer is the same. So a
guard compares floats with GUARD_REL_TOL, some million times that noise and far below what a change to the model
moves, and everything else (keys and their order, types, strings, integers, booleans, None, list lengths) exactly.

This is for guards only: a test of a number derived independently of the model states its own tolerance.
"""

from __future__ import annotations

import math
from typing import Any

#: Relative tolerance of a regression guard's float comparison: last-bit differences across machines and numpy
#: builds (a double's last bit is ~1.1e-16 of it; a few operations compound that to ~1e-14), with room to spare.
GUARD_REL_TOL = 1e-9
#: Absolute floor for figures that are zero in one document (a difference of two equal terms may come out 1e-17).
GUARD_ABS_TOL = 1e-12


def same_float(found: float, expected: float, *, rel: float = GUARD_REL_TOL, abs_tol: float = GUARD_ABS_TOL) -> bool:
    """Whether two floats are the same figure up to last-bit noise (NaN equals NaN; infinities must match)."""
    if math.isnan(expected) or math.isnan(found):
        return math.isnan(expected) and math.isnan(found)
    return math.isclose(found, expected, rel_tol=rel, abs_tol=abs_tol)


def first_difference(found: Any, expected: Any, *, rel: float = GUARD_REL_TOL, path: str = "$") -> str | None:
    """Where two JSON-like documents differ beyond float noise (as `$.plans[0].step_s: found ... expected ...`),
    or None when they are the same. Dict keys are compared in order, floats with `rel`, everything else exactly
    (types included: 2.0 and 2 differ, as JSON writes them differently)."""
    if isinstance(expected, dict) and isinstance(found, dict):
        if list(found) != list(expected):
            return f"{path}: keys {list(found)} != expected {list(expected)}"
        for key, value in expected.items():
            if (where := first_difference(found[key], value, rel=rel, path=f"{path}.{key}")) is not None:
                return where
        return None
    if isinstance(expected, list | tuple) and isinstance(found, list | tuple):
        if len(found) != len(expected):
            return f"{path}: {len(found)} items != expected {len(expected)}"
        for index, (a, b) in enumerate(zip(found, expected, strict=True)):
            if (where := first_difference(a, b, rel=rel, path=f"{path}[{index}]")) is not None:
                return where
        return None
    if type(found) is float and type(expected) is float:
        return None if same_float(found, expected, rel=rel) else \
            f"{path}: found {found!r}, expected {expected!r} (relative tolerance {rel:g})"
    if type(found) is not type(expected) or found != expected:
        return f"{path}: found {found!r}, expected {expected!r}"
    return None


def assert_same_document(found: Any, expected: Any, *, rel: float = GUARD_REL_TOL) -> None:
    """Assert two parsed JSON documents are the same up to float noise; the message says where they differ."""
    where = first_difference(found, expected, rel=rel)
    assert where is None, where
