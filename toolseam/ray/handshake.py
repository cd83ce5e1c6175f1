"""The keys and TLS of the connections toolseam opens across a Ray cluster. The proofs both
ends make (secret-first HMAC, both ways) are the remote backend's
(``toolseam/backends/remote/handshake.py``, a session's key ``derived_key(secret,
SESSION_LABEL)`` included); here is what is Ray's own: the TLS of Ray's certificates.

TLS: when the cluster runs with ``RAY_USE_TLS`` its certificates (``RAY_TLS_SERVER_CERT``,
``RAY_TLS_SERVER_KEY``, ``RAY_TLS_CA_CERT``) wrap these connections too, both ends presenting
the certificate as Ray's own gRPC does; the chain is verified against Ray's CA, the name is not
(Ray's certificates name what its operator chose, and these connections go to addresses).
"""

from __future__ import annotations

import os
import ssl


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
