"""Whether this process traces and measures, decided the standard OpenTelemetry way:

* ``toolseam.instrument(tracer_provider=..., meter_provider=...)`` — the providers are given;
* else ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or its ``_TRACES_`` / ``_METRICS_`` forms) is set —
  toolseam makes its own SDK providers exporting over OTLP/HTTP, batched off the call's path
  (``OTEL_SERVICE_NAME`` names the service);
* else the application has loaded OpenTelemetry itself — its global providers are used, so a
  tool call's span is a child of the caller's current span;
* else nothing: ``opentelemetry`` is never imported and a call pays nothing for it.

``OTEL_SDK_DISABLED=true`` turns it all off.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from .._extras import install_hint

if TYPE_CHECKING:
    from .telemetry import Telemetry

_log = logging.getLogger("toolseam.observability")
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
              "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
_chosen: dict[str, Telemetry | None] = {}  # "explicit" / "env" / "global" → the one made
_warned: list[bool] = []


def instrument(*, tracer_provider: Any = None, meter_provider: Any = None,
               record_content: bool = False, content_limit: int = 4096) -> None:
    """Trace and measure every session of this process through these providers (None: the
    global ones). ``record_content``: spans also carry each call's arguments and result,
    cut to ``content_limit`` characters, with every egress credential value masked."""
    from .telemetry import Telemetry  # the optional extra: loaded only when asked for

    _chosen["explicit"] = Telemetry(tracer_provider, meter_provider, record_content,
                                    content_limit)


def uninstrument() -> None:
    """Back to the standard choice (environment, or an application's own OpenTelemetry)."""
    made = _chosen.pop("explicit", None)
    if made is not None:
        made.shutdown()


def disabled() -> bool:
    """``OTEL_SDK_DISABLED=true``: no telemetry at all, whatever else is set."""
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def active() -> Telemetry | None:
    """The telemetry sessions opened now report to; None: off, at no cost."""
    if "explicit" in _chosen:
        return _chosen["explicit"]
    if disabled():
        return None
    if any(os.environ.get(name) for name in _ENDPOINTS):
        if "env" not in _chosen:
            _chosen["env"] = _from_environment()
        return _chosen["env"]
    if "opentelemetry.trace" in sys.modules and _global_provider_set():
        if "global" not in _chosen:  # the application traces: join its traces
            _chosen["global"] = _from_globals()
        return _chosen["global"]
    return None


def share_with_libraries() -> None:
    """For toolseam's own programs (``toolseam mcp``): the tracer provider toolseam made from
    the environment becomes OpenTelemetry's global one, when the process has none, so the spans
    libraries make through the global API join the same export. The MCP SDK's is a
    ``tools/call {name}`` server span, a child of the client's ``params._meta.traceparent``;
    with it recorded, each ``execute_tool`` span is its child (decision 385). Without it the
    SDK's span is a non-recording one that only carries the client's context along."""
    telemetry = active()
    if telemetry is None:
        return
    from opentelemetry import trace  # loaded already: telemetry is on

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider) and \
            not isinstance(telemetry.tracer_provider, trace.NoOpTracerProvider):
        trace.set_tracer_provider(telemetry.tracer_provider)


def _global_provider_set() -> bool:
    """Whether the application set a tracer or meter provider of its own (a library that
    merely imports the API leaves the proxies, and then nothing is recorded anyway)."""
    from opentelemetry import metrics, trace  # loaded already (sys.modules says so)

    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider) or \
        type(metrics.get_meter_provider()).__name__ != "_ProxyMeterProvider"


def _from_environment() -> Telemetry | None:
    try:
        from .telemetry import Telemetry, otlp_providers  # the optional extra
    except ImportError:
        if not _warned:
            _warned.append(True)
            _log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but toolseam's 'otel' extra is "
                         "not installed (%s): no telemetry", install_hint("otel"))
        return None
    tracer_provider, meter_provider = otlp_providers()
    return Telemetry(tracer_provider, meter_provider, False, 4096)


def _from_globals() -> Telemetry | None:
    try:
        from .telemetry import Telemetry  # the application has loaded opentelemetry already
    except ImportError:  # its API without the SDK pieces toolseam's extra brings
        return None
    return Telemetry(None, None, False, 4096)
