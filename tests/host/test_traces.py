"""Traces and metrics through the OpenTelemetry SDK's own OTLP/HTTP exporters, received by a
listener the test starts on 127.0.0.1 that decodes the real protobuf (issue 49): GenAI
``execute_tool`` spans, CLI process spans, the session's own steps, the caller's and an MCP
request's trace context, content only when asked (masked, capped), and the standard
environment variables."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import toolseam
from toolseam import CouldNotRunError, Toolkit
from toolseam.testing.fake import FakeBackend

from ..support.otlp_receiver import Receiver, otlp_receiver

ERROR = 2  # opentelemetry.proto Status.STATUS_CODE_ERROR


class Traced:
    def __init__(self, receiver: Receiver, record_content: bool = False) -> None:
        self.receiver = receiver
        resource = Resource.create({"service.name": "toolseam-test"})
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
            endpoint=f"{receiver.endpoint}/v1/traces", headers=receiver.headers)))
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[
            PeriodicExportingMetricReader(OTLPMetricExporter(
                endpoint=f"{receiver.endpoint}/v1/metrics", headers=receiver.headers),
                export_interval_millis=3_600_000)])
        toolseam.instrument(tracer_provider=self.tracer_provider,
                            meter_provider=self.meter_provider, record_content=record_content,
                            content_limit=64)

    def flush(self) -> None:
        self.tracer_provider.force_flush()
        self.meter_provider.force_flush()

    def close(self) -> None:
        toolseam.uninstrument()
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


@pytest.fixture
def traced() -> Iterator[Traced]:
    with otlp_receiver() as receiver:
        made = Traced(receiver)
        try:
            yield made
        finally:
            made.close()


async def test_call_spans_follow_the_genai_and_cli_conventions(tmp_path: Path,
                                                               traced: Traced) -> None:
    caller = traced.tracer_provider.get_tracer("an-agent")
    with caller.start_as_current_span("agent turn") as turn:
        async with Toolkit("host", base_dir=str(tmp_path)) as tk:
            failed = await tk.call("bash", {"command": "echo hi; exit 3"}, call_id="c-1")
            await tk.call("read", {"path": "missing.txt"}, call_id="c-2")
            await tk.call("write", {"path": "w.txt", "content": "x"}, call_id="c-3")
    assert failed.metadata["exitCode"] == 3
    traced.flush()
    received = traced.receiver
    received.wait_for(lambda r: bool(r.named("toolseam close")))
    turn_id = format(turn.get_span_context().span_id, "016x")
    (bash,) = received.named("execute_tool bash")
    assert bash.parent_id == turn_id  # a child of the caller's current span
    assert bash.attributes["gen_ai.operation.name"] == "execute_tool"
    assert bash.attributes["gen_ai.tool.name"] == "bash"
    assert bash.attributes["gen_ai.tool.call.id"] == "c-1"
    assert bash.attributes["error.type"] == "exit_code" and bash.status_code == ERROR
    assert bash.attributes["toolseam.backend.kind"] == "host"
    assert "gen_ai.tool.call.arguments" not in bash.attributes  # content only when asked
    (command,) = [s for s in received.spans if s.parent_id == bash.span_id]
    assert command.attributes["process.exit.code"] == 3
    assert command.name == command.attributes["process.executable.name"]
    assert command.attributes["toolseam.process.timed_out"] is False
    assert command.attributes["toolseam.process.detached"] is False
    assert bash.start_ns <= command.start_ns and command.end_ns <= bash.end_ns + 10**7
    (read,) = received.named("execute_tool read")
    assert read.attributes["error.type"] == "tool_error"
    (write,) = received.named("execute_tool write")
    assert "error.type" not in write.attributes and write.status_code != ERROR
    (opened,) = received.named("toolseam open")
    assert opened.parent_id == turn_id and opened.attributes["toolseam.backend.kind"] == "host"
    assert {s.trace_id for s in received.spans} == {bash.trace_id}
    assert bash.resource["service.name"] == "toolseam-test"
    received.wait_for(lambda r: "gen_ai.execute_tool.duration" in r.metrics)
    points = received.metrics["gen_ai.execute_tool.duration"]
    by_tool = {(a["gen_ai.tool.name"], a["toolseam.outcome"]): value for a, value in points}
    assert by_tool[("bash", "error")][0] == 1 and by_tool[("write", "ok")][0] == 1
    assert received.refused == 0


async def test_a_lost_sandbox_is_the_spans_error_type(traced: Traced) -> None:
    backend = FakeBackend()
    async with Toolkit(backend, raise_could_not_run=True) as tk:
        backend.fail_with = CouldNotRunError("the sandbox container was removed",
                                             retryable=False, cause="sandbox_lost")
        with pytest.raises(CouldNotRunError):
            await tk.call("read", {"path": "x"})
        backend.fail_with = None
    traced.flush()
    traced.receiver.wait_for(lambda r: bool(r.named("execute_tool read")))
    (read,) = traced.receiver.named("execute_tool read")
    assert read.attributes["error.type"] == "sandbox_lost" and read.status_code == ERROR


async def test_an_mcp_traceparent_is_the_parent(tmp_path: Path, traced: Traced) -> None:
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with Toolkit("host", base_dir=str(tmp_path)) as tk:
        with toolseam.trace_parent({"traceparent": f"00-{trace_id}-{parent}-01"}):
            await tk.call("bash", {"command": "true"})
    traced.flush()
    traced.receiver.wait_for(lambda r: bool(r.named("execute_tool bash")))
    (bash,) = traced.receiver.named("execute_tool bash")
    assert (bash.trace_id, bash.parent_id) == (trace_id, parent)


def test_content_is_recorded_only_when_asked_masked_and_capped(tmp_path: Path) -> None:
    """An egress credential's value never reaches a span, whatever the command echoes."""
    secret = "s3cret-token-value-1234"
    settings: dict[str, Any] = {
        "limits": {"network": "egress"}, "egress_private": True,
        "egress_resolve": {"web.test": "127.0.0.1"}, "egress_allow": ["web.test:9"],
        "egress_credentials": [{"host": "web.test", "header": "Authorization",
                                "value_env": "OBS_TEST_TOKEN"}]}
    os.environ["OBS_TEST_TOKEN"] = secret
    try:
        with otlp_receiver() as receiver:
            traced = Traced(receiver, record_content=True)
            try:
                tk = toolseam.SyncToolkit("host", base_dir=str(tmp_path), settings=settings)
                tk.call("bash", {"command": f"echo {secret}; printf 'y%.0s' $(seq 200)"})
                report = tk.close()
                traced.flush()
                receiver.wait_for(lambda r: bool(r.named("execute_tool bash")))
            finally:
                traced.close()
    finally:
        del os.environ["OBS_TEST_TOKEN"]
    (bash,) = receiver.named("execute_tool bash")
    arguments = bash.attributes["gen_ai.tool.call.arguments"]
    result = bash.attributes["gen_ai.tool.call.result"]
    assert secret not in arguments and "[masked]" in arguments
    assert result.startswith("[masked]\nyyy") and result.endswith("more]")
    assert len(result) < 64 + 20
    assert all(secret not in str(v) for s in receiver.spans for v in s.attributes.values())
    assert report.calls == {"ok": 1}


def test_configured_by_the_standard_environment(tmp_path: Path) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT, _HEADERS and OTEL_SERVICE_NAME, nothing in code: the
    spans and the duration metric arrive, flushed as the process exits."""
    script = (
        "import asyncio\n"
        "from toolseam import Toolkit\n"
        "async def main():\n"
        f"    async with Toolkit('host', base_dir={str(tmp_path)!r}) as tk:\n"
        "        await tk.call('bash', {'command': 'true'})\n"
        "asyncio.run(main())\n")
    with otlp_receiver() as receiver:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
                   OTEL_EXPORTER_OTLP_HEADERS=f"authorization=Bearer%20{receiver.token}",
                   OTEL_SERVICE_NAME="my-agent")
        subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
        receiver.wait_for(lambda r: bool(r.named("execute_tool bash"))
                          and "gen_ai.execute_tool.duration" in r.metrics)
    (bash,) = receiver.named("execute_tool bash")
    assert bash.resource["service.name"] == "my-agent"
    assert {"toolseam open", "toolseam close"} <= {s.name for s in receiver.spans}


async def test_an_attach_is_a_span_and_its_session_goes_on(tmp_path: Path,
                                                           traced: Traced) -> None:
    tk = Toolkit("host", base_dir=str(tmp_path), settings={"orphan_timeout_s": 30})
    await tk.call("bash", {"command": "true"})
    handle = await tk.detach()
    back = await Toolkit.attach(handle)
    await back.call("bash", {"command": "true"})
    report = await back.close()
    assert report.calls == {"ok": 1}
    traced.flush()
    traced.receiver.wait_for(lambda r: bool(r.named("toolseam attach"))
                             and len(r.named("execute_tool bash")) == 2)
    (attach,) = traced.receiver.named("toolseam attach")
    assert attach.status_code != ERROR


async def test_branching_steps_are_spans_of_the_session(tmp_path: Path, traced: Traced) -> None:
    """snapshot, restore, fork and keep are steps of the session's life, as open and close
    are: each a ``toolseam {step}`` span under the caller's span, with the session's kind."""
    (tmp_path / "f.txt").write_text("one\n")
    caller = traced.tracer_provider.get_tracer("an-agent")
    with caller.start_as_current_span("best of two") as turn:
        async with Toolkit("host", base_dir=str(tmp_path)) as tk:
            snap = await tk.snapshot()
            await tk.restore(snap)
            children = await tk.fork(2)
            try:
                first = children[0]
                assert isinstance(first, Toolkit)
                await first.call("write", {"path": "f.txt", "content": "two\n"})
                await first.keep()
            finally:
                for child in children:
                    if isinstance(child, Toolkit):
                        await child.close()
    traced.flush()
    received = traced.receiver
    steps = ("toolseam snapshot", "toolseam restore", "toolseam fork", "toolseam keep")
    received.wait_for(lambda r: all(r.named(step) for step in steps))
    turn_id = format(turn.get_span_context().span_id, "016x")
    for step in steps:
        (span,) = received.named(step)
        assert span.parent_id == turn_id, step
        assert span.attributes["toolseam.backend.kind"] == "host", step
    (fork,) = received.named("toolseam fork")
    assert fork.attributes["toolseam.fork.count"] == 2
    assert (tmp_path / "f.txt").read_text() == "two\n"  # the kept branch came home
