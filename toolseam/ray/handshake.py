"""How the two ends of a connection toolseam opens across a Ray cluster prove a shared secret
to each other without sending it, and the TLS both use when the cluster uses Ray's.

The durable attach's scheme (``toolseam_agent/attach_auth.py``), both ways: each end sends a
fresh nonce, and each proves it knows the key by an HMAC over both nonces and its own role —
so a peer that merely listens where the other end should (a port freed by a crashed driver and
bound by another local user) answers nothing that holds and learns nothing it could replay,
and no proof made for one role passes for the other. The end that is asked to prove first is
the one that receives the connection's valuables first: on the direct path the node (it will
be sent the session's calls), on the egress relay the caller (it will be sent the sandbox's
requests).

``key`` is never the secret itself: a session's key is ``HMAC(secret, label)`` (what the node
keeps in place of the secret), an egress token is a fresh random key.

TLS: when the cluster runs with ``RAY_USE_TLS`` its certificates (``RAY_TLS_SERVER_CERT``,
``RAY_TLS_SERVER_KEY``, ``RAY_TLS_CA_CERT``) wrap these connections too, both ends presenting
the certificate as Ray's own gRPC does; the chain is verified against Ray's CA, the name is not
(Ray's certificates name what its operator chose, and these connections go to addresses).
"""

from __future__ import annotations

import hmac
import os
import secrets
import ssl
from typing import TypeGuard

from toolseam_agent.attach_auth import new_nonce, proof_holds

SESSION_LABEL = b"toolseam ray session key v1"
NONCE_HEX = 64  # new_nonce(): 32 random bytes as hex
PROOF_HEX = 64


def session_key(secret: str) -> bytes:
    """What a node keeps for a session in place of its secret (and proves with)."""
    return hmac.digest(secret.encode(), SESSION_LABEL, "sha256")


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
    """What a node answers for a session it does not hold: as long as a proof, and random."""
    return secrets.token_hex(PROOF_HEX // 2)


# --- TLS --------------------------------------------------------------------------------------
def ray_tls() -> bool:
    return os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")


def _context(purpose: ssl.Purpose) -> ssl.SSLContext:
    env = os.environ
    context = ssl.create_default_context(purpose, cafile=env["RAY_TLS_CA_CERT"])
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED  # the other end presents a certificate of Ray's CA
    context.load_cert_chain(env["RAY_TLS_SERVER_CERT"], env["RAY_TLS_SERVER_KEY"])
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def server_tls() -> ssl.SSLContext | None:
    """The listening end's TLS when the cluster uses Ray's (else None: the HMAC proofs alone)."""
    return _context(ssl.Purpose.CLIENT_AUTH) if ray_tls() else None


def client_tls() -> ssl.SSLContext | None:
    return _context(ssl.Purpose.SERVER_AUTH) if ray_tls() else None
