"""The channel to a container's agent over the engine's own attach stream: no shared filesystem.

The agent is the container's main process speaking on stdin/stdout; the host asks the engine
to attach to it (``POST …/attach?stdin&stdout&stderr&stream``) and the engine upgrades that
HTTP connection to a raw, two-way stream — the same "hijack" docker's and podman's own
clients use. What we write is the agent's stdin as is; what comes back is the engine's
multiplexed framing (8-byte header: stream, 3 zero bytes, big-endian length) around the
agent's stdout and stderr.

Written by hand, on asyncio: the docker SDK's ``attach_socket`` hands back a blocking socket
(an ``SSLSocket`` over TLS, which asyncio cannot adopt) and podman-py has no attach at all.
Doing the upgrade ourselves gives one asyncio transport on every endpoint kind — unix socket,
plain TCP, TLS — with the same per-call cost as the local unix-socket channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import struct
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ....seam.errors import CouldNotRunError
from ...agentlink.channel import AgentChannel

_HEADER = struct.Struct(">BxxxL")
_STDOUT, _STDERR = 1, 2
_MAX_HEADERS = 64 * 1024
_STDERR_TAIL = 50  # lines of the agent's stderr kept for a could-not-run message
# A peer that vanishes without a reset (a machine gone, a cable pulled) is noticed by TCP
# keepalive within idle + interval * count seconds, so a call never waits forever on it.
KEEPALIVE = (10, 5, 3)


@dataclass(frozen=True)
class TlsFiles:
    """TLS material for a ``tcp://`` engine, as docker's own client takes it: a CA, a client
    certificate and key (``ca.pem``, ``cert.pem``, ``key.pem`` in ``DOCKER_CERT_PATH``)."""

    ca: str | None
    client_cert: tuple[str, str] | None
    verify: bool = True

    @classmethod
    def from_dir(cls, path: str, verify: bool = True) -> TlsFiles:
        def present(name: str) -> str | None:
            full = os.path.join(path, name)
            return full if os.path.exists(full) else None
        cert, key = present("cert.pem"), present("key.pem")
        return cls(present("ca.pem"), (cert, key) if cert and key else None, verify)

    @classmethod
    def from_env(cls) -> TlsFiles | None:
        """``DOCKER_CERT_PATH`` (default ``~/.docker``) when ``DOCKER_TLS_VERIFY`` is set
        (verify the engine) or ``DOCKER_CERT_PATH`` is (encrypt only); else None."""
        verify = bool(os.environ.get("DOCKER_TLS_VERIFY"))
        path = os.environ.get("DOCKER_CERT_PATH")
        if not verify and not path:
            return None
        return cls.from_dir(path or os.path.expanduser("~/.docker"), verify)

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca if self.verify else None)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.client_cert is not None:
            context.load_cert_chain(*self.client_cert)
        return context


@dataclass(frozen=True)
class EngineAddress:
    """Where an engine listens, as its clients take it: unix path or TCP host and port, TLS."""

    endpoint: str
    unix_path: str | None
    host: str | None
    port: int | None
    tls: ssl.SSLContext | None
    remote: bool = False  # a unix socket that is an ssh tunnel's end: the engine is elsewhere

    @classmethod
    def parse(cls, endpoint: str, tls: ssl.SSLContext | None = None) -> EngineAddress:
        parts = urlsplit(endpoint)
        if parts.scheme in ("unix", "http+unix"):
            return cls(endpoint, parts.path, None, None, None)
        if parts.scheme in ("tcp", "http", "https") and parts.hostname:
            if parts.scheme == "https" and tls is None:
                tls = ssl.create_default_context()
            return cls(endpoint, None, parts.hostname, parts.port or (2376 if tls else 2375),
                       tls)
        raise CouldNotRunError(f"engine endpoint {endpoint!r} cannot carry the agent's channel: "
                               "use unix://, tcp:// (with TLS settings), https:// or ssh://",
                               retryable=False)

    @classmethod
    def tunnelled(cls, endpoint: str, local_socket: str) -> EngineAddress:
        return cls(endpoint, local_socket, None, None, None, remote=True)

    @property
    def is_local(self) -> bool:
        return self.unix_path is not None and not self.remote


class _AttachProtocol(asyncio.Protocol):
    """Sends the upgrade request, checks the answer, then unframes the agent's output into the
    ``AgentChannel`` it carries. Writes need no framing: they are the agent's stdin."""

    def __init__(self, channel: AgentChannel, request: bytes) -> None:
        self.channel = channel
        self.request = request
        self.upgraded: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.stderr: deque[str] = deque(maxlen=_STDERR_TAIL)
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self.upgraded.done():
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > _MAX_HEADERS:
                    self._fail("the engine's attach answer has no end of headers")
                return
            head = bytes(self._buffer[:end]).decode("latin-1")
            del self._buffer[:end + 4]
            status = head.split("\r\n", 1)[0].split(" ")
            # docker answers 101 Switching Protocols; podman's libpod attach answers 200 and
            # then speaks the same framed stream on the connection
            if len(status) < 2 or status[1] not in ("101", "200"):
                self._fail(f"the engine refused to attach: {head.splitlines()[0]} "
                           f"{bytes(self._buffer[:300]).decode('utf-8', 'replace').strip()}")
                return
            assert self._transport is not None
            self.channel.connection_made(self._transport)
            self.upgraded.set_result(None)
        self._unframe()

    def _unframe(self) -> None:
        buffer = self._buffer
        while len(buffer) >= _HEADER.size:
            kind, size = _HEADER.unpack_from(buffer)
            if len(buffer) < _HEADER.size + size:
                return
            payload = bytes(buffer[_HEADER.size:_HEADER.size + size])
            del buffer[:_HEADER.size + size]
            if kind == _STDOUT:
                self.channel.data_received(payload)
            elif kind == _STDERR:
                self.stderr.extend(payload.decode("utf-8", "replace").splitlines())

    def _fail(self, reason: str) -> None:
        if not self.upgraded.done():
            self.upgraded.set_exception(CouldNotRunError(reason, retryable=True))
        if self._transport is not None:
            self._transport.abort()

    def eof_received(self) -> bool:
        return self.channel.eof_received() if self.upgraded.done() else False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.upgraded.done():
            self._fail(f"the engine closed the attach connection: {exc or 'end of stream'}")
            return
        self.channel.connection_lost(exc)

    def pause_writing(self) -> None:
        self.channel.pause_writing()

    def resume_writing(self) -> None:
        self.channel.resume_writing()


async def attach_channel(address: EngineAddress, path: str, label: str,
                         timeout_s: float = 15.0) -> tuple[AgentChannel, deque[str]]:
    """An ``AgentChannel`` on the attach stream at ``path`` (the engine's HTTP path), and the
    live tail of the agent's stderr for diagnostics."""
    loop = asyncio.get_running_loop()
    host = address.host or "localhost"
    request = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\n"
               "Upgrade: tcp\r\nContent-Length: 0\r\n\r\n").encode()
    channel = AgentChannel(label)
    protocol = _AttachProtocol(channel, request)
    try:
        if address.unix_path is not None:
            transport, _ = await asyncio.wait_for(
                loop.create_unix_connection(lambda: protocol, address.unix_path), timeout_s)
        else:
            transport, _ = await asyncio.wait_for(loop.create_connection(
                lambda: protocol, host, address.port or 0, ssl=address.tls,
                server_hostname=address.host if address.tls else None), timeout_s)
            _keepalive(transport.get_extra_info("socket"))
        await asyncio.wait_for(protocol.upgraded, timeout_s)
    except (OSError, TimeoutError, ssl.SSLError) as exc:
        protocol._fail(str(exc))
        raise CouldNotRunError(f"could not attach to the sandbox agent through "
                               f"{address.endpoint}: {exc or 'timed out'}", retryable=True) from None
    return channel, protocol.stderr


def _keepalive(sock: Any) -> None:
    if sock is None:
        return
    idle, interval, count = KEEPALIVE
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, (idle + interval * count) * 1000)
