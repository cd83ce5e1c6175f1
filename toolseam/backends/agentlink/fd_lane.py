"""The toolseam process's end of egress's lane (``toolseam_agent/fd_passing.py``): where the
agent shares this kernel, each connection a command opens arrives here as its socket, and the
proxy serves it directly — no frames, no agent thread, no copy through the session channel.

Whatever comes on the lane is checked before it is served: a record must carry exactly one
descriptor, that descriptor must be a connected TCP stream socket (an agent that hands over a
file, a pipe, a listener or a unix socket gets it closed), and its header must be the shape the
agent writes. The lane carries nothing else: a command cannot reach it (it is one end of a
socketpair the agent holds, in a process commands cannot trace).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .tunnel import cancel_handlers

Opened = dict[str, Any]  # ``egress_target`` and ``egress_origin``, as the tunnel's transport says


class ServeOpened(Protocol):
    """The proxy's ``handle``: a connection's streams and, from the lane, what its header
    said (from the frames' tunnel, the transport says it)."""

    def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 opened: Opened | None = None, /) -> Awaitable[None]: ...


_RECORD_MAX = 8192  # a header: a number, a name, a port, a pid and an argv head
_FDS_AT_MOST = 4
_ANCILLARY = socket.CMSG_SPACE(_FDS_AT_MOST * array.array("i").itemsize)
_READER_LIMIT = 1 << 16
_log = logging.getLogger("toolseam.egress")


class FdLane:
    """One session's lane; ``agent_end`` goes to the agent with ``egress_listen``."""

    def __init__(self, serve: ServeOpened) -> None:
        self._serve = serve
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        self._sock: socket.socket | None = ours
        self.agent_end: socket.socket | None = theirs
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.served = 0  # connections taken from the lane (the rest were refused)

    def start(self) -> None:
        """The agent took its end: read records as they come."""
        self.drop_agent_end()
        assert self._sock is not None
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._ready)

    def drop_agent_end(self) -> None:
        """Our copy of the agent's end (sent, or never used)."""
        if self.agent_end is not None:
            self.agent_end.close()
            self.agent_end = None

    @property
    def open_connections(self) -> int:
        return len(self._tasks)

    def _ready(self) -> None:
        sock = self._sock
        while sock is not None:
            try:
                data, fds, flags = _receive(sock)
            except BlockingIOError:
                return
            except OSError:
                data, fds, flags = b"", [], 0
            if not data and not fds:  # the agent's end closed: the session is going
                self.stop()
                return
            self._take(data, fds, flags)

    def _take(self, data: bytes, fds: list[int], flags: int) -> None:
        header = _header(data) if len(fds) == 1 and not flags & (socket.MSG_CTRUNC
                                                                  | socket.MSG_TRUNC) else None
        if header is None:
            for fd in fds:
                os.close(fd)
        conn = _tcp_socket(fds[0]) if header is not None else None  # else closed there
        if header is None or conn is None:
            _log.info("egress lane: a record that is not a connection was refused")
            return
        self.served += 1
        task = asyncio.get_running_loop().create_task(self._serve_one(conn, header))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve_one(self, conn: socket.socket, header: dict[str, Any]) -> None:
        opened: Opened = {
            "egress_target": (header["h"], header["p"]) if "h" in header else None,
            "egress_origin": {key: header[key] for key in ("pid", "argv", "job") if key in header}}
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_READER_LIMIT, loop=loop)
        served: asyncio.Future[asyncio.StreamWriter] = loop.create_future()
        # A protocol with a "client connected" callback: asyncio's start_tls on its writer is
        # then the server's side (the proxy terminates TLS for hosts with credentials).
        protocol = _HeldProtocol(reader, served.set_result,
                                 hold=opened["egress_target"] is not None)
        try:
            await loop.connect_accepted_socket(lambda: protocol, sock=conn)
        except OSError:
            conn.close()
            return
        writer = await served
        try:
            await self._serve(reader, writer, opened)
        finally:
            if writer.transport is not None and not writer.transport.is_closing():
                writer.close()

    def stop(self) -> None:
        """No more connections (the channel ended); those being served go on until the proxy
        ends them."""
        self.drop_agent_end()
        sock, self._sock = self._sock, None
        if sock is not None:
            if self._loop is not None:
                with contextlib.suppress(ValueError, RuntimeError):
                    self._loop.remove_reader(sock.fileno())
            sock.close()

    async def close(self) -> None:
        """No more connections; those being served end (the proxy's close aborts them)."""
        self.stop()
        await cancel_handlers(self._tasks)


class _HeldProtocol(asyncio.StreamReaderProtocol):
    """A stream protocol whose first read can wait (``hold``) for the proxy to choose."""

    def __init__(self, reader: asyncio.StreamReader,
                 connected: Callable[[asyncio.StreamWriter], None], hold: bool) -> None:
        super().__init__(reader, lambda _reader, writer: connected(writer))
        self._hold = hold

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._hold and isinstance(transport, asyncio.ReadTransport):
            transport.pause_reading()  # before the loop first reads it


def _receive(sock: socket.socket) -> tuple[bytes, list[int], int]:
    """One record and its descriptors, close-on-exec from the start (``socket.recv_fds``
    drops its ``flags`` before Python 3.12, so not that)."""
    data, ancillary, flags, _ = sock.recvmsg(_RECORD_MAX, _ANCILLARY, socket.MSG_CMSG_CLOEXEC)
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return data, list(fds), flags


def _header(data: bytes) -> dict[str, Any] | None:
    """The agent's header, or None for anything else."""
    try:
        header = json.loads(data)
    except ValueError:
        return None
    if not isinstance(header, dict) or not isinstance(header.get("c"), int):
        return None
    if "h" in header and not (isinstance(header["h"], str) and isinstance(header.get("p"), int)
                              and 0 < header["p"] < 65536):
        return None
    origin_ok = (isinstance(header.get("pid", 0), int) and isinstance(header.get("job", ""), str)
                 and isinstance(header.get("argv", []), list))
    return header if origin_ok else None


def _tcp_socket(fd: int) -> socket.socket | None:
    """``fd`` as a socket if it is a connected TCP stream (else closed, and None)."""
    try:
        conn = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        return None
    try:
        if (conn.family in (socket.AF_INET, socket.AF_INET6) and conn.type == socket.SOCK_STREAM
                and not conn.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)):
            conn.getpeername()  # raises for one that is not connected
            conn.setblocking(False)
            return conn
    except OSError:
        pass
    conn.close()
    return None
