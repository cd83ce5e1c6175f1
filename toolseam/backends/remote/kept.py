"""The durable sessions a ``RemoteServer`` keeps while no client holds them (``durable.py``,
decision 476): each the hosted session's own handle (made by this server at open, never taken
from a client), the one-way key of its wire secret, what the hosting does once it ended
(``after``: a Ray node's session directory), and a timer.

A kept session is detached on the hosted side, so the hosted session's own orphan timeout
ends it; the record goes ``GRACE_S`` later (``after`` run then), so an attach never finds a
record of a session that ended — only, at worst, the hosted backend's own "ended".
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ...seam.handle import AttachError, SessionHandle

GRACE_S = 5.0


@dataclass
class KeptSession:
    key: bytes  # derived_key(wire secret, SESSION_LABEL), as an open session's
    handle: SessionHandle  # the hosted session's, with its (derived) secret
    orphan_timeout_s: float
    after: Callable[[], None] | None = None
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class KeptSessions:
    """Records by session id. ``forget`` is called (on the server's loop) with a record whose
    time ran out."""

    def __init__(self, forget: Callable[[KeptSession], Awaitable[None]]) -> None:
        self._kept: dict[str, KeptSession] = {}
        self._forget = forget
        self._ending: set[asyncio.Task[None]] = set()

    def __contains__(self, sid: str) -> bool:
        return sid in self._kept

    def keep(self, sid: str, kept: KeptSession) -> None:
        loop = asyncio.get_running_loop()
        kept.timer = loop.call_later(kept.orphan_timeout_s + GRACE_S, self._expire, sid)
        self._kept[sid] = kept

    def take(self, sid: str, key: bytes, where: str) -> KeptSession:
        """The record of ``sid`` for an attach proving ``key``, out of the table (an attach
        that fails puts it back: ``keep``)."""
        kept = self._kept.get(sid)
        if kept is None:
            raise AttachError("ended", f"no session {sid[:8]}… is kept by {where}: it ended "
                              "(closed, or orphaned past its orphan timeout), or it was never "
                              "there")
        if not hmac.compare_digest(kept.key, key):
            raise AttachError("wrong_secret", f"session {sid[:8]}… on {where} does not answer "
                              "this handle's secret")
        self._kept.pop(sid)
        if kept.timer is not None:
            kept.timer.cancel()
        return kept

    def _expire(self, sid: str) -> None:
        kept = self._kept.pop(sid, None)
        if kept is not None:
            task = asyncio.ensure_future(self._forget(kept))
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)

    def take_all(self) -> list[KeptSession]:
        """Every record, out of the table (the server is closing)."""
        found = list(self._kept.values())
        self._kept.clear()
        for kept in found:
            if kept.timer is not None:
                kept.timer.cancel()
        return found

    async def settled(self) -> None:
        """Wait for the records being forgotten (their ``after``)."""
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._ending)
