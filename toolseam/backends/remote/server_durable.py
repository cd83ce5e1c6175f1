"""The durable half of ``RemoteServer`` (``server.py``, decision 476): a durable session is
detached, not ended, when its client's connection ends, kept by its id (``kept.py``), and
attached again by an ``open`` that proves the same wire secret (``durable.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from typing import Any

from ...seam.capabilities import durable_sessions
from ...seam.errors import ConfigurationError, HostError
from ...seam.handle import AttachError
from ...seam.models import SandboxInfo
from ...seam.protocol import BuiltinExec
from . import ops
from .handshake import derived_key
from .hosted import SESSION_LABEL, Adopting, HostedSession, durable_answer
from .kept import KeptSession, KeptSessions


class DurableHosting:
    """Mixed into ``RemoteServer``."""

    where: str
    _adopting: Adopting
    _kept: KeptSessions
    _sessions: dict[str, HostedSession]
    _opening: set[str]
    _leaving: dict[str, asyncio.Event]  # sessions being detached: an attach waits for them

    def _drop_arrivals(self, sid: str) -> None:
        raise NotImplementedError

    def _placed(self, info: SandboxInfo) -> SandboxInfo:
        raise NotImplementedError

    async def _attach(self, sid: str, secret: str, owner: object) -> tuple[Any, ...]:
        """The kept session ``sid``, attached again for ``owner``; nothing is stopped when
        the attach fails (its record stays, unless the hosted session has ended)."""
        key = derived_key(secret, SESSION_LABEL)
        leaving = self._leaving.get(sid)
        if leaving is not None:  # its client just left: kept in a moment
            await leaving.wait()
        live = self._sessions.get(sid)
        if live is not None and not hmac.compare_digest(live.key, key):
            raise AttachError("wrong_secret", f"session {sid[:8]}… on {self.where} does not "
                              "answer this handle's secret")
        if live is not None or sid in self._opening:
            raise AttachError("in_use", f"session {sid[:8]}… on {self.where} is held by "
                              "another client (one that ended is let go when its connection "
                              "ends; through Ray, when its transport's lease runs out)")
        kept = self._kept.take(sid, key, self.where)
        self._opening.add(sid)
        backend: BuiltinExec | None = None
        try:
            backend = self._adopting(kept.handle)
            capabilities = ops.declared_capabilities(backend)
            info = await backend.open()
            answer = durable_answer(backend, kept.handle)
        except BaseException as exc:
            if backend is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(durable_sessions(backend).detach())
            if isinstance(exc, AttachError) and exc.reason in ("ended", "gone"):
                await self._forget(kept)
            else:
                self._kept.keep(sid, kept)
            raise
        finally:
            self._opening.discard(sid)
        self._sessions[sid] = HostedSession(key, backend, owner, capabilities,
                                            after=kept.after, kept=kept.handle,
                                            orphan_timeout_s=kept.orphan_timeout_s,
                                            image=info.image)
        return self._placed(info), sorted(capabilities), answer

    async def _lifetime_op(self, sid: str, session: HostedSession, name: str,
                           kwargs: dict[str, Any]) -> None:
        if session.kept is None:
            raise ConfigurationError(f"{name}: session {sid[:8]}… was not opened durable")
        durable = durable_sessions(session.backend)
        if name == "detach":
            await self._detach(sid, session)
        elif name == "keep_backend_state":
            await durable.keep_backend_state()
        else:
            part, text = kwargs.get("part"), kwargs.get("text")
            if not isinstance(part, str) or not (text is None or isinstance(text, str)):
                raise HostError("keep_state: a part is named by a string, its text a string")
            await durable.keep_state(part, kwargs.get("state"), text)

    async def _detach(self, sid: str, session: HostedSession) -> None:
        """Let the hosted session go on without a client, kept for an attach. A call still in
        flight is not cancelled: the hosted session keeps it as a job, as it would for a local
        client that died."""
        assert session.kept is not None
        self._sessions.pop(sid, None)
        self._drop_arrivals(sid)
        self._leaving[sid] = left = asyncio.Event()
        try:
            await session.leave()
        finally:
            self._kept.keep(sid, KeptSession(session.key, session.kept,
                                             session.orphan_timeout_s, session.after))
            self._leaving.pop(sid, None)
            left.set()

    async def _forget(self, kept: KeptSession) -> None:
        """A kept session past its orphan timeout: the hosting's own end of it."""
        if kept.after is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(kept.after)

    async def _end_kept(self, kept: KeptSession) -> None:
        """The server is closing: end a kept session (attached, then closed) rather than
        leave it running with nobody able to attach."""
        with contextlib.suppress(Exception):
            backend = self._adopting(kept.handle)
            try:
                await backend.open()
            finally:
                await backend.close()
        await self._forget(kept)
