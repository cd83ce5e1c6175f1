"""A session's tool calls on a direct connection to its node actor (decision 312).

One empty Ray actor call, awaited from asyncio, costs 0.9-1.8 ms here — more than the budget of
"through the cluster ≤ the same backend here + 1 ms" before the call does anything. So the
node actor also listens on its node's Ray address (a port of its own, chosen by the kernel),
and each session's holder opens one connection to it; everything else (placement, open,
claims, close, attach, the workspace) stays on Ray, and a connection that cannot
be made leaves the session on Ray calls.

Who may use it: the hello names a session and carries a fresh nonce; the node answers its own
nonce and its proof of the session's key, the caller checks it and answers its own proof
(``handshake.py``): neither end sends the secret, and the caller sends no call to a port that
cannot prove the session's key (an impostor actor's, another local user's). Until the caller
has proved itself nothing it sends is unpickled — the hello is split as bytes. After it,
requests and answers are read by ``codec.loads`` (seam models only, validated again), at most
``codec.MAX_REQUEST`` bytes a request. With ``RAY_USE_TLS`` the connection is TLS with Ray's
certificates; without it, what travels after the proofs (calls and answers) is in clear on the
cluster's network, as Ray's own traffic is.

Frames: a 4-byte big-endian length, then the body. Requests ``(id, method, args, trace)``
(``trace``: the caller's span's ``TraceContext``, or None when it does not trace), a
cancellation ``(id, None, None, None)``; answers ``(id, answer)``: ``("ok", value)`` or
``("err", error answer)`` of the one error map (``agentlink/errors.py``), as the remote wire's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import pickle
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from ..backends.agentlink.errors import error_answer
from ..backends.remote.codec import MAX_ANSWER, MAX_REQUEST, dumps, loads
from ..backends.remote.handshake import decoy_proof, holds, is_nonce, nonce, proof
from ..seam.errors import HostError
from ..seam.models import TraceContext
from .handshake import client_tls, server_tls
from .identity import IDENTITY_HELLO, identity_proof

HELLO = b"toolseam-ray-direct-2"
MAX_HELLO = 4096  # a hello larger than this is not one: the peer is dropped unread
CONNECT_TIMEOUT_S = 2.0
HELLO_TIMEOUT_S = 5.0  # a peer that says nothing is dropped: silent connections cannot pile up
_LENGTH = struct.Struct(">I")
Answer = tuple[Any, ...]


def refused(exc: BaseException) -> Answer:
    """A failure as an answer: the one error map's (``map_seam_error`` reads it back)."""
    return ("err", error_answer(exc))


def trace_context(value: object) -> TraceContext | None:
    """A request's trace context: a ``TraceContext`` (the codec validated it) or nothing."""
    if value is not None and not isinstance(value, TraceContext):
        raise TypeError("a call's trace context is not a TraceContext")
    return value


async def read_frame(reader: asyncio.StreamReader, limit: int) -> bytes:
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
Call = Callable[[str, str, tuple[Any, ...], TraceContext | None], Awaitable[Answer]]
KeyFor = Callable[[str], bytes | None]
Identity = Callable[[], tuple[bytes, str] | None]  # the node key and the actor's id, once bound


class NodeServer:
    """The node actor's listener: ``call`` is ``NodeSessions.call_held`` (a session whose
    holder proved its key; the in-flight count and orphan clock kept as on the Ray path),
    ``key_for`` a session's key (None: no such session), ``identity`` what the actor proves to
    a driver that did not create it (identity.py)."""

    def __init__(self, call: Call, key_for: KeyFor, identity: Identity = lambda: None) -> None:
        self._call, self._key_for, self._identity = call, key_for, identity
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self, host: str) -> int:
        tls = server_tls()
        self._server = await asyncio.start_server(
            self._serve, host, 0, ssl=tls,
            ssl_handshake_timeout=HELLO_TIMEOUT_S if tls is not None else None)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def _proved(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                      ) -> str | None:
        """The hello's session once both ends proved its key (None: refused, answered so)."""
        first = await asyncio.wait_for(read_frame(reader, MAX_HELLO), HELLO_TIMEOUT_S)
        if first.startswith(IDENTITY_HELLO + b"\0"):  # a driver asks who this actor is
            self._prove_identity(writer, first.partition(b"\0")[2].decode("ascii", "replace"))
            return None
        sid, caller_nonce = _hello(first)
        key, node_nonce = self._key_for(sid), nonce()
        mine = proof(key, "node", sid, caller_nonce, node_nonce) if key else decoy_proof()
        writer.write(frame(f"{node_nonce}\0{mine}".encode()))
        given = await asyncio.wait_for(read_frame(reader, MAX_HELLO), HELLO_TIMEOUT_S)
        if key is None or not holds(key, "caller", sid, caller_nonce, node_nonce,
                                    given.decode("ascii", "replace")):
            # the same answer for "no such session" and "not yours": nothing to probe with
            writer.write(frame(dumps(refused(HostError(
                f"no session {sid[:8]}… on this node answers this handle")))))
            return None
        writer.write(frame(dumps(("ok", None))))
        return sid

    def _prove_identity(self, writer: asyncio.StreamWriter, theirs: str) -> None:
        bound, mine = self._identity(), nonce()
        if bound is None or not is_nonce(theirs):
            writer.write(frame(b""))  # not bound yet (its creator's first call is on its way)
            return
        writer.write(frame(f"{mine}\0{identity_proof(bound[0], bound[1], theirs, mine)}"
                           .encode()))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        keep_alive(writer.get_extra_info("socket"))
        tasks: dict[int, asyncio.Task[None]] = {}
        try:
            sid = await self._proved(reader, writer)
            if sid is None:
                return
            while True:
                req, method, args, trace = loads(await read_frame(reader, MAX_REQUEST))
                if method is None:
                    task = tasks.get(req)
                    if task is not None:
                        task.cancel()
                    continue
                task = asyncio.ensure_future(self._answer(
                    writer, req, sid, str(method), tuple(args), trace_context(trace)))
                tasks[req] = task
                task.add_done_callback(functools.partial(_forget, tasks, req))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, TimeoutError,
                pickle.UnpicklingError, EOFError, TypeError):
            pass  # the peer left, was silent, or sent what is not a call: the connection ends
        finally:
            for task in list(tasks.values()):
                task.cancel()  # as Ray cancels an async call whose caller is gone
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, req: int, sid: str,
                      method: str, args: tuple[Any, ...], trace: TraceContext | None) -> None:
        try:
            answer = await self._call(sid, method, args, trace)
        except Exception as exc:  # noqa: BLE001 - a call that broke is an answer, never a hang
            answer = refused(exc)
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
    """The hello's session id and the caller's nonce (bytes split, nothing unpickled)."""
    magic, sid, caller_nonce = body.split(b"\0", 2)
    if magic != HELLO or not is_nonce(caller_nonce.decode("ascii")):
        raise ValueError("not a toolseam direct hello")
    return sid.decode("ascii"), caller_nonce.decode("ascii")


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
    async def connect(cls, host: str, port: int, sid: str, key: bytes) -> DirectLink | None:
        """The link, or None when the node cannot be reached directly or does not prove the
        session's ``key`` (the remote server's ``derived_key``): the Ray path stays."""
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(host, port, ssl=client_tls())
                keep_alive(writer.get_extra_info("socket"))
                mine = nonce()
                writer.write(frame(b"\0".join((HELLO, sid.encode(), mine.encode()))))
                node_nonce, _, node_proof = (await read_frame(reader, MAX_HELLO)).partition(b"\0")
                theirs = node_nonce.decode("ascii")
                if not (is_nonce(theirs) and holds(key, "node", sid, mine, theirs,
                                                   node_proof.decode("ascii"))):
                    raise ValueError("the port does not prove the session's key")
                writer.write(frame(proof(key, "caller", sid, mine, theirs).encode()))
                answer = loads(await read_frame(reader, MAX_ANSWER))
            if not (isinstance(answer, tuple) and answer and answer[0] == "ok"):
                raise ValueError("refused")
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError,
                pickle.UnpicklingError, EOFError):
            if writer is not None:
                writer.transport.abort()
            return None
        return cls(reader, writer)

    async def _read(self) -> None:
        try:
            while True:
                req, answer = loads(await read_frame(self._reader, MAX_ANSWER))
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

    async def call(self, method: str, args: tuple[Any, ...],
                   trace: TraceContext | None = None) -> Answer:
        if not self.alive:
            raise Dropped()
        req = next(self._ids)
        waiter: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting[req] = waiter
        try:
            self._writer.write(frame(dumps((req, method, args, trace))))
            await self._writer.drain()  # a large write waits for the node to read it
            return await waiter
        except ConnectionError:
            self._waiting.pop(req, None)
            raise Dropped() from None
        except asyncio.CancelledError:
            self._waiting.pop(req, None)
            if self.alive:  # the node cancels the call in its loop, as ray.cancel does
                self._writer.write(frame(dumps((req, None, None, None))))
            raise

    def close(self) -> None:
        self.alive = False
        self._task.cancel()
        self._writer.close()
