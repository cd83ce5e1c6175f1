"""A session's tool calls on a direct connection to its node actor (decision 312).

One empty Ray actor call, awaited from asyncio, costs 0.9-1.8 ms here — more than the budget of
"through the cluster ≤ the same backend here + 1 ms" before the call does anything. So the
node actor also listens on its node's Ray address (a port of its own, chosen by the kernel),
and each session's holder opens one connection to it; everything else (placement, open,
claims, close, attach, the workspace) stays on Ray, and a connection that cannot
be made leaves the session on Ray calls.

Who may use it: the first frame names a session and carries its secret, checked as every Ray
call's is (constant time, the same answer for unknown and wrong); until it passes, nothing the
peer sends is unpickled — the frame is split as bytes. After it, requests and answers are
pickles read by ``SeamUnpickler``, which builds only builtin values and the seam's own wire
models (``toolseam.seam.models``): a holder of a handle cannot make the node run code by a
crafted pickle. What travels is what a Ray call carries (the secret included), in clear as
Ray's own traffic is unless the cluster uses TLS: bind the cluster to a private network.

Frames: a 4-byte big-endian length, then the body. Requests ``(id, method, args)``, a
cancellation ``(id, None, None)``; answers ``(id, answer)`` in the node's ``_wire`` shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import itertools
import pickle
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel

from ..seam import models
from ..seam.errors import HostError
from ._wire import Answer, encode

HELLO = b"toolseam-ray-direct-1"
MAX_HELLO = 4096  # a hello larger than this is not one: the peer is dropped unread
MAX_FRAME = 1 << 31
CONNECT_TIMEOUT_S = 2.0
HELLO_TIMEOUT_S = 5.0  # a peer that says nothing is dropped: silent connections cannot pile up
_LENGTH = struct.Struct(">I")


class SeamUnpickler(pickle.Unpickler):
    """Builtin values and the seam's wire models only: no callable, no other class."""

    def find_class(self, module: str, name: str) -> Any:
        if module == models.__name__:
            found = getattr(models, name, None)
            if isinstance(found, type) and issubclass(found, BaseModel):
                return found
        raise pickle.UnpicklingError(f"{module}.{name} is not a seam model")


def loads(body: bytes) -> Any:
    return SeamUnpickler(io.BytesIO(body)).load()


def dumps(value: Any) -> bytes:
    return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)


async def read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME) -> bytes:
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > limit:
        raise ValueError(f"a frame of {length} bytes (at most {limit})")
    return await reader.readexactly(length)


def frame(body: bytes) -> bytes:
    return _LENGTH.pack(len(body)) + body


def keep_alive(sock: socket.socket | None) -> None:
    """A peer machine that vanished without a goodbye is noticed in seconds, not hours: the
    node-lost-within-10-s rule holds on this path too."""
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3),
                          ("TCP_USER_TIMEOUT", 6000), ("TCP_NODELAY", 1)):
        if hasattr(socket, option):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


# --- the node's side ------------------------------------------------------------------------
Call = Callable[[str, str, str, tuple[Any, ...]], Awaitable[Answer]]


class NodeServer:
    """The node actor's listener: ``call`` is ``NodeSessions.call`` (the secret checked on every
    request, the session's in-flight count and orphan clock kept as on the Ray path)."""

    def __init__(self, call: Call, check: Callable[[str, str], object]) -> None:
        self._call, self._check = call, check
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self, host: str) -> int:
        self._server = await asyncio.start_server(self._serve, host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        keep_alive(writer.get_extra_info("socket"))
        tasks: dict[int, asyncio.Task[None]] = {}
        try:
            sid, secret = _hello(await asyncio.wait_for(read_frame(reader, MAX_HELLO),
                                                        HELLO_TIMEOUT_S))
            try:
                self._check(sid, secret)
            except HostError as exc:
                writer.write(frame(dumps(encode(exc))))
                return
            writer.write(frame(dumps(("ok", None))))
            while True:
                req, method, args = loads(await read_frame(reader))
                if method is None:
                    task = tasks.get(req)
                    if task is not None:
                        task.cancel()
                    continue
                task = asyncio.ensure_future(
                    self._answer(writer, req, sid, secret, str(method), tuple(args)))
                tasks[req] = task
                task.add_done_callback(functools.partial(_forget, tasks, req))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, TimeoutError,
                pickle.UnpicklingError, EOFError, TypeError):
            pass  # the peer left, was silent, or sent what is not a call: the connection ends
        finally:
            for task in list(tasks.values()):
                task.cancel()  # as Ray cancels an async call whose caller is gone
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, req: int, sid: str, secret: str,
                      method: str, args: tuple[Any, ...]) -> None:
        answer = await self._call(sid, secret, method, args)
        if not writer.is_closing():
            writer.write(frame(dumps((req, answer))))
            with contextlib.suppress(ConnectionError):
                await writer.drain()  # a large answer waits for the caller to read it

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


def _forget(tasks: dict[int, asyncio.Task[None]], req: int, _done: object) -> None:
    tasks.pop(req, None)


def _hello(body: bytes) -> tuple[str, str]:
    magic, sid, secret = body.split(b"\0", 2)
    if magic != HELLO:
        raise ValueError("not a toolseam direct hello")
    return sid.decode("ascii"), secret.decode("ascii")


# --- the caller's side ----------------------------------------------------------------------
class Dropped(Exception):
    """The connection ended with calls in flight (they may have run)."""


class DirectLink:
    """One session's connection to its node actor; ``call`` answers as the Ray path's would."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Answer]] = {}
        self._task = asyncio.ensure_future(self._read())
        self.alive = True

    @classmethod
    async def connect(cls, host: str, port: int, sid: str, secret: str) -> DirectLink | None:
        """The link, or None when the node cannot be reached directly (the Ray path stays)."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
            keep_alive(writer.get_extra_info("socket"))
            writer.write(frame(b"\0".join((HELLO, sid.encode(), secret.encode()))))
            answer = loads(await asyncio.wait_for(read_frame(reader), CONNECT_TIMEOUT_S))
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, pickle.UnpicklingError):
            return None
        if answer[0] != "ok":
            writer.close()
            return None
        return cls(reader, writer)

    async def _read(self) -> None:
        try:
            while True:
                req, answer = loads(await read_frame(self._reader))
                waiter = self._waiting.pop(req, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(answer)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, OSError,
                pickle.UnpicklingError, EOFError, TypeError):
            pass
        finally:
            self.alive = False
            for waiter in self._waiting.values():
                if not waiter.done():
                    waiter.set_exception(Dropped())
            self._waiting.clear()
            self._writer.close()

    async def call(self, method: str, args: tuple[Any, ...]) -> Answer:
        if not self.alive:
            raise Dropped()
        req = next(self._ids)
        waiter: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting[req] = waiter
        try:
            self._writer.write(frame(dumps((req, method, args))))
            await self._writer.drain()  # a large write waits for the node to read it
            return await waiter
        except ConnectionError:
            self._waiting.pop(req, None)
            raise Dropped() from None
        except asyncio.CancelledError:
            self._waiting.pop(req, None)
            if self.alive:  # the node cancels the call in its loop, as ray.cancel does
                self._writer.write(frame(dumps((req, None, None))))
            raise

    def close(self) -> None:
        self.alive = False
        self._task.cancel()
        self._writer.close()
