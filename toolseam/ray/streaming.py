"""Live output through the cluster: a job's chunks reach the caller while it runs.

A streamed ``start`` (``request.stream`` and an ``on_output``) is a long poll of the node
actor by the session's ordinary calls (``NodeSessions.call``, so whatever route a session's
calls take, this takes too): ``start_live`` starts the job on the node's local backend and
answers its first batch of output; each ``live_next`` answers the next — every chunk that
queued since, as soon as one does — until the last, which carries the start's answer. A
batch waits up to ``LINGER_S`` after its first chunk for the command's end, so a short command
is ONE call, as a start without a stream is: its cost per call does not grow. Ray's
streaming generators (an async generator method, ``num_returns="streaming"``) cost ≈ 1.5 ms
more per call here and were not kept (decision 301, docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..seam.errors import HostError
from ..seam.models import JobStatus, OutputChunk, SpawnRequest
from ..seam.protocol import BuiltinExec
from ._wire import Answer, decode, encode

LIVE_CALLS = frozenset({"start_live", "live_next", "live_cancel"})  # beside the seam's calls
_END = None  # the queue's last item: the start has returned
LINGER_S = 0.02  # after a chunk, how long a batch waits for the command's end to ride along
# Output a caller has not fetched yet, per streamed start: a command that floods while its
# caller is slow or gone must not grow the node actor (every session of the node lives in it)
# without bound. Past it, live chunks are dropped; the result's own capture stays whole.
UNREAD_CHARS = 16 << 20  # characters (≤ 64 MiB)


@dataclass
class _Live:
    queue: asyncio.Queue[OutputChunk | None]
    started: asyncio.Future[JobStatus] = field(init=False)  # the start, fed by ``put``
    unread: int = 0  # characters queued and not fetched

    def put(self, chunk: OutputChunk) -> None:
        if self.unread + len(chunk.text) > UNREAD_CHARS:
            return
        self.unread += len(chunk.text)
        self.queue.put_nowait(chunk)


class LiveStarts:
    """The node's streamed starts in progress, by session and job: ``begin`` starts one,
    ``next`` answers its next batch ``(chunks, None)`` or its last ``(chunks, answer)``."""

    def __init__(self) -> None:
        self._live: dict[tuple[str, str], _Live] = {}

    def begin(self, sid: str, backend: BuiltinExec, request: SpawnRequest) -> None:
        if (sid, request.job) in self._live:
            raise HostError(f"job {request.job!r} is being started already")
        live = _Live(asyncio.Queue())
        live.started = asyncio.ensure_future(backend.start(request, live.put))
        live.started.add_done_callback(lambda _: live.queue.put_nowait(_END))
        self._live[(sid, request.job)] = live

    async def next(self, sid: str, job: str) -> tuple[list[OutputChunk], Answer | None]:
        live = self._live.get((sid, job))
        if live is None:
            raise HostError(f"no streamed start of job {job!r} in this session")
        batch = [await live.queue.get()]
        if batch[-1] is not _END:  # a short command's end rides with its output
            await asyncio.wait([live.started], timeout=LINGER_S)
        while not live.queue.empty():
            batch.append(live.queue.get_nowait())
        chunks = [chunk for chunk in batch if chunk is not None]
        live.unread -= sum(len(chunk.text) for chunk in chunks)
        if batch[-1] is not _END:
            return chunks, None
        del self._live[(sid, job)]
        try:
            return chunks, ("ok", live.started.result())
        except Exception as exc:  # noqa: BLE001 - a failure is an answer, not a Ray error
            return chunks, encode(exc)

    async def call(self, sid: str, backend: BuiltinExec, method: str, args: tuple[Any, ...]
                   ) -> Any:
        """One of ``LIVE_CALLS`` for session ``sid`` (its secret checked by the caller)."""
        if method == "start_live":
            request = args[0]
            if not isinstance(request, SpawnRequest):
                raise HostError("start_live takes a SpawnRequest")
            self.begin(sid, backend, request)
            return await self.next(sid, request.job)
        if method == "live_next":
            return await self.next(sid, str(args[0]))
        self.cancel(sid, str(args[0]))
        return None

    def cancel(self, sid: str, job: str | None = None) -> None:
        """End a caller's streamed start (it was cancelled), or all of a session's (closed)."""
        for key in [k for k in self._live if k[0] == sid and job in (None, k[1])]:
            self._live.pop(key).started.cancel()


async def caller_live(call: Callable[..., Awaitable[Any]], request: SpawnRequest,
                      on_output: Callable[[OutputChunk], None], where: str) -> Any:
    """The caller's side of the long poll: the chunks to ``on_output`` batch by batch, then
    the start's status (or its seam exception raised). ``call(method, *args)`` is the
    backend's own call (its route to the node; a lost node is the session's end)."""
    try:
        chunks, final = await call("start_live", request)
        while True:
            for chunk in chunks:
                on_output(chunk)
            if final is not None:
                return decode(final, where)
            chunks, final = await call("live_next", request.job)
    except asyncio.CancelledError:
        # the call in flight is cancelled on the node; the start itself is ended by this
        _cancels.add(task := asyncio.ensure_future(_cancel(call, request.job)))
        task.add_done_callback(_cancels.discard)
        raise


_cancels: set[asyncio.Future[None]] = set()  # in flight; held so none is collected early


async def _cancel(call: Callable[..., Awaitable[Any]], job: str) -> None:
    with contextlib.suppress(Exception):  # the session may be over: nothing left to end
        await call("live_cancel", job)
