"""A session's tool calls on a direct connection to its node actor (toolseam/ray/direct.py,
decision 312): the same answers as through Ray, only for the holder of the session's secret,
no code run from a crafted pickle, and a dropped connection is a call that may have run — never
a success, never a session silently lost while its node is there."""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from toolseam import Toolkit
from toolseam.backends.remote.handshake import derived_key, nonce, proof
from toolseam.backends.remote.server import SESSION_LABEL
from toolseam.ray import RayBackend
from toolseam.ray import cluster as ray_cluster_module
from toolseam.ray.direct import HELLO, HELLO_TIMEOUT_S
from toolseam.seam.errors import CouldNotRunError

from ..support.ray_cluster import RAY_TESTS, RayTestCluster, resource
from .test_ray_cluster import make_tree, run_calls

pytestmark = RAY_TESTS


def framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


async def answer_or_eof(reader: asyncio.StreamReader) -> Any:
    """The node's one answer, or None when it closed the connection without one."""
    try:
        (length,) = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), 10))
        body = await asyncio.wait_for(reader.readexactly(length), 10)
    except (asyncio.IncompleteReadError, ConnectionResetError):
        return None
    return pickle.loads(body)


async def closed(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), 10) == b""
    except ConnectionResetError:
        return True


class Planted:
    """A pickle that would create ``path`` on the node if anything unpickled it blindly."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


async def test_direct_calls_answer_exactly_as_calls_through_ray(
        ray_cluster: RayTestCluster, workspace: Path) -> None:
    roots = {}
    for name in ("direct", "ray"):
        roots[name] = workspace / name
        roots[name].mkdir()
        roots[name].chmod(0o777)
        make_tree(roots[name])
    direct = RayBackend(str(roots["direct"]), resources=resource("podman"),
                        address=ray_cluster.address)
    through_ray = RayBackend(str(roots["ray"]), resources=resource("podman"),
                             address=ray_cluster.address, direct=False)
    async with Toolkit(direct) as a, Toolkit(through_ray) as b:
        assert direct.direct_connected and not through_ray.direct_connected
        assert await run_calls(a) == await run_calls(b)
        big = "0123456789abcde\n" * (3 << 16)  # 3 MiB each way, past any socket buffer
        for tk in (a, b):
            assert not (await tk.call("write", {"path": "big.txt", "content": big})).is_error
            counted = await tk.call("bash", {"command": "wc -c < big.txt; cat big.txt"})
            assert counted.output.startswith(f"{len(big)}\n")


async def test_a_node_this_process_cannot_reach_directly_is_served_through_ray(
        ray_cluster: RayTestCluster) -> None:
    """A firewall between the driver and the node's direct port: the session works through
    Ray, and later sessions of this process do not wait for the port again."""
    node = ray_cluster.node_id("docker")
    first = RayBackend(resources=resource("docker"), address=ray_cluster.address)
    await first.open()
    known = ray_cluster_module.node_direct(node)
    assert known is not None
    with socket.socket() as unused:  # a port nobody listens on
        unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]
    ray_cluster_module._direct[node] = ("127.0.0.1", closed_port)
    try:
        backend = RayBackend(resources=resource("docker"), address=ray_cluster.address)
        async with Toolkit(backend) as tk:
            assert not backend.direct_connected
            assert ray_cluster_module.node_direct(node) is None
            assert (await tk.call("bash", {"command": "echo via-ray"})).output == "via-ray\n"
    finally:
        ray_cluster_module._direct[node] = known
        await first.close()


async def test_the_direct_port_answers_only_a_sessions_secret_and_runs_no_pickle(
        ray_cluster: RayTestCluster, tmp_path: Path) -> None:
    """Another job of the cluster (or a local user) that finds the port: a wrong key or an
    unknown session gets the same refusal; a silent peer is dropped; a pickle sent before or
    after a hello is never run; a name that is not a seam call is refused; the session itself
    goes on. The hello carries no secret: both ends prove the session's key (decision 337)."""
    backend = RayBackend(resources=resource("docker"), address=ray_cluster.address)
    async with Toolkit(backend) as tk:
        at = ray_cluster_module.node_direct(backend.node_id or "")
        assert at is not None and at[0] == "127.0.0.1"
        sid = backend.session_id.encode()

        async def hello(session: bytes, secret: bytes) -> tuple[Any, Any]:
            reader, writer = await asyncio.open_connection(*at)
            mine = nonce()
            writer.write(framed(b"\0".join((HELLO, session, mine.encode()))))
            (length,) = struct.unpack(">I", await reader.readexactly(4))
            theirs = (await reader.readexactly(length)).split(b"\0")[0].decode()
            writer.write(framed(proof(derived_key(secret.decode(), SESSION_LABEL), "caller",
                                      session.decode(), mine, theirs).encode()))
            return reader, writer

        refusals = []
        for session, secret in ((sid, b"not-the-secret"), (b"f" * 32, b"not-the-secret")):
            reader, writer = await hello(session, secret)
            answer = await answer_or_eof(reader)
            assert answer[0] == "err" and "answers this handle" in answer[1]["message"]
            refusals.append(answer[1]["message"].replace(session[:8].decode(), "<sid>"))
            assert await closed(reader)
            writer.close()
        assert refusals[0] == refusals[1]  # nothing to tell unknown from not-yours

        marker = tmp_path / "ran"
        # before any hello: the frame is never unpickled
        reader, writer = await asyncio.open_connection(*at)
        writer.write(framed(pickle.dumps(Planted(str(marker)))))
        assert await answer_or_eof(reader) is None
        writer.close()
        # a peer that says nothing is dropped after HELLO_TIMEOUT_S
        reader, writer = await asyncio.open_connection(*at)
        began = time.monotonic()
        assert await closed(reader)
        assert HELLO_TIMEOUT_S - 0.5 <= time.monotonic() - began < HELLO_TIMEOUT_S + 5
        writer.close()
        # a hello claiming more than a hello may be: dropped unread
        reader, writer = await asyncio.open_connection(*at)
        writer.write(struct.pack(">I", 1 << 30))
        assert await closed(reader)
        writer.close()
        # with the right secret: a crafted pickle is refused, a non-seam name is an error
        reader, writer = await hello(sid, backend._secret.encode())
        assert (await answer_or_eof(reader)) == ("ok", None)
        writer.write(framed(pickle.dumps((1, "close", (), None))))
        req, refused = await answer_or_eof(reader)
        assert req == 1 and refused[0] == "err" and "not a seam call" in refused[1]["message"]
        writer.write(framed(pickle.dumps((2, "stat", (Planted(str(marker)),), None))))
        assert await answer_or_eof(reader) is None  # the connection ends, nothing ran
        writer.close()
        assert not marker.exists()
        assert (await tk.call("bash", {"command": "echo still"})).output == "still\n"
        assert backend.direct_connected


async def test_a_dropped_connection_fails_the_call_in_flight_and_the_session_goes_on(
        ray_cluster: RayTestCluster) -> None:
    """A dropped direct port with its node actor answering is ``server_gone=False`` (the
    remote client's rule, which ``RayBackend`` is: decision 497)."""
    backend: Any = RayBackend(resources=resource("rootless"), address=ray_cluster.address)
    connection = backend.transport
    async with Toolkit(backend, raise_could_not_run=True) as tk:
        assert connection.direct_connected
        in_flight = asyncio.ensure_future(tk.call("bash", {"command": "sleep 3; echo late"}))
        await asyncio.sleep(0.5)
        assert connection._link is not None
        connection._link._writer.transport.abort()  # the network dropped it; the node is there
        with pytest.raises(CouldNotRunError) as caught:
            await asyncio.wait_for(in_flight, 10)
        assert caught.value.retryable is False
        assert "may have run" in caught.value.reason and "dropped" in caught.value.reason
        # not a lost node: the next call answers (through Ray now)
        assert (await tk.call("bash", {"command": "echo on"})).output == "on\n"
        assert not connection.direct_connected
