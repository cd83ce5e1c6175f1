"""Live output through the cluster: a call's events reach the caller while it runs.

A streamed call is a long poll of the node actor: the first request begins the call on the
node (a remote session's ``start`` or egress stream through its ``RemoteServer``,
``node_remote.py``) and answers its first batch of events; each next
request answers the next — every event that queued since, as soon as one does — until the
last, which carries the call's answer. A batch waits up to ``LINGER_S`` after its first event
for the call's end, so a short command is ONE round trip, as a call without a stream is: its
cost per call does not grow. The polls go on whatever route the session's calls take (Ray
calls, or the node's direct port). Ray's streaming generators (an async generator method,
``num_returns="streaming"``) cost ≈ 1.5 ms more per call here and were not kept (decision
301, docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..seam.errors import HostError
from ..seam.models import OutputChunk, SpawnRequest
from ..seam.protocol import BuiltinExec
from .direct import Answer, refused

_END = None  # the queue's last item: the call has returned
LINGER_S = 0.02  # after output, how long a batch waits for the call's end to ride along
# Output a caller has not fetched yet, per streamed call: a command that floods while its
# caller is slow or gone must not grow the node actor (every session of the node lives in it)
# without bound. Past it, live output chunks are dropped (the result's own capture stays
# whole); other events (an egress stream's) are never dropped.
UNREAD_CHARS = 16 << 20  # characters (≤ 64 MiB)
Run = Callable[[Callable[[Any], None]], Awaitable[Answer]]  # the call, given where events go


@dataclass
class _Live:
    queue: asyncio.Queue[Any]
    started: asyncio.Future[Answer] = field(init=False)  # the call, fed by ``put``
    unread: int = 0  # output characters queued and not fetched

    def put(self, event: Any) -> None:
        size = len(event.text) if isinstance(event, OutputChunk) else 0
        if size and self.unread + size > UNREAD_CHARS:
            return
        self.unread += size
        self.queue.put_nowait(event)


class LiveStarts:
    """The node's streamed calls in progress, by session and a name the caller gave (a job's,
    or a remote stream's id): ``begin_call`` starts one, ``next`` answers its next batch
    ``(events, None)`` or its last ``(events, answer)``."""

    def __init__(self, error: Callable[[Exception], Answer] = refused) -> None:
        """``error``: a failure as its route's error answer (the one map's by default)."""
        self._live: dict[tuple[str, str], _Live] = {}
        self._error = error

    def begin_call(self, sid: str, name: str, run: Run) -> None:
        if (sid, name) in self._live:
            raise HostError(f"job {name!r} is being started already")
        live = _Live(asyncio.Queue())
        live.started = asyncio.ensure_future(run(live.put))
        live.started.add_done_callback(lambda _: live.queue.put_nowait(_END))
        self._live[(sid, name)] = live

    def begin(self, sid: str, backend: BuiltinExec, request: SpawnRequest) -> None:
        """A ``start`` of ``backend`` with its output live (its failure the one map's answer)."""
        async def run(put: Callable[[Any], None]) -> Answer:
            try:
                return ("ok", await backend.start(request, put))
            except Exception as exc:  # noqa: BLE001 - a failure is an answer, not a Ray error
                return refused(exc)
        self.begin_call(sid, request.job, run)

    async def next(self, sid: str, name: str) -> tuple[list[Any], Answer | None]:
        live = self._live.get((sid, name))
        if live is None:
            raise HostError(f"no streamed start of job {name!r} in this session")
        batch = [await live.queue.get()]
        if isinstance(batch[-1], OutputChunk):  # a short command's end rides with its output
            await asyncio.wait([live.started], timeout=LINGER_S)
        while not live.queue.empty():
            batch.append(live.queue.get_nowait())
        events = [event for event in batch if event is not _END]
        live.unread -= sum(len(e.text) for e in events if isinstance(e, OutputChunk))
        if batch[-1] is not _END:
            return events, None
        del self._live[(sid, name)]
        if live.started.cancelled():
            return events, self._error(HostError("the streamed call was cancelled on the node"))
        return events, live.started.result()

    def cancel(self, sid: str, name: str | None = None) -> None:
        """End a caller's streamed call (it was cancelled), or all of a session's (closed)."""
        for key in [k for k in self._live if k[0] == sid and name in (None, k[1])]:
            self._live.pop(key).started.cancel()


Batch = tuple[list[Any], Answer | None]


async def follow(first: Callable[[], Awaitable[Batch]], following: Callable[[], Awaitable[Batch]],
                 cancel: Callable[[], Awaitable[Any]], on_event: Callable[[Any], None]
                 ) -> Answer:
    """The caller's side of the long poll: the events to ``on_event`` batch by batch, then the
    call's answer. Cancelled, the call in flight is cancelled by its route and the call on the
    node by ``cancel`` (a failure of which is ignored: the session may be over) — as it is
    when ``on_event`` raises, or the route fails: nothing is left running for nobody."""
    final: Answer | None = None
    try:
        events, final = await first()
        while True:
            for event in events:
                on_event(event)
            if final is not None:
                return final
            events, final = await following()
    except BaseException:
        if final is None:  # ended here, not there
            _cancels.add(task := asyncio.ensure_future(_quietly(cancel)))
            task.add_done_callback(_cancels.discard)
        raise


_cancels: set[asyncio.Future[None]] = set()  # in flight; held so none is collected early


async def _quietly(cancel: Callable[[], Awaitable[Any]]) -> None:
    with contextlib.suppress(Exception):  # the session may be over: nothing left to end
        await cancel()
