"""How long a test waits for a condition before it calls the condition false (issue 45).

Such a bound is a net for a hang, never a measure of speed: a passing test stops waiting as
soon as its condition holds, so a generous bound costs nothing. The bounds in the tests are
sized for the suite's reference machine under load (2 vCPU, both cores held by a CPU hog, two
pytest workers). On a machine slower or busier than that, ``TOOLSEAM_TEST_TIME_SCALE=3``
stretches every bound that goes through :func:`patience` at once — one factor, no retries.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SCALE_VARIABLE = "TOOLSEAM_TEST_TIME_SCALE"


def time_scale(environ: Mapping[str, str] = os.environ) -> float:
    """The factor ``environ`` sets (1 when unset); a value below 1 or not a number is refused."""
    raw = environ.get(SCALE_VARIABLE, "1")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{SCALE_VARIABLE} must be a number of at least 1, got {raw!r}") from None
    if not value >= 1:  # also refuses nan
        raise ValueError(f"{SCALE_VARIABLE} must be a number of at least 1, got {raw!r}")
    return value


SCALE = time_scale()


def patience(seconds: float) -> float:
    """``seconds`` stretched by the machine's scale: the longest a condition is waited for."""
    return seconds * SCALE
