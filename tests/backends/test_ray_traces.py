"""A trace crosses a Ray cluster (issue 49, decision 390): a session driven from here sends its
span's W3C context with each call — on the direct connection and through Ray — and the node,
whose own environment configures OpenTelemetry the standard way, exports its spans as
children of the driver's, so the receiver holds one trace made in two processes. Metrics of a
Ray session: the driver's call histogram, the sandbox's usage in the report, the node's own
count of open sessions. A real OTLP/HTTP receiver on 127.0.0.1, the real cluster.

``RayBackend`` is the remote client over ``RayTransport`` (decision 497): its transport carries
the caller's trace context beside each request, on the direct port and through Ray; the node's
``RemoteServer`` work is a span named by the operation, its child; the caller's workspace is
copied to the node and home (decision 491). One test covers both, which were two before."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolseam import Toolkit
from toolseam.ray import RayBackend

from ..host.test_traces import Traced
from ..support.otlp_receiver import Receiver, Span, otlp_receiver
from ..support.ray_cluster import RAY_TESTS, RayTestCluster, resource

pytestmark = RAY_TESTS
NODE = "traced"  # a node of its own: its environment carries the receiver's address


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as made:
        yield made


@pytest.fixture
async def traced_node(ray_cluster: RayTestCluster, receiver: Receiver) -> object:
    """A host-engine node whose processes export to ``receiver`` (as an operator configures a
    machine of a cluster), gone with the test."""
    token = urllib.parse.quote(f"Bearer {receiver.token}")
    ray_cluster.add_node(NODE, "host", env={
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization={token}",
        "OTEL_SERVICE_NAME": "toolseam-node", "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "300"})
    node_id = ray_cluster.node_id(NODE)
    ray_cluster.cluster.wait_for_nodes()
    yield node_id
    await ray_cluster.remove_node(NODE)  # gone before a later test's spread counts nodes


def node_sessions(receiver: Receiver) -> list[tuple[str, int]]:
    """The node's ``toolseam.sessions.open`` points, in the order they came."""
    return [(a.get("toolseam.ray.node.name"), value)
            for a, value in receiver.metrics.get("toolseam.sessions.open", [])]


def children(receiver: Receiver, parent: Span, name: str) -> list[Span]:
    return [s for s in receiver.named(name) if s.parent_id == parent.span_id]


async def test_node_spans_continue_the_drivers_trace_on_both_paths(
        ray_cluster: RayTestCluster, receiver: Receiver, traced_node: str,
        tmp_path: Path) -> None:
    (tmp_path / "seen.txt").write_text("hello\n")
    untraced = RayBackend(str(tmp_path), resources=resource(NODE),
                          address=ray_cluster.address)
    async with Toolkit(untraced) as tk:  # nobody traces here: the node makes no span either
        assert (await tk.call("bash", {"command": "echo quiet"})).output == "quiet\n"
    traced = Traced(receiver)
    try:
        reports = {}
        caller = traced.tracer_provider.get_tracer("an-agent")
        for path, direct in (("direct", True), ("ray", False)):
            backend = RayBackend(str(tmp_path), resources=resource(NODE),
                                 address=ray_cluster.address, direct=direct)
            with caller.start_as_current_span(f"turn {path}"):
                tk = Toolkit(backend)
                done = await tk.call("bash", {"command": f"cat seen.txt; echo {path} > {path}"})
                assert done.output == "hello\n"  # the caller's workspace, copied to the node
                assert backend.direct_connected is direct
                missing = await tk.call("read", {"path": "missing.txt"})
                assert missing.is_error
                if direct:  # the node counts it open (its own metrics, exported by itself)
                    receiver.wait_for(lambda r: (NODE, 1) in node_sessions(r))
                reports[path] = await tk.close()
            assert (tmp_path / path).read_text() == f"{path}\n"  # brought home at close
        traced.flush()
        receiver.wait_for(lambda r: len(r.named("toolseam node close")) == 2)
    finally:
        traced.close()
    # one trace per turn, made in two processes: the driver's spans and the node's
    for turn in (receiver.named("turn direct")[0], receiver.named("turn ray")[0]):
        spans = [s for s in receiver.spans if s.trace_id == turn.trace_id]
        assert {s.resource["service.name"] for s in spans} == {"toolseam-test",
                                                               "toolseam-node"}
        (bash,) = [s for s in spans if s.name == "execute_tool bash"]
        (started,) = children(receiver, bash, "toolseam node start")
        assert started.resource["service.name"] == "toolseam-node"
        assert started.attributes["toolseam.node"] == traced_node
        assert started.attributes["toolseam.ray.node.name"] == NODE
        assert started.attributes["toolseam.backend"] == "host"
        assert bash.start_ns <= started.start_ns and started.end_ns <= bash.end_ns
        assert bash.attributes["toolseam.node"] == traced_node
        (read,) = [s for s in spans if s.name == "execute_tool read"]
        read_there = [s for s in spans if s.parent_id == read.span_id]
        assert read_there and read_there[-1].name.startswith("toolseam node ")
        assert read_there[-1].attributes["error.type"] == "file_op"
        (opened,) = [s for s in spans if s.name == "toolseam open"]
        assert children(receiver, opened, "toolseam node open")
        (closed,) = [s for s in spans if s.name == "toolseam close"]
        assert children(receiver, closed, "toolseam node close")
    # the untraced session's calls were exported before these (one node, in order): none
    assert len(receiver.named("toolseam node start")) == 2
    # metrics: the driver's call histogram for the Ray backend, the sandbox's usage measured
    # on its node, and the node's own count of its open sessions
    receiver.wait_for(lambda r: "gen_ai.execute_tool.duration" in r.metrics
                      and "toolseam.sessions.open" in r.metrics)
    calls = {(a["gen_ai.tool.name"], a["toolseam.backend"]): value
             for a, value in receiver.metrics["gen_ai.execute_tool.duration"]}
    assert calls[("bash", "ray")][0] == 2
    assert all(report.cpu_seconds is not None for report in reports.values())
    receiver.wait_for(lambda r: node_sessions(r)[-1] == (NODE, 0))
    assert receiver.refused == 0
