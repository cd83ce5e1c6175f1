"""A trace that crosses to where a session's sandbox lives (a Ray node, decision 390): the
caller sends its current span's W3C context with each call (``outgoing``); the other end makes
its spans children of it (``continued``), exported by that end's own telemetry — configured
the standard way in its own environment — so a tracing backend shows one trace. Where either
end has no telemetry, nothing is sent or made and ``opentelemetry`` is not imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..seam.models import TraceContext
from . import config

Fail = Callable[[str], None]  # marks the span failed, with this error.type


def outgoing() -> TraceContext | None:
    """The current span's context to send with a call; None when telemetry is off here or no
    span is current."""
    telemetry = config.active()
    return None if telemetry is None else telemetry.context_out()


def _ignore(_kind: str) -> None:
    pass


@contextlib.contextmanager
def continued(came: object, name: str, attributes: Mapping[str, Any]) -> Iterator[Fail]:
    """Work done here for a caller whose context ``came`` with the call: a SERVER span, its
    child. Nothing when telemetry is off here, or the caller sent no context (a caller that is
    not tracing gets no root span per call). Yields what marks the span failed."""
    telemetry = config.active() if isinstance(came, TraceContext) else None
    if telemetry is None:
        yield _ignore
        return
    from .telemetry import failed  # loaded already: telemetry is on

    assert isinstance(came, TraceContext)
    with telemetry.continued(came, name, attributes) as span:
        yield lambda kind: failed(span, kind)


def count_session(delta: int, attributes: Mapping[str, Any]) -> None:
    """``toolseam.sessions.open`` where a session's sandbox lives (a Ray node's own count)."""
    telemetry = config.active()
    if telemetry is not None:
        telemetry.sessions_open.add(delta, attributes)
