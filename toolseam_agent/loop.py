"""A minimal single-threaded event loop: fd readiness plus timers.

Hand-written instead of asyncio because the agent's hot path (spawn, child exit, pipe EOF,
answer) must cost well under a millisecond and must keep working while it is pid 1 of a
namespace reaping every orphan; epoll and a heap do exactly that with nothing hidden. epoll
directly, not ``selectors``: its per-registration bookkeeping cost ~20 µs per command here.
"""

from __future__ import annotations

import heapq
import itertools
import select
import time
from collections.abc import Callable


class Timer:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Loop:
    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._readers: dict[int, Callable[[], None]] = {}
        self._timers: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()
        self._soon: list[Callable[[], None]] = []
        self.running = True

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` at the end of this loop pass, after every ready descriptor's."""
        self._soon.append(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(time.monotonic() + delay, callback)
        heapq.heappush(self._timers, (timer.when, next(self._order), timer))
        return timer

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
        self._epoll.register(fd, select.EPOLLIN)
        self._readers[fd] = callback

    def remove_reader(self, fd: int) -> None:
        self._epoll.unregister(fd)
        del self._readers[fd]

    def run(self) -> None:
        while self.running:
            timeout = -1.0
            while self._timers and self._timers[0][2].cancelled:  # finished jobs' deadlines
                heapq.heappop(self._timers)
            if self._soon:
                timeout = 0.0
            elif self._timers:
                timeout = max(0.0, self._timers[0][0] - time.monotonic())
            for fd, _ in self._epoll.poll(timeout):
                callback = self._readers.get(fd)  # an earlier callback may have removed it
                if callback is not None:
                    callback()
            while self._soon:
                soon, self._soon = self._soon, []
                for callback in soon:
                    callback()
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                _, _, timer = heapq.heappop(self._timers)
                if not timer.cancelled:
                    timer.callback()
