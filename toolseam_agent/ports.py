"""The sandbox's end of an exposed port (``tools.sandbox.expose``): the host accepts a
connection on its own listener (``toolseam/backends/agentlink/ports.py``) and sends
``{"o": "open", "port": P}`` for a connection number it chose; the agent connects to
``127.0.0.1:P`` — in the sandbox's own network namespace, so it works with network ``none`` —
and the bytes travel as ``tunnel.py``'s streams do (the same frames, credit window and
threads), under the ``xp`` op and event.

Only the host opens: nothing a process in the sandbox does makes the agent connect, and the
agent connects nowhere but 127.0.0.1. A refused or unreachable port is an ``end`` frame, so the
host's client sees its connection close at once rather than hang.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

from .tunnel import Connection
from .wire import (
    EXPOSE,
    EXPOSE_TO_AGENT,
    EXPOSE_TO_HOST,
    loads,
    tunnel_data,
    tunnel_number,
    tunnel_payload,
)

MAX_CONNECTIONS = 512  # the host's own limit comes first; past it a connection ends at once
CONNECT_TIMEOUT_S = 10.0  # a full backlog drops SYNs: how long a connect may retry
_MAX_PORT = 65535

Send = Callable[[dict[str, Any]], None]
SendBytes = Callable[[bytes], None]


class _Forwarded(Connection):
    """A connection the host opened: connected (in its writer thread, never the agent's loop)
    before its threads carry bytes; data the host sent meanwhile waits in its outbox."""

    def __init__(self, owner: PortForwards, number: int, port: int) -> None:
        super().__init__(owner, number, socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        self.port = port
        self.writer = threading.Thread(target=self._connect_then_write, daemon=True,
                                       name=f"xp{number}w")

    def start(self) -> None:
        self.writer.start()

    def _connect_then_write(self) -> None:
        try:
            self.sock.settimeout(CONNECT_TIMEOUT_S)
            self.sock.connect(("127.0.0.1", self.port))
            self.sock.settimeout(None)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # refused, unreachable, timed out: the host's client is closed
            self.end(tell_host=True)
            self.sock.close()
            self.tunnels.forget(self.number)
            return
        self.reader.start()
        self._write()


class PortForwards:
    """The connections the host opened into this sandbox's ports (``tunnel.StreamOwner``)."""

    event, to_host = EXPOSE, EXPOSE_TO_HOST

    def __init__(self, send: Send, send_bytes: SendBytes) -> None:
        self.send, self.send_bytes = send, send_bytes
        self._connections: dict[int, _Forwarded] = {}
        self._lock = threading.Lock()
        self._closed = False

    def send_data(self, number: int, data: bytes) -> None:
        """A connection's bytes to the host, in this kind's own (base64) lines."""
        self.send_bytes(tunnel_data(EXPOSE_TO_HOST, number, data))

    def forget(self, number: int) -> None:
        with self._lock:
            self._connections.pop(number, None)

    def from_host_line(self, line: bytes) -> bool:
        """Every ``xp`` frame from the host — data queued undecoded for its connection's
        writer, the rest acted on here; False for a line of another kind."""
        found = tunnel_number(line, EXPOSE_TO_AGENT)
        if found is None:
            return False
        number, is_data = found
        with self._lock:
            connection = self._connections.get(number)
        if is_data:
            if connection is not None and not connection.ended:
                try:
                    connection.outbox.put(tunnel_payload(line))
                except ValueError:  # not base64: the host does not write it
                    connection.end(tell_host=True)
            elif connection is None:
                self._gone(number)
            return True
        try:
            frame = loads(line.decode())
        except ValueError:
            return True  # not a frame the host writes: nothing to act on
        if frame.get("o") == "open":
            self._open(number, frame.get("port"))
        elif connection is not None:
            connection.from_host(frame)
        elif frame.get("o") != "end":
            self._gone(number)
        return True

    def _gone(self, number: int) -> None:
        """A frame for a stream this agent does not hold (it ended, or the host last spoke to
        another connection of a durable session): the host's client must not wait on it."""
        self.send({"ev": EXPOSE, "c": number, "o": "end"})

    def _open(self, number: int, port: Any) -> None:
        valid = isinstance(port, int) and not isinstance(port, bool) and 0 < port <= _MAX_PORT
        with self._lock:
            refuse = (self._closed or not valid or number in self._connections
                      or len(self._connections) >= MAX_CONNECTIONS)
            if not refuse:
                connection = self._connections[number] = _Forwarded(self, number, port)
        if refuse:
            self._gone(number)
            return
        connection.start()

    def end_all(self) -> None:
        """The host's end is gone (its client detached, or the session closes)."""
        with self._lock:
            connections = list(self._connections.values())
        for connection in connections:
            connection.end(tell_host=False)
            with contextlib.suppress(OSError):  # wakes a reader blocked in recv
                connection.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self.end_all()


__all__ = ["MAX_CONNECTIONS", "PortForwards"]
