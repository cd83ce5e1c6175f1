"""Both ends of the direct connection toolseam opens across a Ray cluster prove the shared key
before either sends anything of value (toolseam/backends/remote/handshake.py,
toolseam/ray/direct.py; decision 337): a listener that merely sits where the other end should
be — an impostor actor's port — is sent no call, no request and no secret, and nothing it
answers is taken. Real sockets on 127.0.0.1, no cluster. (The egress relay to a listener of
the driver's is gone with decision 497: a Ray session's egress is its own event stream.)"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from toolseam.backends.remote.codec import MAX_REQUEST
from toolseam.backends.remote.handshake import derived_key
from toolseam.backends.remote.server import SESSION_LABEL
from toolseam.ray.direct import DirectLink, NodeServer
from toolseam.seam.models import TraceContext

SECRET = "the-session-secret"


class Listener:
    """Whoever binds a port: records every byte it is sent, answers ``reply`` to each."""

    def __init__(self, reply: bytes) -> None:
        self.reply, self.received = reply, b""
        self.port = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                self.received += data
                writer.write(self.reply)
                await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def listening(listener: Listener) -> AsyncIterator[Listener]:
    server = await asyncio.start_server(listener.serve, "127.0.0.1", 0)
    listener.port = server.sockets[0].getsockname()[1]
    async with server:
        yield listener


async def node_server(calls: list[tuple[str, str]],
                      traces: list[TraceContext | None] | None = None) -> NodeServer:
    async def call(sid: str, method: str, args: tuple[Any, ...],
                   trace: TraceContext | None) -> tuple[Any, ...]:
        calls.append((sid, method))
        if traces is not None:
            traces.append(trace)
        return ("ok", f"{method} answered")
    server = NodeServer(call, {"s1": session_key(SECRET)}.get)
    await server.start("127.0.0.1")
    return server


async def test_direct_both_ends_prove_the_key_and_the_secret_never_crosses() -> None:
    calls: list[tuple[str, str]] = []
    server = await node_server(calls)
    try:
        link = await DirectLink.connect("127.0.0.1", server.port, "s1", session_key(SECRET))
        assert link is not None
        assert await link.call("stat", ()) == ("ok", "stat answered")
        link.close()
        # a caller with another key, or an unknown session: no link, no call ran
        assert await DirectLink.connect("127.0.0.1", server.port, "s1", session_key("x")) is None
        assert await DirectLink.connect("127.0.0.1", server.port, "s2",
                                        session_key(SECRET)) is None
        assert calls == [("s1", "stat")]
    finally:
        server.close()


async def test_direct_a_calls_trace_context_reaches_the_node_with_it() -> None:
    """Decision 390: the caller's span context is a field of the request frame."""
    came = TraceContext(traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                        tracestate="vendor=a1")
    traces: list[TraceContext | None] = []
    server = await node_server([], traces)
    try:
        link = await DirectLink.connect("127.0.0.1", server.port, "s1", session_key(SECRET))
        assert link is not None
        assert await link.call("stat", (), came) == ("ok", "stat answered")
        assert await link.call("stat", ()) == ("ok", "stat answered")
        link.close()
        assert traces == [came, None]
    finally:
        server.close()


async def test_direct_a_call_that_breaks_on_the_node_is_answered_not_left_waiting() -> None:
    async def broken(sid: str, method: str, args: tuple[Any, ...],
                     trace: TraceContext | None) -> tuple[Any, ...]:
        raise TypeError("broken")
    server = NodeServer(broken, {"s1": session_key(SECRET)}.get)
    await server.start("127.0.0.1")
    try:
        link = await DirectLink.connect("127.0.0.1", server.port, "s1", session_key(SECRET))
        assert link is not None
        answer = await asyncio.wait_for(link.call("stat", ()), 10)
        assert answer[0] == "err" and "TypeError: broken" in answer[1]["message"]
        link.close()
    finally:
        server.close()


async def test_direct_a_port_that_cannot_prove_the_key_is_sent_no_call() -> None:
    """An impostor's port (or one another local user bound): it gets a hello with a nonce —
    not the secret, not the key — and is never sent a call."""
    async with listening(Listener(b"\0\0\0\x05hello")) as impostor:
        link = await DirectLink.connect("127.0.0.1", impostor.port, "s1", session_key(SECRET))
        await asyncio.sleep(0.1)
    assert link is None
    assert SECRET.encode() not in impostor.received
    assert session_key(SECRET).hex().encode() not in impostor.received
    assert b"stat" not in impostor.received and len(impostor.received) < 200


async def test_direct_a_request_above_the_cap_ends_the_connection() -> None:
    calls: list[tuple[str, str]] = []
    server = await node_server(calls)
    try:
        link = await DirectLink.connect("127.0.0.1", server.port, "s1", session_key(SECRET))
        assert link is not None
        link._writer.write((MAX_REQUEST + 1).to_bytes(4, "big"))
        async with asyncio.timeout(10):
            while link.alive:
                await asyncio.sleep(0.05)
        assert calls == []
    finally:
        server.close()


@pytest.fixture
def ray_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A CA and a certificate signed by it, set as Ray's TLS is (``RAY_USE_TLS`` and its files)."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path)
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "1", "-subj", "/CN=ray-ca", "-keyout", "ca.key", "-out", "ca.crt")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-subj", "/CN=ray-node",
            "-keyout", "node.key", "-out", "node.csr")
    openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "1", "-out", "node.crt")
    for name, value in (("RAY_USE_TLS", "1"), ("RAY_TLS_CA_CERT", "ca.crt"),
                        ("RAY_TLS_SERVER_CERT", "node.crt"), ("RAY_TLS_SERVER_KEY", "node.key")):
        monkeypatch.setenv(name, value if name == "RAY_USE_TLS" else str(tmp_path / value))
    return tmp_path


async def test_with_rays_tls_the_connection_is_tls_and_a_plain_peer_gets_nothing(
        ray_tls: Path) -> None:
    calls: list[tuple[str, str]] = []
    server = await node_server(calls)
    try:
        link = await DirectLink.connect("127.0.0.1", server.port, "s1", session_key(SECRET))
        assert link is not None
        assert link._writer.get_extra_info("ssl_object") is not None
        assert await link.call("stat", ()) == ("ok", "stat answered")
        link.close()
        # a peer speaking plain TCP: the TLS handshake fails, no frame is read
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"\0\0\0\x10toolseam-ray-dir")
        async with asyncio.timeout(10):
            assert b"toolseam" not in await reader.read()
        writer.close()
        assert calls == [("s1", "stat")]
    finally:
        server.close()


def session_key(secret: str) -> bytes:
    """A session's key, as the node keeps it (the remote server's)."""
    return derived_key(secret, SESSION_LABEL)
