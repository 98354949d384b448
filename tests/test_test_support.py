"""The test suite's own machinery: the regression guards' float tolerance (tests/guards.py) and hypothesis's profile
(tests/conftest.py)."""

from __future__ import annotations

import math
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from guards import GUARD_REL_TOL, assert_same_document, first_difference


def test_a_last_bit_difference_is_the_same_figure_and_a_real_change_is_not() -> None:
    recorded = {"plans": [{"step_s": 0.1 + 0.2, "rank": 1, "label": "tp8"}], "note": None}
    assert_same_document({"plans": [{"step_s": 0.3, "rank": 1, "label": "tp8"}], "note": None}, recorded)
    assert_same_document({"plans": [{"step_s": math.nextafter(0.3, 1.0), "rank": 1, "label": "tp8"}],
                          "note": None}, recorded)
    moved = {"plans": [{"step_s": 0.3 * (1 + 100 * GUARD_REL_TOL), "rank": 1, "label": "tp8"}], "note": None}
    assert first_difference(moved, recorded) is not None
    assert "$.plans[0].step_s" in (first_difference(moved, recorded) or "")


def test_everything_but_a_float_is_compared_exactly() -> None:
    assert first_difference({"a": 1, "b": 2}, {"b": 2, "a": 1}) is not None  # key order
    assert first_difference({"n": 2.0}, {"n": 2}) is not None  # JSON writes 2.0 and 2 differently
    assert first_difference({"n": True}, {"n": 1}) is not None
    assert first_difference([1, 2], [1, 2, 3]) is not None
    assert first_difference("tp8 pp2", "tp8 pp4") is not None
    assert first_difference(0.0, 1e-17) is None  # a zero that came out as cancellation noise
    assert first_difference(math.nan, math.nan) is None and first_difference(math.inf, -math.inf) is not None


def test_the_profile_has_no_deadline_and_a_tests_own_settings_inherit_it() -> None:
    assert settings.get_profile("gpufleet").deadline is None and settings.default.deadline is None
    assert settings(max_examples=3).deadline is None  # what `@settings(max_examples=3)` applies


@settings(max_examples=1)
@given(st.integers())
def test_an_example_slower_than_hypothesis_default_deadline_passes(_: int) -> None:
    time.sleep(0.3)  # over the 200 ms default (and its 1.25 x grace while generating)
