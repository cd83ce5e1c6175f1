"""Exposed ports, the host's end (``tools.sandbox.expose``; the agent's end is
``toolseam_agent/ports.py``): a listener on this machine whose every accepted connection is
carried into the sandbox's ``127.0.0.1:PORT`` over the session's own channel — so it works with
network ``none``, on an engine reached over the network, and through a durable session's
sealed lines, the same as any tool call.

Only the session's owner gets through: the listener is TCP (so curl and a browser work), and
every connection it accepts is checked, as identd would, against the uid of the local socket
that made it (``peer_uid.py``): the uid this process runs as is admitted, every other one —
root included, unless root is the owner — and every peer with no local socket (another machine,
another network namespace) is closed before a byte is carried (issue 44, decision 331).

The streams are egress's (``tunnel.py``: ``TunnelTransport``, credit windows), the other way
round and under their own op: here the host opens each stream and the agent only connects. A
frame from the agent that claims to open one is dropped — nothing in the sandbox can make this
side connect anywhere or listen anywhere; listeners exist only where the session's owner
called ``expose``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from typing import Any

from toolseam_agent.wire import EXPOSE, EXPOSE_TO_AGENT

from .peer_uid import connecting_uid
from .tunnel import SendFrame, TunnelMux, TunnelTransport

MAX_CONNECTIONS = 500  # per session, below the agent's 512: past it a connection closes at once
_LINGER_S = 2.0  # after the sandbox's end, how long a client may take to close its own
_log = logging.getLogger("toolseam.ports")


async def _no_serve(_reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
    return None  # the agent never opens a stream here (``PortMux._accept``)


class PortMux(TunnelMux):
    """Every exposed-port stream of one session, and the listeners that make them. The channel
    carries it (``channel.carry_ports``) and moves it to a new channel after a reconnect."""

    op, to_agent = EXPOSE, EXPOSE_TO_AGENT

    def __init__(self, send: SendFrame) -> None:
        super().__init__(_no_serve, send)
        self._numbers = itertools.count(1)
        self.listeners: set[ForwardedPort] = set()
        self.carrying = True  # the channel can take frames now (False while it is down)

    def _accept(self, number: int, opened: dict[str, Any]) -> None:
        _log.warning("exposed ports: the sandbox agent claimed to open stream %d; ignored",
                     number)

    def open_stream(self, sandbox_port: int, protocol: asyncio.BaseProtocol
                    ) -> TunnelTransport | None:
        """A new stream to ``127.0.0.1:sandbox_port`` inside; None when the channel cannot
        carry one now or the session has its fill."""
        if not self.carrying or self.open_connections >= MAX_CONNECTIONS:
            return None
        number = next(self._numbers)
        transport = TunnelTransport(self, number, protocol)
        self._open[number] = transport
        self.send({"c": number, "o": "open", "port": sandbox_port})
        return transport

    def close_listeners(self) -> None:
        """The session ends (or this client leaves it): no listener, no connection is left."""
        for listener in list(self.listeners):
            listener.close_now()
        self.end_all()


class _SandboxSide(asyncio.Protocol):
    """The sandbox's end of one connection, writing to the host's client."""

    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        if not self.client.is_closing():  # a client gone (a reset): its end is on its way
            self.client.write(data)

    def eof_received(self) -> bool:
        if self.client.can_write_eof() and not self.client.is_closing():
            self.client.write_eof()
        return True  # half-closed: the client may still send

    def connection_lost(self, exc: Exception | None) -> None:
        """The sandbox's end is gone (closed, refused): FIN after what was written, and a
        moment for the client to close first — closing a socket whose input is unread would
        reset it, and a reset can destroy the answer still in flight to the client."""
        client = self.client
        if client.is_closing():
            return
        if client.can_write_eof():
            client.write_eof()
            asyncio.get_running_loop().call_later(_LINGER_S, client.close)
        else:
            client.close()

    def pause_writing(self) -> None:  # the sandbox's window is full: stop reading the client
        self.client.pause_reading()

    def resume_writing(self) -> None:
        if not self.client.is_closing():
            self.client.resume_reading()


class _ClientSide(asyncio.Protocol):
    """A connection the host's listener accepted, carried as one stream."""

    def __init__(self, owner: ForwardedPort) -> None:
        self.owner = owner
        self.sandbox: TunnelTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.client = transport
        owner = self.owner
        if not owner.admits(transport.get_extra_info("peername"),
                            transport.get_extra_info("sockname")):
            transport.abort()  # nothing read, nothing carried
            return
        if not owner.closed:
            self.sandbox = owner.mux.open_stream(owner.sandbox_port, _SandboxSide(transport))
        if self.sandbox is None:
            transport.close()
            return
        owner.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.sandbox is not None:
            self.sandbox.write(data)

    def eof_received(self) -> bool:
        if self.sandbox is None or self.sandbox.is_closing():
            return False  # both ends are done: close
        self.sandbox.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.connections.discard(self)
        if self.sandbox is not None:
            self.sandbox.close()

    def pause_writing(self) -> None:  # the client reads slowly: withhold the sandbox's credit
        if self.sandbox is not None:
            self.sandbox.pause_reading()

    def resume_writing(self) -> None:
        if self.sandbox is not None:
            self.sandbox.resume_reading()

    def end(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
        self.client.close()


class ForwardedPort:
    """One exposed port (``seam.capabilities.ExposedPort``): ``host:port`` here, carried to
    ``127.0.0.1:sandbox_port`` in the sandbox."""

    def __init__(self, mux: PortMux, sandbox_port: int) -> None:
        self.mux, self.sandbox_port = mux, sandbox_port
        self.host, self.port = "", 0
        self.connections: set[_ClientSide] = set()
        self.closed = False
        self.owner_uid = os.geteuid()  # the session's owner: the one user admitted
        self._server: asyncio.Server | None = None

    def admits(self, peer: Any, ours: Any) -> bool:
        """Whether the connection from ``peer`` (to ``ours``) was made by the owner's uid."""
        try:
            uid = connecting_uid(peer, ours)
        except (OSError, ValueError, TypeError) as exc:  # no netlink here, an odd address
            _log.warning("exposed port %s:%s: cannot tell who connected (%s); refused",
                         self.host, self.port, exc)
            return False
        if uid == self.owner_uid:
            return True
        who = "no local socket" if uid is None else f"uid {uid}"
        _log.warning("exposed port %s:%s: refused a connection from %s (%s): only uid %d, the "
                     "session's owner, may connect", self.host, self.port, peer, who,
                     self.owner_uid)
        return False

    @classmethod
    async def listen(cls, mux: PortMux, sandbox_port: int, host: str, host_port: int
                     ) -> ForwardedPort:
        forwarded = cls(mux, sandbox_port)
        server = await asyncio.get_running_loop().create_server(
            lambda: _ClientSide(forwarded), host, host_port)
        forwarded._server = server
        forwarded.host, forwarded.port = server.sockets[0].getsockname()[:2]
        mux.listeners.add(forwarded)
        return forwarded

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return (f"<ExposedPort {self.host}:{self.port} -> sandbox 127.0.0.1:{self.sandbox_port}"
                f" {state}>")

    def close_now(self) -> None:
        """Stop listening (a connect is refused from now on) and end every connection."""
        if self.closed:
            return
        self.closed = True
        self.mux.listeners.discard(self)
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.end()

    async def close(self) -> None:
        self.close_now()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def __aenter__(self) -> ForwardedPort:
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()


__all__ = ["MAX_CONNECTIONS", "ForwardedPort", "PortMux"]
