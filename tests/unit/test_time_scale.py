"""The suite's one time scale (``tests/support/timing.py``, issue 45): bounds a test waits for a
condition stretch by ``TOOLSEAM_TEST_TIME_SCALE``; a value that could only shrink them or is
not a number stops the run with the variable's name."""

from __future__ import annotations

import pytest

from ..support.timing import SCALE_VARIABLE, time_scale


@pytest.mark.parametrize(("value", "scale"), [(None, 1.0), ("1", 1.0), ("2.5", 2.5), ("10", 10.0)])
def test_the_scale_is_the_variable_or_one(value: str | None, scale: float) -> None:
    assert time_scale({} if value is None else {SCALE_VARIABLE: value}) == scale


@pytest.mark.parametrize("value", ["0.5", "0", "-2", "nan", "fast", ""])
def test_a_scale_that_would_shrink_the_bounds_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match=SCALE_VARIABLE):
        time_scale({SCALE_VARIABLE: value})
