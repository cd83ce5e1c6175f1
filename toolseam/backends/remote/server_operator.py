"""What a server's operator sees of its sessions and may do to one (``toolseam ps --ray``, a
Ray node's ``operator_sessions`` and ``operator_kill``): each open session as a ``toolseam
ps`` row — never its secret — and the end of one's sandbox from outside. Whoever calls these
has proved they operate the server (a Ray node asks for the cluster key's proof); a session's
own client cannot reach them through a request.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from ...seam.capabilities import ResourceUsage, SandboxKill, SandboxUsage
from ...seam.errors import HostError
from .hosted import HostedSession

USAGE_WAIT_S = 2.0  # a busy sandbox is listed without figures, as on the client's machine


class OperatedSessions:
    """Mixed into ``RemoteServer`` (``server.py``), whose sessions it reads."""

    _sessions: dict[str, HostedSession]

    async def rows(self) -> list[dict[str, Any]]:
        """Every open session as a ``toolseam ps`` row (its id, kind, image, start, calls,
        whether it is durable, and its usage where the hosted backend measures it)."""
        return list(await asyncio.gather(*(_row(sid, session)
                                           for sid, session in list(self._sessions.items()))))

    async def kill_from_outside(self, sid: str) -> bool:
        """End session ``sid``'s sandbox with everything in it (its client's next call is
        ``sandbox_lost``; its close still ends the session here); False: no such session."""
        session = self._sessions.get(sid)
        if session is None:
            return False
        if "SandboxKill" not in session.capabilities:
            raise HostError(f"the {session.backend.name} backend's sandboxes cannot be ended "
                            "from outside")
        session.killed = True
        await asyncio.to_thread(cast(SandboxKill, session.backend).kill_sandbox)
        return True

    async def _kill_own(self, sid: str, session: HostedSession) -> bool:
        """A client's own ``kill_sandbox`` (its secret proved): as an operator's, whose check
        of the capability it shares."""
        return await self.kill_from_outside(sid)


async def _row(sid: str, session: HostedSession) -> dict[str, Any]:
    backend: Any = session.backend
    used = SandboxUsage()
    if "ResourceUsage" in session.capabilities and not session.killed:
        try:
            used = await asyncio.wait_for(cast(ResourceUsage, backend).resource_usage(),
                                          USAGE_WAIT_S)
        except Exception:  # noqa: BLE001 - listed without figures, as a busy one is
            used = SandboxUsage()
    return {"id": sid, "backend": backend.name, "image": session.image,
            "started": session.started, "owner_pid": None, "durable": session.kept is not None,
            "calls": session.served, "cpu_seconds": used.cpu_seconds,
            "memory_bytes": used.memory_bytes, "pids": used.pids}
