"""A node actor's answers to an operator (``toolseam ps --ray ADDRESS``; issue 49): the
sessions it hosts, as ``toolseam ps`` rows, and the end of one's sandbox.

A driver of another job can find a node actor under its name (Ray lists named actors), so
these answers are for holders of the cluster key alone (``identity.py``), the same who may use
the actor: each request carries an HMAC, under the node key, of a nonce this actor handed out
and has not seen answered — a request seen on the wire cannot be played again. No secret of a
session is ever shown; a session's own holder kills with its secret (``node.kill_sandbox``),
the operator with this proof.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
from collections import OrderedDict
from typing import Any, cast

from ..backends.remote.server import RemoteServer
from ..seam.capabilities import ResourceUsage, SandboxKill, SandboxUsage, supports
from ..seam.errors import HostError
from ._wire import Answer, encode
from .identity import operator_proof
from .node_session import NodeSession

_NONCES = 256  # handed out and not yet used; the oldest go first
_USAGE_WAIT_S = 2.0  # a busy sandbox is listed without figures, as on the driver's machine


class NodeOperatorView:
    """Mixed into the node actor (``node.py``), whose sessions, node key and name it reads."""

    _sessions: dict[str, NodeSession]
    _remote_server: RemoteServer | None  # the remote sessions' (node_remote.py)
    _node_key: bytes | None
    node_id: str
    where: str

    def _operator_init(self) -> None:
        self._nonces: OrderedDict[str, None] = OrderedDict()

    async def operator_nonce(self) -> str:
        """A nonce for one operator request (used once)."""
        nonce = secrets.token_hex(16)
        self._nonces[nonce] = None
        while len(self._nonces) > _NONCES:
            self._nonces.popitem(last=False)
        return nonce

    def _proven(self, what: str, nonce: object, proof: object) -> bool:
        if self._node_key is None or not isinstance(nonce, str) or not isinstance(proof, str):
            return False
        if nonce not in self._nonces:  # never handed out, or used already
            return False
        del self._nonces[nonce]
        return hmac.compare_digest(proof, operator_proof(self._node_key, nonce, what))

    async def operator_sessions(self, nonce: str, proof: str) -> Answer:
        """Every session this node hosts, as a ``toolseam ps`` row."""
        if not self._proven("list", nonce, proof):
            return encode(HostError(f"{self.where}: not a holder of the cluster key"))
        rows = await asyncio.gather(*(self._row(sid, session)
                                      for sid, session in list(self._sessions.items())))
        hosted = [] if self._remote_server is None else await self._remote_server.rows()
        return ("ok", [*rows, *({**row, "backend": "ray", "node": self.node_id}
                                for row in hosted)])

    async def operator_kill(self, sid: str, nonce: str, proof: str) -> Answer:
        """End session ``sid``'s sandbox with everything in it; False: no such session here."""
        if not self._proven(f"kill {sid}", nonce, proof):
            return encode(HostError(f"{self.where}: not a holder of the cluster key"))
        session = self._sessions.get(sid)
        if session is None and self._remote_server is not None:  # a remote session's
            try:
                return ("ok", await self._remote_server.kill_from_outside(sid))
            except HostError as exc:
                return encode(HostError(f"{self.where}: {exc}"))
        if session is None:
            return ("ok", False)
        backend = session.toolkit.backend if session.toolkit is not None else session.backend
        if not supports(backend, SandboxKill):
            return encode(HostError(f"{self.where}: its sandboxes cannot be ended from outside"))
        session.killed = True
        await asyncio.to_thread(cast(SandboxKill, backend).kill_sandbox)
        return ("ok", True)

    async def _row(self, sid: str, session: NodeSession) -> dict[str, Any]:
        backend: Any = session.backend
        used = SandboxUsage()
        if supports(backend, ResourceUsage) and not session.killed:
            try:
                used = await asyncio.wait_for(
                    cast(ResourceUsage, backend).resource_usage(), _USAGE_WAIT_S)
            except Exception:  # noqa: BLE001 - listed without figures, as a busy one is
                used = SandboxUsage()
        options = getattr(backend, "options", None)
        return {"id": sid, "backend": "ray", "image": getattr(options, "image", None),
                "node": self.node_id, "started": session.started, "owner_pid": None,
                "durable": session.orphan_timeout > 0, "calls": session.served,
                "cpu_seconds": used.cpu_seconds, "memory_bytes": used.memory_bytes,
                "pids": used.pids}
