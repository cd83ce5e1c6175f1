"""Live output through the cluster (issue 39, item 2): a streamed start's chunks reach the
caller while the command runs on its node, not when the call returns (toolseam/ray/streaming.py)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from toolseam import Toolkit
from toolseam.ray import RayBackend
from toolseam.seam.models import OutputChunk, PathRef, SpawnRequest

from ..support.ray_cluster import NODES, RAY_TESTS, RayTestCluster, assert_node_empty, resource

pytestmark = RAY_TESTS

PATH = {"PATH": "/usr/local/bin:/usr/bin:/bin"}


def spawn(command: str, **fields: Any) -> SpawnRequest:
    return SpawnRequest(job=f"s-{uuid.uuid4().hex[:8]}", argv=["/bin/sh", "-c", command],
                        cwd="/workspace", env=PATH, **fields)


@pytest.mark.parametrize("node", sorted(NODES))
async def test_the_first_chunk_arrives_before_the_command_ends(
        ray_cluster: RayTestCluster, node: str) -> None:
    backend = RayBackend(resources=resource(node), address=ray_cluster.address)
    await backend.open()
    try:
        arrived: list[tuple[float, OutputChunk]] = []
        request = spawn("echo first; sleep 2; echo second; echo late >&2", stream=True)
        status = await backend.start(request, lambda c: arrived.append((time.monotonic(), c)))
        ended = time.monotonic()
        await backend.release(request.job)
        assert (status.state, status.exit_code) == ("exited", 0)
        # the first line was here while the command still slept its 2 s on the node
        assert arrived[0][1] == OutputChunk(stream="stdout", text="first\n")
        assert ended - arrived[0][0] > 1.5, [(round(ended - t, 2), c.text) for t, c in arrived]
        # every chunk, in order, and nothing the status does not hold
        def by_stream(chunks: list[OutputChunk]) -> dict[str, str]:
            return {name: "".join(c.text for c in chunks if c.stream == name)
                    for name in ("stdout", "stderr")}
        assert by_stream([c for _, c in arrived]) == by_stream(status.chunks) == {
            "stdout": "first\nsecond\n", "stderr": "late\n"}
    finally:
        await backend.close()
    await assert_node_empty(ray_cluster, node)


async def test_a_streamed_bash_call_matches_the_plain_one(ray_cluster: RayTestCluster) -> None:
    """Streaming changes when chunks arrive, never the result a model reads."""
    async with Toolkit(RayBackend(resources=resource("docker"), address=ray_cluster.address)
                       ) as tk:
        command = "for i in 1 2 3; do echo out$i; echo err$i >&2; done; exit 4"
        seen: list[str] = []
        streamed = await tk.call("bash", {"command": command},
                                 on_output=lambda c: seen.append(c.text))
        plain = await tk.call("bash", {"command": command})
    assert (streamed.is_error, streamed.output) == (plain.is_error, plain.output)
    assert "".join(seen).count("out") == 3


async def test_cancelling_a_streamed_call_ends_the_job_on_the_node(
        ray_cluster: RayTestCluster) -> None:
    backend = RayBackend(resources=resource("docker"), address=ray_cluster.address)
    await backend.open()
    try:
        marker = f"stream-cancel-{uuid.uuid4().hex[:8]}"
        first = asyncio.Event()
        request = spawn(f"echo go; exec sleep 30 # {marker}", stream=True)
        call = asyncio.ensure_future(backend.start(request, lambda c: first.set()))
        await asyncio.wait_for(first.wait(), 20)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # the session goes on, and the cancelled job is no longer running there
        status = await backend.kill(request.job)
        assert status.state != "running"
        assert (await backend.start(spawn("echo still here"))).output == "still here\n"
    finally:
        await backend.close()


async def test_another_job_cannot_stream_a_session_it_was_not_handed(
        ray_cluster: RayTestCluster) -> None:
    import ray

    from toolseam.ray import cluster
    backend = RayBackend(resources=resource("docker"), address=ray_cluster.address)
    await backend.open()
    try:
        actor = cluster.node_actor(ray, ray_cluster.node_id("docker"))
        sid = backend.session_id
        refused = ("err", "host", "HostError",
                   f"no session {sid[:8]}… on {backend.where} answers this handle")
        marker = f"not-yours-{uuid.uuid4().hex[:8]}"
        request = spawn(f"echo {marker} > stolen.txt; echo leaked", stream=True)
        assert await actor.start_live.remote(sid, "guessed", request) == refused
        assert await actor.live_next.remote(sid, "guessed", request.job) == refused
        assert await actor.live_cancel.remote(sid, "guessed", request.job) == refused
        # nothing ran: the holder's own session has no such file
        listing = await backend.list_dir(PathRef(base="/workspace", path="."), 100)
        assert "stolen.txt" not in listing.entries
    finally:
        await backend.close()
