"""How the two ends of a connection to the process hosting a sandbox prove a shared key to each
other without sending it — the remote server's unix socket and, across a Ray cluster, the node
actor's direct port and the egress relay (``toolseam/ray/``).

The durable attach's scheme (``toolseam_agent/attach_auth.py``), both ways: each end sends a
fresh nonce, and each proves it knows the key by an HMAC over both nonces and its own role —
so a peer that merely listens where the other end should (a path or port freed by a crashed
server and taken by another local user) answers nothing that holds and learns nothing it could
replay, and no proof made for one role passes for the other. The end that is asked to prove
first is the one that receives the connection's valuables first: the server (it will be sent
the session's calls), on Ray's egress relay the caller (it will be sent the sandbox's requests).

A key is never a secret itself: it is ``derived_key(secret, label)`` (what a server keeps in
place of the secret) or a fresh random key.
"""

from __future__ import annotations

import hmac
import secrets
from typing import TypeGuard

from toolseam_agent.attach_auth import new_nonce, proof_holds

NONCE_HEX = 64  # new_nonce(): 32 random bytes as hex
PROOF_HEX = 64


def derived_key(secret: str, label: bytes) -> bytes:
    """What a server keeps in place of ``secret`` (and proves with): one-way, per ``label``."""
    return hmac.digest(secret.encode(), label, "sha256")


def proof(key: bytes, role: str, context: str, first: str, second: str) -> str:
    """``role``'s proof that it holds ``key`` for this connection's two nonces."""
    return hmac.digest(key, f"{role}|{context}|{first}|{second}".encode(), "sha256").hex()


def holds(key: bytes, role: str, context: str, first: str, second: str, given: object) -> bool:
    return proof_holds(proof(key, role, context, first, second), given)


def nonce() -> str:
    return new_nonce()


def is_nonce(value: object) -> TypeGuard[str]:
    return (isinstance(value, str) and len(value) == NONCE_HEX
            and all(c in "0123456789abcdef" for c in value))


def decoy_proof() -> str:
    """What a server answers for a key it does not hold: as long as a proof, and random."""
    return secrets.token_hex(PROOF_HEX // 2)
