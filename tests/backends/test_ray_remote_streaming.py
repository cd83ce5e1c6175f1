"""Live output through Ray as the remote backend's transport (issue 47, item 2): a streamed
``start``'s chunks reach the caller while the command runs on its node — on the node's direct
port and through Ray calls alike —, and nobody but the session's holder can begin, follow or
end a stream of it (toolseam/ray/streaming.py, node_remote.py). The egress stream's test is
with the other egress tests (test_ray_egress.py)."""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid

import pytest

from toolseam import Toolkit
from toolseam.backends.remote import HostedSpec, RemoteBackend
from toolseam.backends.remote.codec import dumps, loads
from toolseam.ray import actors
from toolseam.ray.placement import Placement
from toolseam.ray.transport import RayTransport
from toolseam.seam.models import OutputChunk, PathRef

from ..support.processes import host_survivors
from ..support.ray_cluster import RAY_TESTS, RayTestCluster, assert_node_empty, resource
from ..support.ray_streams import by_stream, spawn

pytestmark = RAY_TESTS

def on_docker(ray_cluster: RayTestCluster, direct: bool = True) -> RemoteBackend:
    return RemoteBackend(transport=RayTransport(Placement(resource("docker")),
                                                ray_cluster.address, direct=direct),
                         hosted=HostedSpec(kind="docker"))


@pytest.mark.parametrize("route", ["direct", "ray"])
async def test_the_first_chunk_arrives_before_the_command_ends(
        ray_cluster: RayTestCluster, route: str) -> None:
    backend = on_docker(ray_cluster, direct=route == "direct")
    await backend.open()
    try:
        assert (await backend.stat(PathRef(base="/workspace", path="."))).kind == "dir"
        assert backend.transport.direct_connected == (route == "direct")  # type: ignore[attr-defined]
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
        assert by_stream([c for _, c in arrived]) == by_stream(status.chunks) == {
            "stdout": "first\nsecond\n", "stderr": "late\n"}
    finally:
        await backend.close()
    await assert_node_empty(ray_cluster, "docker")


async def test_a_streamed_bash_call_matches_the_plain_one_and_closing_early_ends_it(
        ray_cluster: RayTestCluster) -> None:
    """Streaming changes when chunks arrive, never the result a model reads; a stream closed
    after its first output ends its command on the node, and the session goes on."""
    async with Toolkit(on_docker(ray_cluster)) as tk:
        command = "for i in 1 2 3; do echo out$i; done; sleep 0.2; echo err >&2; exit 4"
        seen: list[str] = []
        streamed = await tk.call("bash", {"command": command},
                                 on_output=lambda c: seen.append(c.text))
        plain = await tk.call("bash", {"command": command})
        assert (streamed.is_error, streamed.output) == (plain.is_error, plain.output)
        assert "".join(seen).count("out") == 3
        marker = f"30.{secrets.randbelow(10**9):09}"  # sleep's own argument: its command line
        stream = tk.call_stream("bash", {"command": f"echo go; sleep {marker}"})
        first = await asyncio.wait_for(anext(stream), 20)
        assert getattr(first, "text", None) == "go\n"
        assert host_survivors(marker)
        await stream.aclose()  # type: ignore[attr-defined]  # an async generator's
        deadline = time.monotonic() + 10
        while host_survivors(marker):
            assert time.monotonic() < deadline, host_survivors(marker)
            await asyncio.sleep(0.2)
        assert (await tk.call("bash", {"command": "echo still here"})).output == "still here\n"
    await assert_node_empty(ray_cluster, "docker")


async def test_another_job_cannot_stream_a_session_it_was_not_handed(
        ray_cluster: RayTestCluster) -> None:
    import ray  # the ray extra: imported where a test needs it, as the other Ray tests do

    backend = on_docker(ray_cluster)
    await backend.open()
    try:
        actor = actors.node_actor(ray, ray_cluster.node_id("docker"))
        sid = backend.session_id
        marker = f"not-yours-{uuid.uuid4().hex[:8]}"
        request = (sid, "guessed", "start",
                   (spawn(f"echo {marker} > stolen.txt; echo leaked", stream=True),), {})
        for step in ("begin", "next", "cancel"):
            events, answer = loads(await actor.remote_live.remote(
                dumps((step, "s1", sid, "guessed", request, None)), "intruder", 60.0))
            assert events == [] and answer[0] == "err", (step, answer)
            assert f"no session {sid[:8]}" in answer[1]["message"], answer
        # nothing ran: the holder's own session has no such file
        listing = await backend.list_dir(PathRef(base="/workspace", path="."), 100)
        assert "stolen.txt" not in listing.entries
    finally:
        await backend.close()
