"""``GET /metrics`` on ``toolseam mcp --http`` (issue 49): the Prometheus exposition of
``toolseam metrics`` over this server's own sessions, with this process's instruments beside
them — the ``gen_ai.execute_tool.duration`` histogram of its calls, pool claims — behind the
server's bearer token, checked by the SDK's ``RequireAuthMiddleware`` exactly as for ``/mcp``.
Without a token (a unix socket served without one) every scrape gets 401: the figures are never
open, loopback included (decision 386).

Needs the ``otel`` extra; without it ``/metrics`` answers 501 naming the extra, and ``/mcp``
serves as before.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mcp.server.auth.middleware.bearer_auth import RequireAuthMiddleware
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..._extras import install_hint
from ...observability import instrument, uninstrument
from ...observability.config import disabled
from ...observability.live import LIVE

try:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from ...observability.prometheus import OneFamilyPerName, sessions_registry
    from ...observability.telemetry import otlp_providers
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    _MISSING: str | None = f"/metrics needs the otel extra ({exc.name} is missing): " \
        f"{install_hint('otel')}\n"
else:
    _MISSING = None

PATH = "/metrics"


def own_sessions() -> list[dict[str, Any]]:
    """This process's live sessions: a token holder of this server sees no other program's."""
    return list(LIVE.answer({"op": "list"})["sessions"])


class ServerMetrics:
    """Made before the server's sessions: it instruments this process, so that their calls'
    durations reach the Prometheus reader (and OTLP, when the environment names an endpoint)."""

    def __init__(self) -> None:
        self.registry: Any = None
        self._instrumented = False
        if _MISSING is not None:
            return
        own = CollectorRegistry()
        if not disabled():
            tracer_provider, meter_provider = otlp_providers(
                metric_readers=[PrometheusMetricReader(registry=own)])
            instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
            self._instrumented = True
        self.registry = CollectorRegistry()
        self.registry.register(OneFamilyPerName(sessions_registry(own_sessions), own))

    def route(self) -> Route:
        return Route(PATH, endpoint=RequireAuthMiddleware(self._scrape, []), methods=["GET"])

    async def _scrape(self, scope: Scope, receive: Receive, send: Send) -> None:
        response: Response
        if self.registry is None:
            response = PlainTextResponse(_MISSING, status_code=501)
        else:
            # in a thread: a session's figures are asked of this very event loop
            body = await asyncio.to_thread(generate_latest, self.registry)
            response = Response(body, media_type=CONTENT_TYPE_LATEST)
        await response(scope, receive, send)

    def close(self) -> None:
        """Flushes what is still batched (OTLP) and leaves the process as it found it."""
        if self._instrumented:
            uninstrument()
