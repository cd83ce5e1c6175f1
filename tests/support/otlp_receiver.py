"""An OTLP/HTTP receiver on 127.0.0.1 for tests: it takes what the OpenTelemetry SDK's own
exporters send (``POST /v1/traces``, ``/v1/metrics``, protobuf), decodes it with the real
``opentelemetry-proto`` messages, and keeps the spans and metric points. It wants a bearer
token (the exporter sends it through ``OTEL_EXPORTER_OTLP_HEADERS`` or ``headers=``): a
listener proves who is on the other end, a test's too."""

from __future__ import annotations

import hmac
import http.server
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def plain(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status_code: int
    start_ns: int
    end_ns: int


@dataclass
class Receiver:
    token: str
    port: int = 0
    spans: list[Span] = field(default_factory=list)
    metrics: dict[str, list[tuple[dict[str, Any], Any]]] = field(default_factory=dict)
    refused: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}

    def wait_for(self, check: Callable[[Receiver], bool], timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not check(self):
                left = deadline - time.monotonic()
                assert left > 0, f"not received in {timeout} s: {[s.name for s in self.spans]}"
                self.changed.wait(left)

    def named(self, name: str) -> list[Span]:
        return [s for s in self.spans if s.name == name]

    def take_traces(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            resource = {a.key: plain(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans.append(Span(
                        span.name, span.trace_id.hex(), span.span_id.hex(),
                        span.parent_span_id.hex(),
                        {a.key: plain(a.value) for a in span.attributes}, resource,
                        span.status.code, span.start_time_unix_nano, span.end_time_unix_nano))

    def take_metrics(self, body: bytes) -> None:
        request = ExportMetricsServiceRequest.FromString(body)
        for resource_metrics in request.resource_metrics:
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    kind = metric.WhichOneof("data")
                    points = getattr(metric, kind).data_points
                    kept = self.metrics.setdefault(metric.name, [])
                    for point in points:
                        attributes = {a.key: plain(a.value) for a in point.attributes}
                        if kind == "histogram":
                            kept.append((attributes, (point.count, point.sum)))
                        else:
                            kept.append((attributes, point.as_double
                                         if point.HasField("as_double") else point.as_int))


class _Handler(http.server.BaseHTTPRequestHandler):
    receiver: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.receiver.token}".encode()):
            with self.receiver.changed:
                self.receiver.refused += 1
            self.send_response(401)
            self.end_headers()
            return
        with self.receiver.changed:
            if self.path == "/v1/traces":
                self.receiver.take_traces(body)
            elif self.path == "/v1/metrics":
                self.receiver.take_metrics(body)
            self.receiver.changed.notify_all()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        return None


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    receiver = Receiver(secrets.token_urlsafe(16))
    handler = type("Handler", (_Handler,), {"receiver": receiver})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
