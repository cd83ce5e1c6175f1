"""Bounded retries for transient ENGINE errors only (tenacity) — never a command's failure,
never "connection refused" (a wrong endpoint must fail fast, naming it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import requests
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, requests.exceptions.ReadTimeout | requests.exceptions.ChunkedEncodingError):
        return True
    status = getattr(exc, "status_code", None) or getattr(getattr(exc, "response", None),
                                                          "status_code", None)
    return isinstance(status, int) and status in (500, 502, 503, 504)


def transient_retry(call: Callable[[], T],
                    transient: Callable[[BaseException], bool] = is_transient) -> T:
    for attempt in Retrying(stop=stop_after_attempt(3), wait=wait_exponential(multiplier=0.1, max=1),
                            retry=retry_if_exception(transient), reraise=True):
        with attempt:
            return call()
    raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover
