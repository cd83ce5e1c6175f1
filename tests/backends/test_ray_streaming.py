"""Live output through the cluster (issue 39, item 2): a streamed start's chunks reach the
caller while the command runs on its node, not when the call returns (toolseam/ray/streaming.py)."""

from __future__ import annotations

import asyncio
import secrets
import time

import pytest

from toolseam import Toolkit
from toolseam.ray import RayBackend
from toolseam.seam.models import OutputChunk

from ..support.processes import host_survivors
from ..support.ray_cluster import NODES, RAY_TESTS, RayTestCluster, assert_node_empty, resource
from ..support.ray_streams import by_stream, spawn

pytestmark = RAY_TESTS

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
        assert by_stream([c for _, c in arrived]) == by_stream(status.chunks) == {
            "stdout": "first\nsecond\n", "stderr": "late\n"}
    finally:
        await backend.close()
    await assert_node_empty(ray_cluster, node)


async def test_a_streamed_bash_call_matches_the_plain_one(ray_cluster: RayTestCluster) -> None:
    """Streaming changes when chunks arrive, never the result a model reads."""
    async with Toolkit(RayBackend(resources=resource("docker"), address=ray_cluster.address)
                       ) as tk:
        # the streams apart in time: two pipes written at once arrive in either order
        command = "for i in 1 2 3; do echo out$i; done; sleep 0.2; echo err >&2; exit 4"
        seen: list[str] = []
        streamed = await tk.call("bash", {"command": command},
                                 on_output=lambda c: seen.append(c.text))
        plain = await tk.call("bash", {"command": command})
    assert (streamed.is_error, streamed.output) == (plain.is_error, plain.output)
    assert "".join(seen).count("out") == 3


async def test_closing_a_streamed_call_early_ends_its_command_on_the_node(
        ray_cluster: RayTestCluster) -> None:
    """``call_stream`` closed after the first output: the command ends on the node (the bash
    tool kills what it abandons, as locally) and the session goes on."""
    async with Toolkit(RayBackend(resources=resource("docker"), address=ray_cluster.address)
                       ) as tk:
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
