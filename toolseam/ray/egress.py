"""Egress for a session on a Ray node: the caller's proxy decides, resolves and connects, as for
an engine on another machine — the rules, the credentials and the audit stay with the caller.

The node's own backend runs its sandbox in egress mode (loopback alone, the agent's listener
inside); each connection the agent accepts is served on the node by ``NodeRelay``, which opens
a TCP connection to the caller's ``CallerEnd`` and relays the bytes both ways. The caller's end
listens on the driver's Ray address. Before either end sends anything of value, both prove the
session's egress key (a fresh random value the caller gave the node over Ray) without sending
it (``handshake.py``): the node says a nonce, the caller answers its nonce and its proof, the
node checks it and answers its own proof (with who opened the connection), the caller checks
that. So a peer that finds the caller's port cannot use the caller's egress, its rules or its
credentials, and a listener that is not the caller — another local user who bound the port a
crashed driver freed — is sent no request of the sandbox and no answer of its reaches it. What
a peer sends before that is read as bounded lines and never parsed further than JSON. With
``RAY_USE_TLS`` the connection is TLS with Ray's certificates. A node relays only while the
session's holder renews it (``held``): a driver gone for two renewals' time gets no more.

Captured connections (the resolver inside) are not offered through a cluster: the resolver's
question would cross the cluster synchronously on the node's loop. Clients that honour
``HTTP(S)_PROXY`` work; the session's ``capture`` says why others do not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from ..backends.remote.handshake import holds, is_nonce, nonce, proof
from .handshake import client_tls, server_tls

HELLO_MAX = 4096  # a handshake line: nonces, proofs and who opened the connection
HELLO_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 10.0
_CHUNK = 256 * 1024
NOT_CAPTURED = ("captured connections are not offered through a Ray cluster: clients that "
                "honour HTTP(S)_PROXY reach the allowed hosts, others reach nothing")
Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter, dict[str, Any]], Awaitable[None]]


class CallerEnd:
    """The caller's listener for one session's egress connections."""

    def __init__(self, serve: Serve) -> None:
        self._serve = serve
        self.token = secrets.token_hex(32)
        self._server: asyncio.Server | None = None
        self.refused = 0  # connections that did not prove the session's egress key

    async def start(self, host: str) -> tuple[str, int]:
        tls = server_tls()
        self._server = await asyncio.start_server(
            self._accepted, host, 0, limit=HELLO_MAX, ssl=tls,
            ssl_handshake_timeout=HELLO_TIMEOUT_S if tls is not None else None)
        return host, int(self._server.sockets[0].getsockname()[1])

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        key = bytes.fromhex(self.token)
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                theirs = (await _line(reader)).get("n")
                if not is_nonce(theirs):
                    raise ValueError("no nonce")
                mine = nonce()
                writer.write(_json({"n": mine, "p": proof(key, "caller", "egress", theirs,
                                                          mine)}))
                hello = await _line(reader)
            if not holds(key, "node", "egress", theirs, mine, hello.get("p")):
                raise ValueError("not this session's node")
        except (TimeoutError, OSError, ValueError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError):
            self.refused += 1
            writer.transport.abort()
            return
        origin = {name: hello[name] for name, kind in (("pid", int), ("argv", list), ("job", str))
                  if isinstance(hello.get(name), kind)}
        try:
            await self._serve(reader, writer, {"egress_target": None, "egress_origin": origin})
        finally:
            writer.transport.abort()

    async def close(self) -> None:
        """No new connections (the proxy's own close ends those being served)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HELLO_TIMEOUT_S):
                    await server.wait_closed()


class NodeRelay:
    """The node's ``serve`` for its backend's egress: each connection to the caller's end,
    while ``held()`` (the session's holder renews it)."""

    def __init__(self, caller: tuple[str, int], token: str,
                 held: Callable[[], bool] = lambda: True) -> None:
        self.caller, self.token, self.held = caller, token, held
        self.refused = 0  # connections to a listener that did not prove the key

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    opened: dict[str, Any] | None = None) -> None:
        def told(name: str) -> Any:
            return opened.get(name) if opened is not None else writer.get_extra_info(name)

        if told("egress_target") is not None or not self.held():
            return  # not asked for (NOT_CAPTURED), or nobody holds the session: never relayed
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                up_reader, up_writer = await asyncio.open_connection(
                    *self.caller, limit=HELLO_MAX, ssl=client_tls())
        except (TimeoutError, OSError):
            return  # the client sees its connection end: the caller is gone
        if not await self._proved(up_reader, up_writer, told("egress_origin") or {}):
            self.refused += 1
            up_writer.transport.abort()
            return  # the client sees its connection end, having sent nothing anywhere
        upward = asyncio.ensure_future(_pump(reader, up_writer))
        try:
            await _pump(up_reader, writer)
        finally:
            upward.cancel()
            await asyncio.wait([upward])
            up_writer.transport.abort()


    async def _proved(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      origin: dict[str, Any]) -> bool:
        """Both ends proved the key (the caller first, as it receives the requests)."""
        key = bytes.fromhex(self.token)
        mine = nonce()
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                writer.write(_json({"n": mine}))
                answer = await _line(reader)
        except (TimeoutError, OSError, ValueError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError):
            return False
        theirs = answer.get("n")
        if not (is_nonce(theirs) and holds(key, "caller", "egress", mine, theirs,
                                           answer.get("p"))):
            return False
        writer.write(_json({"p": proof(key, "node", "egress", mine, theirs), **origin}))
        return True


async def _line(reader: asyncio.StreamReader) -> dict[str, Any]:
    """One handshake line as a JSON object (``ValueError`` for anything else)."""
    value = json.loads(await reader.readuntil(b"\n"))
    if not isinstance(value, dict):
        raise ValueError("not a handshake line")
    return value


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode() + b"\n"


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Bytes until the source ends, then a half-close (the other way may go on)."""
    with contextlib.suppress(OSError):
        while data := await source.read(_CHUNK):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
