"""The toolseam process's end of egress: each connection the sandbox agent accepts on its
127.0.0.1 listener (``toolseam_agent/tunnel.py`` — the frames and the credit scheme are
described there) becomes an asyncio transport here, served by ``EgressProxy.handle``.

A transport of our own rather than a socketpair per connection: the frames go straight to the
proxy's stream protocol (one copy fewer each way), and asyncio's ``start_tls`` — the proxy
terminates TLS for hosts with credentials — layers on any transport that says it can.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from toolseam_agent.tunnel import CHUNK, WINDOW
from toolseam_agent.wire import TO_AGENT, TUNNEL, tunnel_data

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
PortsFor = Callable[[str], list[int]]  # the resolver's question: which ports may NAME reach
SendFrame = Callable[[dict[str, Any] | bytes], None]  # bytes: whole lines already made
SendData = Callable[[int, bytes], None]  # a data frame: connection number, bytes
_READER_LIMIT = 1 << 16
_CLOSE_WAIT_S = 10.0
_log = logging.getLogger("toolseam.egress")


class TunnelTransport(asyncio.Transport):
    """One sandbox connection, as the proxy's stream sees it."""

    _start_tls_compatible = True  # asyncio's start_tls accepts a transport that says so

    def __init__(self, mux: TunnelMux, number: int, protocol: asyncio.BaseProtocol,
                 opened: dict[str, Any] | None = None) -> None:
        super().__init__()
        self._opened = opened or {}
        self._mux, self._number, self._protocol = mux, number, protocol
        self._unacked = 0  # bytes we sent that the sandbox's client has not taken yet
        self._paused_writer = False
        # A captured connection's first bytes wait until the proxy knows what they are: TLS
        # it terminates (start_tls must get the ClientHello) or bytes for the stream reader.
        self._reading = "h" not in self._opened
        self._held: list[bytes | None] = []  # arrived while reading was paused; None: EOF
        self._closing = False
        self._gone = False

    # -- to the sandbox --------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        data = bytes(data)
        for start in range(0, len(data), CHUNK):
            piece = data[start:start + CHUNK] if len(data) > CHUNK else data
            if self._mux.send_data is not None:  # egress: binary frames (frames.py)
                self._mux.send_data(self._number, piece)
            else:  # exposed ports: their own text frames
                self._mux.send_frame(tunnel_data(self._mux.to_agent, self._number, piece))
            self._unacked += len(piece)
        if self._unacked >= WINDOW and not self._paused_writer:
            self._paused_writer = True
            self._protocol.pause_writing()

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if not self._closing:
            self._mux.send({"c": self._number, "o": "eof"})

    def get_write_buffer_size(self) -> int:
        return self._unacked

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (WINDOW // 2, WINDOW)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None  # the window is the limit: it is what the agent buffers at most

    def close(self) -> None:
        self._end(tell_agent=True, error=None)

    def abort(self) -> None:
        self._end(tell_agent=True, error=None)

    def _force_close(self, exc: BaseException | None) -> None:
        """What asyncio's TLS layer calls on a failed handshake (part of the start_tls
        contract): this connection ends, nothing else."""
        self._end(tell_agent=True, error=exc if isinstance(exc, Exception) else None)

    def is_closing(self) -> bool:
        return self._closing

    # -- from the sandbox ------------------------------------------------------------------
    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if self._reading:
            return
        self._reading = True
        while self._held and self._reading:
            item = self._held.pop(0)
            if item is None:
                self._eof()
            else:
                self.deliver(item)

    def is_reading(self) -> bool:
        return self._reading

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """``peername``; ``egress_target``: (name, port) of a captured connection (None for one
        to the proxy's listener); ``egress_origin``: pid, argv and job of its opener, if known."""
        opened = self._opened
        extra = {"peername": ("sandbox", self._number),
                 "egress_target": ((str(opened["h"]), int(opened["p"]))
                                   if "h" in opened and "p" in opened else None),
                 "egress_origin": {key: opened[key] for key in ("pid", "argv", "job")
                                   if key in opened}}
        return extra.get(name, default)

    def deliver(self, data: bytes) -> None:
        if not self._reading:
            self._held.append(data)
            return
        _feed(self._protocol, data)
        if not self._gone:
            self._mux.send({"c": self._number, "a": len(data)})  # credit back

    def frame(self, frame: dict[str, Any]) -> None:
        """One frame (not data: ``data``) from the agent for this connection."""
        if "a" in frame:
            self._unacked -= int(frame["a"])
            if self._paused_writer and self._unacked <= WINDOW // 2:
                self._paused_writer = False
                self._protocol.resume_writing()
        elif frame.get("o") == "eof":
            if self._held or not self._reading:  # after the data it follows
                self._held.append(None)
            else:
                self._eof()
        elif frame.get("o") == "end":
            self._end(tell_agent=False, error=ConnectionResetError("the sandbox side closed"))

    def _eof(self) -> None:
        if not self._gone and not self._protocol.eof_received():  # type: ignore[attr-defined]
            self.close()

    def _end(self, tell_agent: bool, error: Exception | None) -> None:
        if self._gone:
            return
        self._gone = self._closing = True
        if tell_agent:
            self._mux.send({"c": self._number, "o": "end"})
        self._mux.forget(self._number)
        if self._paused_writer:
            self._paused_writer = False
            with contextlib.suppress(Exception):
                self._protocol.resume_writing()
        asyncio.get_running_loop().call_soon(self._protocol.connection_lost, error)


def _feed(protocol: asyncio.BaseProtocol, data: bytes) -> None:
    """``data_received``, or for a buffered protocol (asyncio's TLS layer is one) its buffers."""
    if not isinstance(protocol, asyncio.BufferedProtocol):
        protocol.data_received(data)  # type: ignore[attr-defined]
        return
    view = memoryview(data)
    while view:
        buffer = memoryview(protocol.get_buffer(len(view)))
        size = min(len(buffer), len(view))
        buffer[:size] = view[:size]
        protocol.buffer_updated(size)
        view = view[size:]


class TunnelMux:
    """Every egress connection of one session: frames in from the channel, out through it.

    ``send`` writes a frame on the session's current channel (``channel.py`` moves the mux to a
    new channel after a reconnect, and ends what was open: bytes in flight are lost)."""

    op, to_agent = TUNNEL, TO_AGENT  # this kind's frames (exposed ports: ``ports.py``)

    def __init__(self, serve: Serve, send: SendFrame, send_data: SendData | None = None,
                 ports_for: PortsFor | None = None) -> None:
        self._serve, self._ports_for = serve, ports_for
        self.send_frame, self.send_data = send, send_data
        self._open: dict[int, TunnelTransport] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def send(self, frame: dict[str, Any]) -> None:
        self.send_frame({"id": 0, "op": self.op, **frame})

    def forget(self, number: int) -> None:
        self._open.pop(number, None)

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def data(self, number: int, data: bytes) -> None:
        """A data frame from the agent (``channel.py`` splits it out without the JSON codec)."""
        transport = self._open.get(number)
        if transport is None:
            self.send({"c": number, "o": "end"})  # one we ended already: tell it again
            return
        self._guarded(transport, transport.deliver, data)

    def event(self, message: dict[str, Any]) -> None:
        """A ``tun`` event (not data) from the agent."""
        if message.get("o") == "dns":
            name = str(message.get("h", ""))
            try:
                ports = self._ports_for(name) if self._ports_for is not None else []
            except Exception as exc:  # noqa: BLE001 - a refusal for this name only, and logged
                _log.info("egress: deciding %r failed: %s", name, exc)
                ports = []
            self.send({"o": "dns", "q": message.get("q"), "p": ports})
            return
        number = int(message["c"])
        if message.get("o") == "open":
            self._accept(number, message)
            return
        transport = self._open.get(number)
        if transport is not None:
            self._guarded(transport, transport.frame, message)
        elif message.get("o") != "end":
            self.send({"c": number, "o": "end"})  # one we ended already: tell it again

    @staticmethod
    def _guarded(transport: TunnelTransport, step: Callable[[Any], None], argument: Any) -> None:
        """One connection's trouble (a TLS layer that fails, a protocol that raises) ends that
        connection only: the channel carries the session's tool calls too."""
        try:
            step(argument)
        except Exception as exc:  # noqa: BLE001 - contained to its connection, and logged
            _log.info("egress connection ended by %s: %s", type(exc).__name__, exc)
            transport._force_close(exc)

    def _accept(self, number: int, opened: dict[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_READER_LIMIT, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, self._serve_one, loop=loop)
        transport = TunnelTransport(self, number, protocol, opened)
        self._open[number] = transport
        protocol.connection_made(transport)

    def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # StreamReaderProtocol calls this on connection_made: keep the task, close at the end.
        async def serve() -> None:
            try:
                await self._serve(reader, writer)
            finally:
                if writer.transport is not None:  # a failed start_tls leaves none
                    writer.close()

        task = asyncio.get_running_loop().create_task(serve())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def end_all(self) -> None:
        """The channel dropped or the session closes: every connection ends."""
        for transport in list(self._open.values()):
            transport.abort()

    async def close(self) -> None:
        self.end_all()
        await cancel_handlers(self._tasks)


async def cancel_handlers(tasks: set[asyncio.Task[None]]) -> None:
    """Cancel connection handlers and wait for them, bounded: a handler that swallows its
    cancellation must not hang the close."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=_CLOSE_WAIT_S)
