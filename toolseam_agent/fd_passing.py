"""Egress's lane: where the host and the agent share a kernel (the host backend, bind mode), each
connection a command opens is handed to the toolseam process whole, as a descriptor
(``SCM_RIGHTS``), instead of being carried byte by byte over the session's channel.

The host sends the agent one end of a ``SOCK_SEQPACKET`` pair with its ``egress_listen``
request (the descriptor rides on the request's bytes, so it arrives with them). From then on
every accepted connection is one record on that lane: a JSON header (the connection's number;
for a captured one the name and port it was dialled for; who opened it) and the socket itself.
The agent keeps no copy: the bytes flow between the sandbox's client and the proxy without
crossing this process. Nothing here decides anything; the host checks what it receives
(``toolseam/backends/agentlink/fd_lane.py``).

Why by hand: the stdlib has ``socket.send_fds``/``recv_fds``, used here, but the channel's
reader must keep descriptors that arrive mid-stream, which no library does for a plain loop.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import socket
import stat
from typing import Any

_FDS_AT_MOST = 4  # descriptors kept from the host at once; more are closed at once
_ANCILLARY = socket.CMSG_SPACE(_FDS_AT_MOST * array.array("i").itemsize)


class Received:
    """The descriptors the host passed on the channel, oldest first, and the channel's socket
    object for ``recvmsg`` (made once per channel descriptor)."""

    def __init__(self) -> None:
        self.fds: list[int] = []
        self._fd = -1
        self._sock: socket.socket | None = None

    def forget(self) -> None:
        """The channel's descriptor changed (a durable agent's client went or came): a new
        connection may reuse the old one's number."""
        if self._sock is not None:
            self._sock.close()
        self._fd, self._sock = -1, None

    def socket_for(self, fd: int) -> socket.socket | None:
        """A socket object over ``fd`` (a duplicate), or None when ``fd`` is not a unix socket
        (a pipe: nothing can be passed on it)."""
        if fd != self._fd:
            self.forget()
            self._fd = fd
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.fstat(fd).st_mode):
                    sock = socket.socket(fileno=os.dup(fd))
                    if sock.family == socket.AF_UNIX:
                        self._sock = sock
                    else:
                        sock.close()
        return self._sock

    def receive(self, sock: socket.socket, size: int) -> bytes:
        """``recv`` that keeps passed descriptors (at most a few; the rest are closed)."""
        # close-on-exec from the start: jobs are spawned by posix_spawn, which passes on every
        # inheritable descriptor — a command must never hold the lane
        data, ancillary, _flags, _ = sock.recvmsg(size, _ANCILLARY, socket.MSG_CMSG_CLOEXEC)
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
                for fd in fds:
                    if len(self.fds) < _FDS_AT_MOST:
                        self.fds.append(fd)
                    else:
                        os.close(fd)
        return data

    def take_lane(self) -> socket.socket | None:
        """The oldest passed descriptor, if it is a ``SOCK_SEQPACKET`` unix socket (the lane);
        anything else is closed and None returned (the frames carry egress then)."""
        while self.fds:
            fd = self.fds.pop(0)
            try:
                lane = socket.socket(fileno=fd)
            except OSError:
                os.close(fd)
                continue
            if lane.family == socket.AF_UNIX and lane.type == socket.SOCK_SEQPACKET:
                lane.setblocking(True)
                return lane
            lane.close()
        return None


def hand_over(lane: socket.socket, sock: socket.socket, header: dict[str, Any]) -> None:
    """One connection to the host: its header and the socket, as one record. Raises OSError
    when the lane is gone (the caller closes the connection)."""
    socket.send_fds(lane, [json.dumps(header, separators=(",", ":")).encode()], [sock.fileno()])
