"""Answers of requests kept under a token for a later collect (decisions 501, 503-504): a
caller that stopped waiting for a request's answer — or a process it handed the request's
token to — reads it here, proving the session's key. Any transport's server may keep them;
Ray's node actor does for its direct port's tokened requests (``ray/node_remote.py``).

Bounded: an ended request's answer is kept ``KEPT_S``, the newest ``KEPT_MAX`` ended ones and
``KEPT_BYTES`` of output at most (never one still running; the bytes counted as requests end).
A collect may come before its request (the caller stopped waiting while the request was still
on its way: a loaded server reads it late): it waits ``ARRIVAL_S`` for it, ``AWAITED_MAX``
such collects at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections import OrderedDict
from typing import Any

KEPT_S, KEPT_MAX, KEPT_BYTES = 60.0, 1024, 64 << 20
ARRIVAL_S, AWAITED_MAX = 30.0, 4096

Call = asyncio.Future[Any]


class KeptAnswers:
    def __init__(self) -> None:
        self.kept: dict[str, tuple[bytes, Call]] = {}  # token -> (session key, request)
        self.sizes: dict[str, int] = {}  # token -> its ended request's output, in bytes
        self.kept_bytes = 0  # the sum of ``sizes``: summed per request, it cost ≈ 50 µs
        self.awaited: dict[str, asyncio.Future[None]] = {}  # token -> its request's arrival
        # ended requests' tokens, the first ended first: the caps let the oldest go without a
        # scan of every kept request at each end (that scan cost 6 % of a busy node's time)
        self.ended: OrderedDict[str, None] = OrderedDict()

    def keep(self, token: str, key: bytes, call: Call) -> None:
        """Keep ``call``'s answer under ``token`` for the holder of ``key``."""
        self.kept[token] = (key, call)
        arrived = self.awaited.pop(token, None)
        if arrived is not None and not arrived.done():
            arrived.set_result(None)
        call.add_done_callback(lambda done: self._ended(token, done))

    def _ended(self, token: str, done: Call) -> None:
        value = done.result()[1] if not done.cancelled() and done.exception() is None else None
        if token not in self.kept:
            return  # let go before it ended (never, but then nothing is counted)
        size = sum(int(getattr(value, name, 0) or 0)
                   for name in ("size", "stdout_bytes", "stderr_bytes"))
        self.kept_bytes += size - self.sizes.get(token, 0)  # a token sent again: counted once
        self.sizes[token] = size
        self.ended[token] = None
        self.ended.move_to_end(token)
        asyncio.get_running_loop().call_later(KEPT_S, self.unkeep, token)
        while self.ended and (len(self.kept) > KEPT_MAX or self.kept_bytes > KEPT_BYTES):
            self.unkeep(next(iter(self.ended)))  # never one running: only ended ones are here

    def unkeep(self, token: str) -> None:
        self.kept.pop(token, None)
        self.ended.pop(token, None)
        self.kept_bytes -= self.sizes.pop(token, 0)

    async def collect(self, token: str, key: bytes) -> Any:
        """The answer kept under ``token``, waited for; None when it is not kept for ``key``
        (its request did not come within ``ARRIVAL_S``, it was let go, or it is another's)."""
        held = await self._arrived(token)
        if held is None or not hmac.compare_digest(held[0], key):
            return None
        return await asyncio.shield(held[1])

    async def _arrived(self, token: str) -> tuple[bytes, Call] | None:
        held = self.kept.get(token)
        if held is not None or len(self.awaited) >= AWAITED_MAX:
            return held
        arrival = self.awaited.get(token)
        if arrival is None:
            arrival = self.awaited[token] = asyncio.get_running_loop().create_future()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(arrival), ARRIVAL_S)
        finally:
            if self.awaited.get(token) is arrival and not arrival.done():
                del self.awaited[token]  # the last to wait for it gave up
        return self.kept.get(token)
