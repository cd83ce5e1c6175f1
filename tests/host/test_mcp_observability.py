"""Observability of ``toolseam mcp --http`` as a process (issue 49): a client's
``params._meta.traceparent`` is the parent of the MCP SDK's ``tools/call {name}`` server span,
whose child is the call's ``execute_tool`` span — received by the test's OTLP receiver from the
server's own exporter, configured the standard way."""

from __future__ import annotations

import os
from pathlib import Path

from ..support.mcp import connect, start_http, stop
from ..support.otlp_receiver import otlp_receiver


async def test_an_mcp_clients_traceparent_is_the_parent_of_the_call(tmp_path: Path) -> None:
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with otlp_receiver() as receiver:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
                   OTEL_EXPORTER_OTLP_HEADERS=f"authorization=Bearer%20{receiver.token}",
                   OTEL_BSP_SCHEDULE_DELAY="100", OTEL_SERVICE_NAME="toolseam-mcp")
        url, process = start_http(tmp_path, tmp_path.parent / f"{tmp_path.name}.log", env=env)
        try:
            async with connect(url) as client:
                traced = await client.call_tool("bash", {"command": "true"},
                                                meta={"traceparent": f"00-{trace_id}-{parent}-01"})
                untraced = await client.call_tool("bash", {"command": "exit 4"})
            assert not traced.is_error and untraced.is_error
            receiver.wait_for(lambda r: len(r.named("execute_tool bash")) == 2
                              and len(r.named("tools/call bash")) == 2, timeout=60)
        finally:
            stop(process)
    calls = sorted(receiver.named("tools/call bash"), key=lambda s: s.start_ns)
    tools = sorted(receiver.named("execute_tool bash"), key=lambda s: s.start_ns)
    assert (calls[0].trace_id, calls[0].parent_id) == (trace_id, parent)  # the client's span
    assert (tools[0].trace_id, tools[0].parent_id) == (trace_id, calls[0].span_id)
    assert tools[0].resource["service.name"] == "toolseam-mcp"
    assert calls[1].parent_id == "" and calls[1].trace_id != trace_id  # no traceparent: a root
    assert (tools[1].trace_id, tools[1].parent_id) == (calls[1].trace_id, calls[1].span_id)
    assert tools[1].attributes["error.type"] == "exit_code"
    assert receiver.refused == 0
