"""The remote wire on a unix socket of this machine: ``UnixListener`` (the server's) and
``UnixTransport`` (the client's).

Who may connect is said three times over, each enough alone: the server's directory is 0700
and the socket in it 0600 (another local user cannot reach it); the kernel's ``SO_PEERCRED``
names each peer's uid, and any uid but the server's own is closed unread; and the peer must
prove the server key (a fresh 32-byte key the server writes 0600 beside the socket, read by
clients of the same user) before a byte it sends is decoded (``frames.py``). The client checks
the same of the server: its uid, then its proof — so a process of another user that took the
path after a crash is sent nothing.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import stat
import struct
from pathlib import Path

from ...seam.errors import ConfigurationError
from ..staging import UnsafePath, check_owned
from .frames import Refused, client_handshake, server_handshake
from .link import StreamLink
from .listener import Connection
from .server import RemoteServer
from .transport import Answer, OnEvent, Request, TransportLost

SOCKET, KEY = "socket", "key"
CONTEXT = "toolseam remote unix"
CONNECT_TIMEOUT_S = 5.0


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a unix socket, asked of the kernel."""
    _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                    struct.calcsize("3i")))
    return int(uid)


def private_dir(directory: Path) -> Path:
    """``directory`` made 0700 if missing; an existing one must be this user's alone (not a
    link, nobody else's, no permission for others) or ``UnsafePath`` says why."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_owned(directory, os.geteuid(), exact_owner=True)
    if stat.S_IMODE(os.lstat(directory).st_mode) & 0o077:
        raise UnsafePath(f"{directory} is open to other users; chmod 700 it")
    return directory


def read_key(directory: Path) -> bytes:
    """The server key beside the socket: this user's file, 0600, not a link."""
    fd = os.open(directory / KEY, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as kept:
        seen = os.fstat(kept.fileno())
        if seen.st_uid != os.geteuid() or seen.st_mode & 0o077:
            raise UnsafePath(f"{directory / KEY} is not this user's alone")
        return bytes.fromhex(kept.read().strip())


class UnixListener:
    """A ``RemoteServer`` on ``<directory>/socket``: ``start`` writes a new key, then makes the
    socket appear (renamed into place once listening, so a client that sees it can connect)."""

    def __init__(self, server: RemoteServer, directory: Path) -> None:
        self.server, self.directory = server, private_dir(directory)
        self._listening: asyncio.Server | None = None
        self._key = b""
        self.refused = 0  # connections closed before a request: another uid, or no proof

    async def start(self) -> None:
        self._key = secrets.token_bytes(32)
        key_path, made = self.directory / KEY, self.directory / f".{SOCKET}.{os.getpid()}"
        for stale in (key_path, made, self.directory / SOCKET):
            stale.unlink(missing_ok=True)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self._key.hex())
        previous = os.umask(0o177)  # the socket is 0600 from its first moment
        try:
            self._listening = await asyncio.start_unix_server(self._accepted, str(made))
        finally:
            os.umask(previous)
        os.rename(made, self.directory / SOCKET)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                        ) -> None:
        sock = writer.get_extra_info("socket")
        if sock is None or peer_uid(sock) != os.geteuid():
            self.refused += 1
            writer.close()  # another user: closed unread
            return
        try:
            await server_handshake(reader, writer, self._key, CONTEXT)
        except (Refused, TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError):
            self.refused += 1
            writer.close()
            return
        connection = Connection(self.server.handle, reader, writer, self.server.drop)
        try:
            await connection.serve()
        finally:
            await self.server.drop(connection)  # again, if serve itself was cancelled

    async def close(self) -> None:
        if self._listening is not None:
            self._listening.close()
        await self.server.close()
        (self.directory / SOCKET).unlink(missing_ok=True)


class UnixTransport:
    """The client's end: one connection, made at the first call, proven both ways."""

    same_machine = True

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.where = f"the remote server at {self.directory / SOCKET}"
        self._link: StreamLink | None = None
        self._connecting = asyncio.Lock()
        self._closed = False

    async def _connected(self) -> StreamLink:
        if self._link is not None:
            return self._link
        if self._closed:
            raise TransportLost(f"{self.where}: the transport was closed")
        async with self._connecting:
            if self._link is None:
                self._link = await self._connect()
        return self._link

    async def _connect(self) -> StreamLink:
        writer: asyncio.StreamWriter | None = None
        try:
            key = read_key(self.directory)
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(
                    str(self.directory / SOCKET))
                sock = writer.get_extra_info("socket")
                if sock is None or peer_uid(sock) != os.geteuid():
                    raise Refused("its socket is held by another user")
                await client_handshake(reader, writer, key, CONTEXT)
        except (OSError, UnsafePath, ValueError, Refused, TimeoutError,
                asyncio.IncompleteReadError) as exc:
            if writer is not None:
                writer.transport.abort()
            raise TransportLost(f"{self.where} cannot be reached "
                                f"({type(exc).__name__}: {exc})", sent=False) from None
        return StreamLink(reader, writer, self.where)

    async def call(self, request: Request) -> Answer:
        return await (await self._connected()).send(request, None)

    async def stream(self, request: Request, on_event: OnEvent) -> Answer:
        return await (await self._connected()).send(request, on_event)

    async def close(self) -> None:
        self._closed = True
        if self._link is not None:
            await self._link.close()

    def another(self) -> UnixTransport:
        return UnixTransport(self.directory)

    def durable_address(self) -> str:
        """``unix:DIR``: what a durable session's handle names (``durable.Reconnectable``)."""
        return f"unix:{self.directory.resolve()}"

    @classmethod
    def at_address(cls, rest: str) -> UnixTransport:
        """The transport to the server a handle's ``unix:DIR`` names (its socket and key are
        proven at the first call, as always)."""
        if not rest.startswith("/"):
            raise ConfigurationError(f"session handle: unix:{rest} is not an absolute "
                                     "directory")
        return cls(rest)
