"""Observability (issue 49, docs/observability.md): each session's accounting
(``SessionReport``), and — with the ``otel`` extra and OpenTelemetry configured the standard
way — spans per the GenAI and CLI semantic conventions and metrics, exported over OTLP and for
Prometheus. Without telemetry only the accounting runs and ``opentelemetry`` is not imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from . import config
from .config import instrument, uninstrument
from .hook import SessionObserver
from .report import EgressTotals, SessionReport

__all__ = ["EgressTotals", "SessionObserver", "SessionReport", "instrument", "trace_parent",
           "uninstrument"]


@contextlib.contextmanager
def trace_parent(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Calls made inside continue the trace whose W3C ``traceparent`` ``carrier`` holds (an MCP
    request's ``params._meta``); nothing when telemetry is off or there is none."""
    if not carrier or "traceparent" not in carrier or config.active() is None:
        yield
        return
    from .telemetry import remote_parent  # loaded already: telemetry is on

    with remote_parent(carrier):
        yield
