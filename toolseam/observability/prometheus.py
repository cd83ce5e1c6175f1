"""The live sessions' figures for Prometheus, through the OpenTelemetry SDK's Prometheus reader
(the ``otel`` extra): observable instruments whose callbacks read every live session of this
user (``live.py``) — or of one process, for ``toolseam mcp --http`` — once per scrape, and a
``/metrics`` HTTP endpoint that wants a bearer token."""

from __future__ import annotations

import hmac
import http.server
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ..seam.errors import ConfigurationError
from .live import live_sessions

_FRESH_S = 1.0  # one pass over the sessions serves every instrument of a scrape


class SessionGauges:
    """Observable instruments whose callbacks read the live sessions (once per scrape)."""

    def __init__(self, provider: MeterProvider,
                 source: Callable[[], list[dict[str, Any]]] = live_sessions) -> None:
        self._source = source
        self._rows: list[dict[str, Any]] = []
        self._at = 0.0
        self._lock = threading.Lock()
        meter = provider.get_meter("toolseam")
        meter.create_observable_up_down_counter(
            "toolseam.sessions.open", [self._open], unit="{session}",
            description="Live sessions of this user on this machine.")
        meter.create_observable_counter(
            "toolseam.session.cpu.time", [self._cpu], unit="s",
            description="CPU time of each session's sandbox.")
        meter.create_observable_gauge(
            "toolseam.session.memory.usage", [self._memory], unit="By",
            description="Memory each session's sandbox uses now.")
        meter.create_observable_gauge(
            "toolseam.session.pids", [self._pids], unit="{process}",
            description="Processes in each session's sandbox.")
        meter.create_observable_counter(
            "toolseam.session.calls", [self._calls], unit="{call}",
            description="Tool calls of each session, by outcome.")
        for what in ("connections", "bytes", "refused"):
            meter.create_observable_counter(
                f"toolseam.egress.{what}", [self._egress(what)],
                unit="By" if what == "bytes" else "{connection}",
                description=f"Egress {what} of each session, by host.")

    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            if time.monotonic() - self._at > _FRESH_S:
                self._rows, self._at = self._source(), time.monotonic()
            return self._rows

    @staticmethod
    def _labels(row: dict[str, Any]) -> dict[str, Any]:
        return {"session.id": row["id"], "toolseam.backend": row["backend"]}

    def _open(self, _: CallbackOptions) -> Iterable[Observation]:
        counts: dict[str, int] = {}
        for row in self.rows():
            counts[row["backend"]] = counts.get(row["backend"], 0) + 1
        return [Observation(n, {"toolseam.backend": b}) for b, n in counts.items()]

    def _figure(self, name: str) -> Iterable[Observation]:
        return [Observation(row[name], self._labels(row)) for row in self.rows()
                if row.get(name) is not None]

    def _cpu(self, _: CallbackOptions) -> Iterable[Observation]:
        return self._figure("cpu_seconds")

    def _memory(self, _: CallbackOptions) -> Iterable[Observation]:
        return self._figure("memory_bytes")

    def _pids(self, _: CallbackOptions) -> Iterable[Observation]:
        return self._figure("pids")

    def _calls(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {**self._labels(row), "toolseam.outcome": outcome})
                for row in self.rows() for outcome, n in row["calls_by_outcome"].items()]

    def _egress(self, what: str) -> Any:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            return [Observation(totals[what], {**self._labels(row), "server.address": host})
                    for row in self.rows() for host, totals in row["egress"].items()]
        return observe


def sessions_registry(source: Callable[[], list[dict[str, Any]]] = live_sessions
                      ) -> CollectorRegistry:
    """A registry whose scrape reads the sessions ``source`` lists (every live one of this
    user unless told otherwise)."""
    registry = CollectorRegistry()
    SessionGauges(MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)]),
                  source)
    return registry


class OneFamilyPerName(Collector):
    """Several registries as one exposition, a name's first family kept: the sessions' gauges
    and a process's own instruments both have ``toolseam_sessions_open`` (and ``target_info``),
    and the text format allows one family (one ``# TYPE`` line) per name."""

    def __init__(self, *registries: CollectorRegistry) -> None:
        self._registries = registries

    def collect(self) -> Iterator[Metric]:
        seen: set[str] = set()
        for registry in self._registries:
            for family in registry.collect():
                if family.name not in seen:
                    seen.add(family.name)
                    yield family


def make_server(listen: str, token: str) -> http.server.ThreadingHTTPServer:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigurationError(f"--listen {listen!r}: give HOST:PORT")
    registry = sessions_registry()
    expected = f"Bearer {token}".encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            given = self.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Bearer realm="toolseam metrics"')
                self.end_headers()
                return
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_response(404)
                self.end_headers()
                return
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            return None

    return http.server.ThreadingHTTPServer((host.strip("[]"), int(port)), Handler)


