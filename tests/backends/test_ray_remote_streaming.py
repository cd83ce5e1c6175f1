"""Live output through Ray as the remote backend's transport (issue 47, item 2): a streamed
``start``'s chunks reach the caller while the command runs on its node — on the node's direct
port and through Ray calls alike —, the egress stream delivers while the session lives (so a
remote session on a node reaches the caller's proxy), and nobody but the session's holder can
begin, follow or end a stream of it (toolseam/ray/streaming.py, node_remote.py)."""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from toolseam import Toolkit
from toolseam.backends.remote import HostedSpec, RemoteBackend
from toolseam.backends.remote.codec import dumps, loads
from toolseam.ray import actors
from toolseam.ray.placement import Placement
from toolseam.ray.transport import RayTransport
from toolseam.seam.models import OutputChunk, PathRef, SpawnRequest

from ..support.egress_servers import serve, static_handler
from ..support.processes import host_survivors
from ..support.ray_cluster import RAY_TESTS, RayTestCluster, assert_node_empty, resource

pytestmark = RAY_TESTS

PATH = {"PATH": "/usr/local/bin:/usr/bin:/bin"}


def spawn(command: str, **fields: Any) -> SpawnRequest:
    return SpawnRequest(job=f"s-{uuid.uuid4().hex[:8]}", argv=["/bin/sh", "-c", command],
                        cwd="/workspace", env=PATH, **fields)


def on_docker(ray_cluster: RayTestCluster, direct: bool = True) -> RemoteBackend:
    return RemoteBackend(transport=RayTransport(Placement(resource("docker")),
                                                ray_cluster.address, direct=direct),
                         hosted=HostedSpec(kind="docker"))


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    root = tmp_path_factory.mktemp("upstream")
    (root / "hello.txt").write_text("hello from the upstream\n")
    with serve(static_handler(root)) as port:
        yield port


def by_stream(chunks: list[OutputChunk]) -> dict[str, str]:
    return {name: "".join(c.text for c in chunks if c.stream == name)
            for name in ("stdout", "stderr")}


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


FETCH = ("import sys, urllib.request, urllib.error\n"
         "try:\n"
         "    body = urllib.request.urlopen(sys.argv[1], timeout=30).read().decode()\n"
         "    print('200', body)\n"
         "except urllib.error.HTTPError as error:\n"
         "    print(error.code, error.read().decode()[:200])\n")


async def test_a_remote_session_in_egress_mode_reaches_only_the_allowed_host(
        ray_cluster: RayTestCluster, upstream: int) -> None:
    """The sandbox's connections come to this process's proxy as events of one long stream
    (``backends/remote/egress.py``): delivered while the session lives, they reach the
    allowed host and are refused another, in this process's log."""
    settings = {"limits": {"network": "egress"}, "egress_allow": [f"web.test:{upstream}"],
                "egress_resolve": {"web.test": "127.0.0.1", "other.test": "127.0.0.1"},
                "egress_private": True}
    backend = RemoteBackend(transport=RayTransport(Placement(resource("docker")),
                                                   ray_cluster.address),
                            hosted=HostedSpec(kind="docker",
                                              options={"limits": {"network": "egress"}}))
    async with Toolkit(backend, settings=settings) as tk:
        assert (await tk.call("write", {"path": "fetch.py", "content": FETCH})).is_error is False
        allowed = await asyncio.wait_for(tk.call("bash", {
            "command": f"python3 fetch.py http://web.test:{upstream}/hello.txt"}), 60)
        assert allowed.output.startswith("200 hello from the upstream"), allowed.output
        refused = await tk.call("bash", {
            "command": f"python3 fetch.py http://other.test:{upstream}/"})
        assert refused.output.startswith("403"), refused.output
        assert [(e.host, e.allowed, e.status) for e in tk.egress_log()] == [
            ("web.test", True, 200), ("other.test", False, 403)]
        # no way around the proxy: the sandbox on the node has loopback alone
        direct = await tk.call("bash", {"command": (
            "python3 -c \"import socket; s=socket.socket(); s.settimeout(3); "
            f"print(s.connect_ex(('127.0.0.1', {upstream})))\"")})
        assert direct.output.strip() != "0", direct.output
    await assert_node_empty(ray_cluster, "docker")
