"""Egress through the remote wire: the sandbox's connections come to the CLIENT's proxy, so the
rules, the credentials and the audit stay with the session's owner — as with an engine on
another machine (docs/network.md).

The server gives the hosted backend's ``open_egress`` a ``serve`` (``ServerEgress``) that
speaks the agent's half of the tunnel frames (``toolseam_agent/tunnel.py``: open, data, eof,
end, and credit, at most ``WINDOW`` bytes unacknowledged per connection and direction) as
events of one long ``stream`` call; the client (``ClientEgress``) feeds them to the same
``agentlink/tunnel.py:TunnelMux`` an agent's channel feeds, and sends its frames back as
``call``s, in order. Captured connections (the resolver inside) are not offered: its question
would cross the wire on the hosted agent's loop; ``capture`` says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from toolseam_agent.tunnel import CHUNK, WINDOW

from ..agentlink.tunnel import TunnelMux
from .transport import OnEvent

NOT_CAPTURED = ("captured connections are not offered through a remote server: clients that "
                "honour HTTP(S)_PROXY reach the allowed hosts, others reach nothing")
EVENTS, SEND = "egress_events", "egress_send"  # the egress shape's own requests
DATA = "d"  # an event that carries a connection's bytes: (DATA, number, bytes)


@dataclass
class _Connection:
    writer: asyncio.StreamWriter
    unacked: int = 0
    credit: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)


def _origin(writer: asyncio.StreamWriter, opened: dict[str, Any] | None) -> dict[str, Any]:
    """What the open frame says of a connection: its opener, as the hosted side knows it."""
    if opened is not None:
        return {key: opened[key] for key in ("pid", "argv", "job") if key in opened}
    origin = writer.get_extra_info("egress_origin") or {}
    return {key: origin[key] for key in ("pid", "argv", "job") if key in origin}


class ServerEgress:
    """One session's egress connections on the server."""

    def __init__(self) -> None:
        self._emit: OnEvent | None = None
        self._numbers = itertools.count(1)
        self._open: dict[int, _Connection] = {}
        self._over = asyncio.Event()

    async def events(self, emit: OnEvent | None) -> None:
        """The client's long stream call: its events until the session ends."""
        self._emit = emit
        await self._over.wait()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    opened: dict[str, Any] | None = None, /) -> None:
        emit = self._emit
        if emit is None or self._over.is_set():
            writer.close()  # no client listens: the connection is refused, never served here
            return
        number = next(self._numbers)
        connection = self._open[number] = _Connection(writer)
        emit({"c": number, "o": "open", **_origin(writer, opened)})
        try:
            while not connection.ended.is_set():
                while connection.unacked >= WINDOW:
                    connection.credit.clear()
                    await connection.credit.wait()
                data = await reader.read(CHUNK)
                if not data:
                    emit({"c": number, "o": "eof"})
                    await connection.ended.wait()  # the client's end closes it
                    break
                connection.unacked += len(data)
                emit((DATA, number, data))
        except (ConnectionError, OSError):
            pass
        finally:
            if self._open.pop(number, None) is not None and not connection.ended.is_set():
                emit({"c": number, "o": "end"})
            writer.close()

    async def receive(self, frame: dict[str, Any]) -> None:
        """A frame from the client's mux: credit, bytes, a half-close or the end."""
        connection = self._open.get(int(frame.get("c", 0)))
        if connection is None:
            return
        if "a" in frame:
            connection.unacked -= int(frame["a"])
            connection.credit.set()
        elif "d" in frame:
            data = bytes(frame["d"])
            connection.writer.write(data)
            with contextlib.suppress(ConnectionError):
                await connection.writer.drain()
            if self._emit is not None:
                self._emit({"c": frame["c"], "a": len(data)})
        elif frame.get("o") == "eof":
            with contextlib.suppress(OSError):
                connection.writer.write_eof()
        elif frame.get("o") == "end":
            connection.ended.set()
            connection.credit.set()
            connection.writer.close()

    def close(self) -> None:
        self._over.set()
        for connection in self._open.values():
            connection.ended.set()
            connection.credit.set()
            connection.writer.close()


Send = Callable[[str, dict[str, Any], OnEvent | None], Awaitable[Any]]


class ClientEgress:
    """One session's egress on the client: the server's events into a ``TunnelMux`` serving
    the proxy, the mux's frames back to the server in order."""

    def __init__(self, send: Send, serve: Any) -> None:
        self._send = send
        self._mux = TunnelMux(serve, self._frame, self._data)
        self._outgoing: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._tasks = [asyncio.ensure_future(send(EVENTS, {}, self._event)),
                       asyncio.ensure_future(self._sender())]

    def _frame(self, frame: dict[str, Any] | bytes) -> None:
        if isinstance(frame, dict):
            self._outgoing.put_nowait({k: v for k, v in frame.items() if k not in ("id", "op")})

    def _data(self, number: int, data: bytes) -> None:
        self._outgoing.put_nowait({"c": number, "d": data})

    def _event(self, event: Any) -> None:
        if isinstance(event, tuple) and len(event) == 3 and event[0] == DATA:
            self._mux.data(int(event[1]), bytes(event[2]))
        elif isinstance(event, dict):
            self._mux.event(event)

    async def _sender(self) -> None:
        while True:
            frame = await self._outgoing.get()
            await self._send(SEND, {"frame": frame}, None)

    async def close(self) -> None:
        await self._mux.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
