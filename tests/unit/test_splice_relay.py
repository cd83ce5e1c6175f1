"""``toolseam/egress/splice.py``: bytes between two plain sockets in the kernel, exactly as
sent whatever the sizes and whatever the stream reader had already read ahead; a body that ends
short is said; the connection's abort ends a relay that waits; a TLS stream is never spliced."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import os
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolseam.egress import splice

from ..support.egress_servers import make_test_ca
from ..support.timing import patience


@asynccontextmanager
async def pair() -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter,
                                        asyncio.StreamReader, asyncio.StreamWriter]]:
    """A loopback TCP connection: (client reader, client writer, server reader, server writer)."""
    accepted: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
        asyncio.get_running_loop().create_future())
    server = await asyncio.start_server(lambda r, w: accepted.set_result((r, w)), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    theirs = await accepted
    try:
        yield reader, writer, *theirs
    finally:
        for w in (writer, theirs[1]):
            w.transport.abort()
        server.close()
        await server.wait_closed()


async def relay_once(data: bytes, read_ahead: int, size: int | None,
                     total: int) -> tuple[bytes, int]:
    """``data`` sent into connection A; the proxy reads ``read_ahead`` bytes of it through the
    stream (so the reader holds what came with them), then splices ``size`` to connection B."""
    async with pair() as (_a_r, a_w, src_r, src_w), pair() as (_dst_r, dst_w, b_r, _b_w):
        a_w.write(data)
        await a_w.drain()
        a_w.write_eof()
        first = await src_r.readexactly(read_ahead) if read_ahead else b""
        counted: list[int] = []
        dst_w.write(first)
        await splice.relay(src_r, src_w, dst_w, counted.append,
                           None if size is None else size - read_ahead, [])
        dst_w.write_eof()
        received = await b_r.read()
        assert sum(counted) == (total if size is None else size) - read_ahead
        return received, sum(counted)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(total=st.sampled_from([1, 65535, 65536, 1 << 20, (1 << 20) + 1])
       | st.integers(1, 3_000_000),
       ahead=st.integers(0, 70_000), exact=st.booleans(), data=st.data())
def test_the_bytes_out_are_the_bytes_in(total: int, ahead: int, exact: bool,
                                        data: st.DataObject) -> None:
    ahead = min(ahead, total)
    size = data.draw(st.integers(ahead, total)) if exact else None
    payload = os.urandom(total)
    received, _ = asyncio.run(relay_once(payload, ahead, size, total))
    expected = payload[:size] if size is not None else payload
    assert hashlib.sha256(received).digest() == hashlib.sha256(expected).digest()
    assert len(received) == len(expected)


async def test_a_body_that_ends_short_is_said() -> None:
    async with pair() as (_a_r, a_w, src_r, src_w), pair() as (_dst_r, dst_w, _b_r, _b_w):
        a_w.write(b"x" * 1000)
        a_w.write_eof()
        with pytest.raises(splice.BodyEnded, match="bytes short"):
            await splice.relay(src_r, src_w, dst_w, lambda n: None, 5000, [])


async def test_the_abort_hook_ends_a_relay_that_waits() -> None:
    async with pair() as (a_r, _a_w, src_r, src_w), pair() as (_dst_r, dst_w, b_r, _b_w):
        hooks: list[Callable[[], None]] = []
        task = asyncio.ensure_future(splice.relay(src_r, src_w, dst_w, lambda n: None, None, hooks))
        for _ in range(100):
            if hooks:
                break
            await asyncio.sleep(0.01)
        assert not task.done() and len(hooks) == 1  # waiting for bytes that never come
        for hook in list(hooks):
            hook()
        await asyncio.wait_for(task, 5)  # ended, not hung
        assert hooks == []  # the relay took its hook back
        assert await asyncio.wait_for(b_r.read(), 5) == b""  # the far end saw the end
        assert await asyncio.wait_for(a_r.read(), 5) == b""


async def test_a_tls_stream_is_never_spliced(tmp_path: Path) -> None:
    ca = make_test_ca(tmp_path, ["tls.test"])
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(ca.cert_file, ca.key_file)
    client_ctx = ssl.create_default_context(cafile=str(ca.ca_file))
    done: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()
    server = await asyncio.start_server(lambda r, w: done.set_result(w), "127.0.0.1", 0,
                                        ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    async with pair() as (_, plain, _r, _w):
        _reader, tls = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx,
                                                     server_hostname="tls.test")
        assert splice.plain_fd(plain) is not None
        assert splice.plain_fd(tls) is None
        assert not splice.can_splice(tls, plain) and not splice.can_splice(plain, tls)
        tls.transport.abort()
        (await done).transport.abort()
    server.close()


def test_a_relay_that_ends_after_its_loop_closed_still_closes_its_sockets() -> None:
    """The relay's thread closes its duplicates itself: closed by a callback on the loop, they
    stayed open when the loop had closed first (a session's or a test's end) and were left to
    the garbage collector — a ``ResourceWarning: unclosed socket`` from a finishing thread
    (issue 45). Here the sink's peer sees the end once the thread is done, loop or no loop."""
    source, source_peer = socket.socketpair()
    sink, sink_peer = socket.socketpair()
    loop = asyncio.new_event_loop()

    async def begin() -> tuple[asyncio.Task[None], list[asyncio.StreamWriter], threading.Thread]:
        src_r, src_w = await asyncio.open_connection(sock=source)
        _, dst_w = await asyncio.open_connection(sock=sink)
        before = set(threading.enumerate())
        task = asyncio.ensure_future(splice.relay(src_r, src_w, dst_w, lambda _n: None, None, []))
        while not (started := [t for t in set(threading.enumerate()) - before
                               if t.name == "egress-splice"]):
            await asyncio.sleep(0.01)
        return task, [src_w, dst_w], started[0]

    task, writers, thread = loop.run_until_complete(begin())
    for writer in writers:  # the transports let their sockets go; the relay's duplicates stay
        writer.transport.abort()
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()  # the loop goes before the relay's end can reach it
    source_peer.close()  # the source ends: the thread finishes
    thread.join(patience(30))
    assert not thread.is_alive()
    sink_peer.settimeout(patience(10))
    try:
        assert sink_peer.recv(1) == b""  # before the fix: timed out (a duplicate was open)
    finally:
        sink_peer.close()
        del task  # pending on a closed loop: only the collector ends it
        gc.collect()
