"""How a remote backend's calls reach the server that hosts its sandbox: ONE small interface
(httpx's transport, SWE-ReX's runtime), with a unix socket (``unix.py``) and an in-process
loopback for unit tests here; a Ray node actor's calls and its direct connection, or a
Kubernetes pod's port-forward, are more of the same (docs/architecture.md).

What crosses is values, never classes: a request ``(session id, secret, operation, args,
kwargs)``; an answer ``("ok", value)`` or ``("err", error)`` where ``error`` is the one error
map's answer (``agentlink/errors.py:error_answer``). A transport that leaves this process
encodes them with the restricted codec (``codec.py``); the loopback does too, so a unit test
meets what a real wire gives.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from .codec import dumps, loads

Request = tuple[str, str, str, tuple[Any, ...], dict[str, Any]]
Answer = tuple[Any, ...]
OnEvent = Callable[[Any], None]


class TransportLost(Exception):
    """The connection to the server ended with this call in flight (it may have run there), or
    could not be made (``sent`` false: nothing reached the server); the message says which
    server and why. ``server_gone`` false: only this call's route dropped while the server is
    known to be there (a Ray node's direct port, its actor answering): the session goes on."""

    def __init__(self, message: str, sent: bool = True, server_gone: bool = True) -> None:
        super().__init__(message)
        self.sent, self.server_gone = sent, server_gone


@runtime_checkable
class Transport(Protocol):
    """Carries one session's requests to its server and the answers back."""

    where: str  # the server, in words for a message ("the remote server at /run/x")
    same_machine: bool  # the server shares this machine's files and processes (a unix socket)

    async def call(self, request: Request) -> Answer:
        """Send ``request``; its answer.

        Raises:
            TransportLost: the server cannot be reached, or went away before it answered.
        """

    async def stream(self, request: Request, on_event: OnEvent) -> Answer:
        """As ``call``; what the server emits while it runs (``start``'s output chunks) goes
        to ``on_event`` in order, every event before the answer.

        Raises:
            TransportLost: as ``call``.
        """

    async def close(self) -> None:
        """End the connection (the server closes the sessions it opened). Idempotent."""

    def another(self) -> Transport:
        """A new transport, not yet connected, to a server that can take a sibling session
        (a fork's child): the same server for a socket; any placement for a cluster."""


Handler = Callable[[Request, OnEvent | None, object], Awaitable[Answer]]


class LoopbackTransport:
    """A server in this process (``RemoteServer.handle``): each request and answer still goes
    through the codec, so a unit test sees what a socket would carry."""

    same_machine = True

    def __init__(self, handle: Handler, drop: Callable[[object], Awaitable[None]]) -> None:
        self._handle, self._drop = handle, drop
        self.where = "the loopback server"
        self._closed = False

    async def call(self, request: Request) -> Answer:
        return await self._send(request, None)

    async def stream(self, request: Request, on_event: OnEvent) -> Answer:
        return await self._send(request, lambda event: on_event(loads(dumps(event))))

    async def _send(self, request: Request, emit: OnEvent | None) -> Answer:
        if self._closed:
            raise TransportLost(f"{self.where}: the transport was closed")
        answer: Answer = loads(dumps(await self._handle(loads(dumps(request)), emit, self)))
        return answer

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._drop(self)

    def another(self) -> LoopbackTransport:
        return LoopbackTransport(self._handle, self._drop)
