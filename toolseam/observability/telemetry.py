"""Traces and metrics through the OpenTelemetry API (the ``otel`` extra), named by the
semantic conventions: an ``execute_tool {gen_ai.tool.name}`` span per call (GenAI), a process
span per command (CLI), the ``gen_ai.execute_tool.duration`` histogram; the session's own
steps as spans of their own. Loaded only when telemetry is on (``config.py``).

Every figure leaves through the SDK's batching processor or periodic reader: a call's path
creates spans and records a histogram point, and nothing waits on an exporter.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_OPERATION_NAME,
    GEN_AI_TOOL_CALL_ARGUMENTS,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_CALL_RESULT,
    GEN_AI_TOOL_NAME,
)
from opentelemetry.semconv._incubating.attributes.process_attributes import (
    PROCESS_EXECUTABLE_NAME,
    PROCESS_EXIT_CODE,
    PROCESS_PID,
)
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv.attributes.server_attributes import SERVER_ADDRESS
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..builtins import CallContext, ToolResult
from ..seam.errors import CouldNotRunError
from ..seam.models import JobStatus, TraceContext
from .observed import ObservedSession
from .outcomes import Outcome, error_type, outcome_of

if TYPE_CHECKING:
    from ..egress.audit import EgressEvent

EXECUTE_TOOL = "execute_tool"
DURATION = "gen_ai.execute_tool.duration"  # GenAI conventions: the tool call's duration
SCOPE = "toolseam"
_W3C = TraceContextTextMapPropagator()  # only the trace context crosses, never baggage


def otlp_providers(metric_readers: Sequence[Any] = ()) -> tuple[Any, Any]:
    """SDK providers exporting over OTLP/HTTP, configured by the standard variables
    (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``);
    traces and metrics each only where an endpoint says where they go. ``metric_readers``
    (a Prometheus reader) read the metrics too, endpoint or not."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    common = bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    tracer_provider = meter_provider = None
    if common or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    readers = list(metric_readers)
    if common or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    if readers:
        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    return tracer_provider or trace.NoOpTracerProvider(), \
        meter_provider or metrics.NoOpMeterProvider()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("toolseam")
    except PackageNotFoundError:
        return "0"


class Telemetry:
    """The tracer, the instruments, and what they record for each session."""

    def __init__(self, tracer_provider: Any, meter_provider: Any, record_content: bool,
                 content_limit: int) -> None:
        self.tracer_provider = tracer_provider or trace.get_tracer_provider()
        self.meter_provider = meter_provider or metrics.get_meter_provider()
        self._own = tracer_provider is not None or meter_provider is not None
        self._pending: collections.deque[tuple[Any, ...]] = collections.deque()
        self.record_content = record_content
        self.content_limit = content_limit
        self.tracer = self.tracer_provider.get_tracer(SCOPE, _version())
        meter = self.meter_provider.get_meter(SCOPE, _version())
        self.duration = meter.create_histogram(
            DURATION, unit="s", description="Duration of a tool call, from its start to its "
            "result (GenAI semantic conventions).",
            explicit_bucket_boundaries_advisory=[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300])
        self.sessions_open = meter.create_up_down_counter(
            "toolseam.sessions.open", unit="{session}", description="Sessions open now.")
        self.session_cpu = meter.create_counter(
            "toolseam.session.cpu.time", unit="s",
            description="CPU time of ended sessions' sandboxes, added at close.")
        self.egress_connections = meter.create_counter(
            "toolseam.egress.connections", unit="{connection}",
            description="Egress connection attempts, by host.")
        self.egress_bytes = meter.create_counter(
            "toolseam.egress.bytes", unit="By", description="Egress bytes both ways, by host.")
        self.egress_refused = meter.create_counter(
            "toolseam.egress.refused", unit="{connection}",
            description="Egress attempts the rules refused, by host.")
        self.pool_claims = meter.create_counter(
            "toolseam.pool.claims", unit="{claim}", description="Sandboxes handed out by pools.")
        self.pool_claim_duration = meter.create_histogram(
            "toolseam.pool.claim.duration", unit="s",
            description="From asking a pool for a sandbox to having it.")

    def shutdown(self) -> None:
        self.finish_calls()
        for provider in (self.tracer_provider, self.meter_provider):
            if self._own and hasattr(provider, "force_flush"):
                provider.force_flush()

    # --- a call ----------------------------------------------------------------------------
    async def traced_call(self, observer: ObservedSession, name: str, ctx: CallContext | None,
                          args: Any, run: Awaitable[ToolResult]) -> ToolResult:
        attributes = {GEN_AI_OPERATION_NAME: EXECUTE_TOOL, GEN_AI_TOOL_NAME: name,
                      **observer.attributes}
        if ctx is not None:
            attributes[GEN_AI_TOOL_CALL_ID] = ctx.call_id
        if self.record_content:
            attributes[GEN_AI_TOOL_CALL_ARGUMENTS] = self._content(observer, _as_text(args))
        started = time.perf_counter()
        outcome: Outcome = "raised"
        kind: str | None = None
        job: JobStatus | None = None
        # start_span and a context token, not start_as_current_span: its two generator-based
        # context managers cost a few µs on every call
        span = self.tracer.start_span(f"{EXECUTE_TOOL} {name}", kind=SpanKind.INTERNAL,
                                      attributes=attributes)
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            result = await run
        except CouldNotRunError as exc:
            outcome, kind = "could_not_run", exc.cause
            span.set_status(Status(StatusCode.ERROR, exc.reason))
            raise
        except BaseException as exc:
            kind = type(exc).__qualname__
            span.set_status(Status(StatusCode.ERROR, str(exc)))
            raise
        else:
            outcome, kind = outcome_of(result), error_type(result)
            if kind is not None:
                span.set_status(Status(StatusCode.ERROR))
            if self.record_content:
                span.set_attribute(GEN_AI_TOOL_CALL_RESULT,
                                   self._content(observer, result.output))
            job = ctx.extra.get("job") if ctx is not None else None
            return result
        finally:
            otel_context.detach(token)
            took = time.perf_counter() - started
            observer.meter.record(outcome, ctx)
            # the span's end, the command's span and the histogram point are the SDK's
            # costliest steps: made once the answer is the caller's, while the loop waits for
            # the next one (decision 392), at the times measured here
            self._pending.append((span, time.time_ns(), kind, job, ctx, name,
                                  observer.backend, outcome, took))
            if len(self._pending) == 1:  # one loop callback for all the calls that end at once
                asyncio.get_running_loop().call_soon(self.finish_calls)

    def finish_calls(self) -> None:
        """The calls' deferred SDK work, now (the loop's callback; also every session's close
        and ``shutdown``, so a session's spans are all handed over when its close returns)."""
        while self._pending:
            self._after_call(*self._pending.popleft())

    def _after_call(self, span: Any, end_ns: int, kind: str | None, job: JobStatus | None,
                    ctx: CallContext | None, name: str, backend: str, outcome: Outcome,
                    took: float) -> None:
        if kind is not None:
            span.set_attribute(ERROR_TYPE, kind)
        if job is not None:
            self._process_span(job, ctx, span)
        span.end(end_time=end_ns)
        point = {GEN_AI_TOOL_NAME: name, "toolseam.backend": backend,
                 "toolseam.outcome": outcome}
        if kind is not None:
            point[ERROR_TYPE] = kind
        self.duration.record(took, point)

    def _process_span(self, job: JobStatus, ctx: CallContext | None, parent: Any) -> None:
        """The command, per the CLI conventions: a child of the call's span, at the times the
        sandbox reported (it started before the answer came)."""
        executable = "sh"
        if ctx is not None:
            with contextlib.suppress(Exception):  # no shell resolved: the default stays
                executable = os.path.basename(ctx.services.shell.argv[0])
        # the session's attributes are the parent's: each one more costs every call
        attributes: dict[str, Any] = {
            PROCESS_EXECUTABLE_NAME: executable, PROCESS_PID: job.pid,
            "toolseam.process.timed_out": job.timed_out,
            "toolseam.process.detached": job.state == "running"}
        if job.exit_code is not None:
            attributes[PROCESS_EXIT_CODE] = job.exit_code
        if job.killed:
            attributes["toolseam.process.killed"] = True
        start_ns = int(job.started * 1e9)
        span = self.tracer.start_span(executable, trace.set_span_in_context(parent),
                                      kind=SpanKind.INTERNAL, attributes=attributes,
                                      start_time=start_ns)
        if job.timed_out or (job.exit_code not in (0, None)):
            span.set_attribute(ERROR_TYPE, "timeout" if job.timed_out else str(job.exit_code))
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=start_ns + job.duration_ms * 1_000_000)

    def _content(self, observer: ObservedSession, text: str) -> str:
        """Recorded content: every egress credential value masked, then cut."""
        for secret in observer.secrets():
            if secret:
                text = text.replace(secret, "[masked]")
        if len(text) > self.content_limit:
            text = text[:self.content_limit] + f"…[{len(text) - self.content_limit} more]"
        return text

    # --- the session -----------------------------------------------------------------------
    @contextlib.contextmanager
    def lifecycle(self, observer: ObservedSession, step: str,
                  attributes: Mapping[str, Any]) -> Iterator[None]:
        with self.lifecycle_span(step, {**observer.attributes, **attributes}) as span:
            yield
            span.set_attributes(observer.attributes)  # what the step found out (an open's)

    @contextlib.contextmanager
    def lifecycle_span(self, step: str, attributes: Mapping[str, Any]) -> Iterator[Any]:
        """``toolseam {step}``; a failure's cause (or type) is its ``error.type``."""
        with self.tracer.start_as_current_span(
                f"toolseam {step}", kind=SpanKind.INTERNAL, attributes=attributes,
                record_exception=False, set_status_on_exception=False) as span:
            try:
                yield span
            except BaseException as exc:
                cause = getattr(exc, "cause", None)
                span.set_attribute(ERROR_TYPE, cause or type(exc).__qualname__)
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                raise

    def session_opened(self, observer: ObservedSession) -> None:
        self.sessions_open.add(1, {"toolseam.backend": observer.backend})

    def session_closed(self, observer: ObservedSession) -> None:
        self.finish_calls()
        self.sessions_open.add(-1, {"toolseam.backend": observer.backend})
        if observer.usage.cpu_seconds is not None:
            self.session_cpu.add(observer.usage.cpu_seconds,
                                 {"toolseam.backend": observer.backend})

    # --- across machines (a Ray node) ------------------------------------------------------
    def context_out(self) -> TraceContext | None:
        """The current span's W3C trace context, for the place a call goes on to; None when
        there is no span (nothing to continue)."""
        carrier: dict[str, str] = {}
        _W3C.inject(carrier)
        parent = carrier.get("traceparent")
        if parent is None:
            return None
        # made here from the SDK's own formatting: validating it again costs every call
        return TraceContext.model_construct(traceparent=parent,
                                            tracestate=carrier.get("tracestate") or None)

    @contextlib.contextmanager
    def continued(self, came: TraceContext, name: str,
                  attributes: Mapping[str, Any]) -> Iterator[Any]:
        """A SERVER span for work done here on behalf of a caller elsewhere, a child of the
        caller's span (``came``); spans started inside are its children."""
        carrier = {"traceparent": came.traceparent}
        if came.tracestate:
            carrier["tracestate"] = came.tracestate
        parent = _W3C.extract(carrier)
        span = self.tracer.start_span(name, parent, kind=SpanKind.SERVER, attributes=attributes)
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        try:
            yield span
        except BaseException as exc:
            failed(span, getattr(exc, "cause", None) or type(exc).__qualname__, str(exc))
            raise
        finally:
            otel_context.detach(token)
            span.end()

    def egress(self, observer: ObservedSession, event: EgressEvent) -> None:
        point = {SERVER_ADDRESS: event.host, "toolseam.backend": observer.backend}
        self.egress_connections.add(1, point)
        self.egress_bytes.add(event.bytes_up + event.bytes_down, point)
        if not event.allowed:
            self.egress_refused.add(1, point)


def failed(span: Any, kind: str, description: str | None = None) -> None:
    """``span`` ended in failure: ``error.type`` and an error status."""
    span.set_attribute(ERROR_TYPE, kind)
    span.set_status(Status(StatusCode.ERROR, description))


def _as_text(args: Any) -> str:
    if isinstance(args, str | bytes):
        return args if isinstance(args, str) else args.decode("utf-8", "replace")
    try:
        return json.dumps(args, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(args)


@contextlib.contextmanager
def remote_parent(carrier: Mapping[str, str]) -> Iterator[None]:
    """Spans started inside are children of the W3C ``traceparent`` (and ``tracestate``) in
    ``carrier`` — e.g. an MCP request's ``params._meta``."""
    token = otel_context.attach(propagate.extract(dict(carrier)))
    try:
        yield
    finally:
        otel_context.detach(token)
