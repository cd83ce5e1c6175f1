"""A node actor's answers to an operator (``toolseam ps --ray ADDRESS``; issue 49): the
sessions it hosts, as ``toolseam ps`` rows, and the end of one's sandbox.

A driver of another job can find a node actor under its name (Ray lists named actors), so
these answers are for holders of the cluster key alone (``identity.py``), the same who may use
the actor: each request carries an HMAC, under the node key, of a nonce this actor handed out
and has not seen answered — a request seen on the wire cannot be played again. No secret of a
session is ever shown; a session's own holder kills with its secret (the remote client's
``kill_sandbox``),
the operator with this proof.
"""

from __future__ import annotations

import hmac
import secrets
from collections import OrderedDict

from ..backends.remote.server import RemoteServer
from ..seam.errors import HostError
from .direct import Answer, refused
from .identity import operator_proof

_NONCES = 256  # handed out and not yet used; the oldest go first


class NodeOperatorView:
    """Mixed into the node actor (``node.py``), whose server, node key and name it reads."""

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
            return refused(HostError(f"{self.where}: not a holder of the cluster key"))
        hosted = [] if self._remote_server is None else await self._remote_server.rows()
        return ("ok", [{**row, "backend": "ray", "node": self.node_id} for row in hosted])

    async def operator_kill(self, sid: str, nonce: str, proof: str) -> Answer:
        """End session ``sid``'s sandbox with everything in it; False: no such session here."""
        if not self._proven(f"kill {sid}", nonce, proof):
            return refused(HostError(f"{self.where}: not a holder of the cluster key"))
        if self._remote_server is None:
            return ("ok", False)
        try:
            return ("ok", await self._remote_server.kill_from_outside(sid))
        except HostError as exc:
            return refused(HostError(f"{self.where}: {exc}"))
