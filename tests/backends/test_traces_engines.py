"""Traces on every engine (issue 49), through the SDK's OTLP/HTTP exporter to a receiver on
127.0.0.1: the session's spans name the backend's kind and image; a container removed under a
call is a span whose ``error.type`` is ``sandbox_lost``; a pool's hand-out is a claim span and
its counter and latency."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolseam import SandboxPool, Toolkit

from ..host.test_traces import Traced
from ..support.contract_bindings import pool_factory
from ..support.engines import ALL_ENGINES, backend
from ..support.otlp_receiver import otlp_receiver

pytestmark = pytest.mark.engines
KINDS = {"podman": "podman", "podman-rootless": "podman", "podman-remote": "podman",
         "docker": "docker", "docker-remote": "docker"}


@pytest.fixture
def traced() -> Iterator[Traced]:
    with otlp_receiver() as receiver:
        made = Traced(receiver)
        try:
            yield made
        finally:
            made.close()


@pytest.mark.parametrize("engine", ALL_ENGINES)
async def test_spans_name_the_engine_and_a_lost_sandbox(engine: str, workspace: Path,
                                                        traced: Traced) -> None:
    sandbox = backend(engine, str(workspace))
    tk = Toolkit(sandbox)
    try:
        ok = await tk.call("bash", {"command": "echo hi"})
        assert ok.output == "hi\n"
        container = sandbox.sandbox.container  # type: ignore[attr-defined]
        await asyncio.to_thread(sandbox.sandbox.engine.remove, container)  # type: ignore[attr-defined]
        lost = await tk.call("bash", {"command": "true"})
        assert lost.metadata["cause"] == "sandbox_lost", lost.metadata
    finally:
        await asyncio.gather(tk.close(), return_exceptions=True)  # copy mode: kept, said so
    traced.flush()
    traced.receiver.wait_for(lambda r: len(r.named("execute_tool bash")) == 2)
    first, second = sorted(traced.receiver.named("execute_tool bash"), key=lambda s: s.start_ns)
    assert first.attributes["toolseam.backend.kind"] == KINDS[engine]
    assert first.attributes["container.image.name"]
    assert "error.type" not in first.attributes
    assert second.attributes["error.type"] == "sandbox_lost"
    (opened,) = traced.receiver.named("toolseam open")
    assert opened.attributes["container.image.name"] == first.attributes["container.image.name"]


async def test_a_pool_claim_is_a_span_a_count_and_a_latency(workspace: Path,
                                                           traced: Traced) -> None:
    async with SandboxPool(pool_factory("docker"), size=1) as pool:
        tk = await pool.toolkit(workspace)
        await tk.call("bash", {"command": "true"})
        await tk.close()
    traced.flush()
    received = traced.receiver
    received.wait_for(lambda r: bool(r.named("toolseam pool claim"))
                      and "toolseam.pool.claim.duration" in r.metrics)
    (claim,) = received.named("toolseam pool claim")
    assert claim.attributes["toolseam.pool.id"] == pool.pool_id
    assert [v for a, v in received.metrics["toolseam.pool.claims"]
            if a["toolseam.outcome"] == "ok"] == [1]
