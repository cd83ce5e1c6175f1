"""Egress for a session on a Ray node: the caller's proxy decides, resolves and connects, as for
an engine on another machine — the rules, the credentials and the audit stay with the caller.

The node's own backend runs its sandbox in egress mode (loopback alone, the agent's listener
inside); each connection the agent accepts is served on the node by ``NodeRelay``, which opens
a TCP connection to the caller's ``CallerEnd`` and relays the bytes both ways. The caller's end
listens on the driver's Ray address and serves a connection only after its first line presents
the session's egress token (a fresh random value the caller gave the node over Ray, compared in
constant time): another job of the cluster that finds the port cannot use the caller's egress,
its rules or its credentials. What a peer sends before that is read as one bounded line and
never parsed further.

Captured connections (the resolver inside) are not offered through a cluster: the resolver's
question would cross the cluster synchronously on the node's loop. Clients that honour
``HTTP(S)_PROXY`` work; the session's ``capture`` says why others do not.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

HELLO_MAX = 4096  # the first line: the token and who opened the connection
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
        self.refused = 0  # connections that did not present the token

    async def start(self, host: str) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._accepted, host, 0, limit=HELLO_MAX)
        return host, int(self._server.sockets[0].getsockname()[1])

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                line = await reader.readuntil(b"\n")
            hello = json.loads(line)
            if not (isinstance(hello, dict) and isinstance(hello.get("t"), str)
                    and hmac.compare_digest(hello["t"], self.token)):
                raise ValueError("not this session's token")
        except (TimeoutError, OSError, ValueError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError):
            self.refused += 1
            writer.transport.abort()
            return
        origin = {key: hello[key] for key, kind in (("pid", int), ("argv", list), ("job", str))
                  if isinstance(hello.get(key), kind)}
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
    """The node's ``serve`` for its backend's egress: each connection to the caller's end."""

    def __init__(self, caller: tuple[str, int], token: str) -> None:
        self.caller, self.token = caller, token

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    opened: dict[str, Any] | None = None) -> None:
        def told(name: str) -> Any:
            return opened.get(name) if opened is not None else writer.get_extra_info(name)

        if told("egress_target") is not None:  # not asked for (NOT_CAPTURED): never relayed
            return
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                up_reader, up_writer = await asyncio.open_connection(*self.caller)
        except (TimeoutError, OSError):
            return  # the client sees its connection end: the caller is gone
        hello = {"t": self.token, **(told("egress_origin") or {})}
        up_writer.write(json.dumps(hello, separators=(",", ":")).encode() + b"\n")
        upward = asyncio.ensure_future(_pump(reader, up_writer))
        try:
            await _pump(up_reader, writer)
        finally:
            upward.cancel()
            await asyncio.wait([upward])
            up_writer.transport.abort()


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Bytes until the source ends, then a half-close (the other way may go on)."""
    with contextlib.suppress(OSError):
        while data := await source.read(_CHUNK):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
