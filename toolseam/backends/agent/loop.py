"""A minimal single-threaded event loop: fd readiness plus timers.

Hand-written instead of asyncio because the agent's hot path (spawn, child exit, pipe EOF,
answer) must cost well under a millisecond and must keep working while it is pid 1 of a
namespace reaping every orphan; a selector and a heap do exactly that with nothing hidden.
"""

from __future__ import annotations

import heapq
import itertools
import selectors
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
        self._selector = selectors.DefaultSelector()
        self._timers: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()
        self.running = True

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(time.monotonic() + delay, callback)
        heapq.heappush(self._timers, (timer.when, next(self._order), timer))
        return timer

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
        self._selector.register(fd, selectors.EVENT_READ, callback)

    def remove_reader(self, fd: int) -> None:
        self._selector.unregister(fd)

    def run(self) -> None:
        while self.running:
            timeout = None
            if self._timers:
                timeout = max(0.0, self._timers[0][0] - time.monotonic())
            for key, _ in self._selector.select(timeout):
                key.data()
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                _, _, timer = heapq.heappop(self._timers)
                if not timer.cancelled:
                    timer.callback()
