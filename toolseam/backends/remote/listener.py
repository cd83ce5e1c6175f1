"""The server's end of one proven byte-stream connection (any transport that has a reader and a
writer: the unix socket's listener, tomorrow a Ray node's port or a pod's): requests decoded by
the restricted codec, each run as a task of its own, answered by id; events of a streamed call
sent as they come; a cancellation cancels its task.

Frames after the handshake: a request ``(id, request)``, a cancellation ``(id, None)``; an
answer ``(id, "answer", answer)``, an event ``(id, "event", value)``. A frame the server will
not take — over ``MAX_REQUEST`` bytes, not a pickle of seam values, not of this shape — is
answered once with id 0 and a clear error, and the connection ends (its sessions with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import pickle
from collections.abc import Awaitable, Callable
from typing import Any

from ...seam.errors import HostError
from ..agentlink.errors import error_answer
from .codec import dumps, loads
from .frames import MAX_REQUEST, FrameTooLarge, frame, read_frame
from .transport import Answer, Handler


class Connection:
    """One client's connection; ``owner`` of the sessions it opens (``RemoteServer.drop``)."""

    def __init__(self, handle: Handler, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter,
                 drop: Callable[[object], Awaitable[None]] | None = None) -> None:
        """``drop``: the server's, called once the peer left and before its calls still in
        flight are cancelled — a durable session's are its hosted session's to keep as jobs
        (server.py), as a local client's calls are when it dies."""
        self._handle, self._reader, self._writer = handle, reader, writer
        self._drop = drop
        self._tasks: dict[int, asyncio.Task[None]] = {}

    async def serve(self) -> None:
        """Until the peer leaves or sends what is not a request."""
        try:
            while True:
                try:
                    req, request = loads(await read_frame(self._reader, MAX_REQUEST))
                    if not isinstance(req, int) or req <= 0:
                        raise TypeError("a request's id is a positive integer")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the peer left
                except FrameTooLarge as refused:
                    return await self._refuse(str(refused))
                except (pickle.UnpicklingError, EOFError, TypeError, ValueError) as exc:
                    return await self._refuse(f"not a remote call ({str(exc)[:200]})")
                if request is None:
                    task = self._tasks.get(req)
                    if task is not None:
                        task.cancel()
                    continue
                task = asyncio.ensure_future(self._answer(req, request))
                self._tasks[req] = task
                task.add_done_callback(functools.partial(_forget, self._tasks, req))
        finally:
            if self._drop is not None:
                with contextlib.suppress(Exception):
                    await self._drop(self)
            for task in list(self._tasks.values()):
                task.cancel()
            self._writer.close()

    async def _refuse(self, why: str) -> None:
        self._writer.write(frame(dumps((0, "answer", ("err", error_answer(HostError(why)))))))
        with contextlib.suppress(ConnectionError):
            await self._writer.drain()

    def _emit(self, req: int, event: Any) -> None:
        if not self._writer.is_closing():
            self._writer.write(frame(dumps((req, "event", event))))

    async def _answer(self, req: int, request: Any) -> None:
        answer: Answer = await self._handle(request, functools.partial(self._emit, req), self)
        if not self._writer.is_closing():
            self._writer.write(frame(dumps((req, "answer", answer))))
            with contextlib.suppress(ConnectionError):
                await self._writer.drain()  # a large answer waits for the client to read it


def _forget(tasks: dict[int, asyncio.Task[None]], req: int, _done: object) -> None:
    tasks.pop(req, None)
