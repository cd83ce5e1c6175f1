"""Attaching to a durable agent without sending the secret, and frames bound to the attach.

The handle's secret never crosses the connection. Both ends derive from it (the agent is given
only the derived key, never the secret):

* ``K = HMAC-SHA256(secret, "toolseam attach key v2")`` — what the agent holds;
* the client sends a fresh nonce ``nc``; the agent answers its own nonce ``na`` and
  ``HMAC(K, "agent" | nc | na)``, so a process that merely listens where the agent should
  (a swapped socket) cannot answer, and learns nothing it can replay (it saw one nonce);
* both take ``Ks = HMAC(K, "session" | nc | na)``, and from then on every line each way is
  ``payload TAB tag``, ``tag = HMAC(Ks, direction | sequence | payload)[:16]``. The client's
  first sealed line is the attach itself: the agent accepts it only if the tag holds, which
  proves the client knows ``K``. A relay in the middle (a command that swapped the socket and
  passes the bytes on) can read what passes — nothing a command inside could not read anyway
  — but cannot change, drop, reorder or replay a line unnoticed: the sequence numbers are in
  the tags and ``Ks`` is new for every attach.

Standard library only: the agent imports it inside every sandbox.
"""

from __future__ import annotations

import ctypes
import hmac
import os
import secrets

KEY_VAR = "TOOLSEAM_SESSION_KEY"  # hex K, in the agent's environment only (scrubbed at start)
NONCE_BYTES = 32
_TAG_HEX = 32  # 16 bytes of tag: forging one is 2^-128 per try
_SEQ = 8


class SealError(ValueError):
    """A line whose tag does not hold: changed, replayed, reordered or not sealed at all."""


def agent_key(secret: str) -> bytes:
    """``K``: what the agent is given in place of the secret."""
    return hmac.digest(secret.encode(), b"toolseam attach key v2", "sha256")


def new_nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def agent_proof(key: bytes, client_nonce: str, agent_nonce: str) -> str:
    return hmac.digest(key, f"agent|{client_nonce}|{agent_nonce}".encode(), "sha256").hex()


def session_key(key: bytes, client_nonce: str, agent_nonce: str) -> bytes:
    return hmac.digest(key, f"session|{client_nonce}|{agent_nonce}".encode(), "sha256")


def proof_holds(expected: str, given: object) -> bool:
    return isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode())


class Sealer:
    """One direction's tags: ``seal`` on the sending side, ``open`` on the receiving side (each
    end makes one of each, with the two directions' letters swapped)."""

    def __init__(self, key: bytes, direction: bytes) -> None:
        self._key = key
        self._direction = direction
        self._seq = 0

    def _tag(self, payload: bytes) -> bytes:
        message = self._direction + self._seq.to_bytes(_SEQ, "big") + payload
        self._seq += 1
        return hmac.digest(self._key, message, "sha256")[:_TAG_HEX // 2].hex().encode()

    def seal(self, payload: bytes) -> bytes:
        """``payload`` (one line, no newline) with its tag."""
        return payload + b"\t" + self._tag(payload)

    def open(self, line: bytes) -> bytes:
        """The payload of a sealed line; ``SealError`` if its tag does not hold."""
        payload, tab, tag = line.rpartition(b"\t")
        if not tab or len(tag) != _TAG_HEX:
            raise SealError("a line without a tag")
        if not hmac.compare_digest(self._tag(payload), tag):
            raise SealError("a line whose tag does not hold")
        return payload


def scrub_environ(name: str) -> None:
    """Overwrite ``name``'s value where ``/proc/self/environ`` shows it (the process's original
    environment block), and drop it from ``os.environ``. ``os.environ`` and ``unsetenv`` leave
    that block as it was, and any process allowed to read it (the same user, where ptrace
    rules permit) would find the key there."""
    os.environ.pop(name, None)
    try:
        with open("/proc/self/stat", "rb") as stat:  # proc(5): env_start, env_end are fields 50, 51
            fields = stat.read().rsplit(b")", 1)[1].split()  # from field 3 on
        start, end = int(fields[47]), int(fields[48])
    except (OSError, ValueError, IndexError):
        return
    raw = b"\0" + ctypes.string_at(start, end - start)
    prefix = b"\0" + name.encode() + b"="
    at = raw.find(prefix)
    if at < 0:
        return
    value_start = at + len(prefix)
    value_end = raw.find(b"\0", value_start)
    value_end = len(raw) if value_end < 0 else value_end
    # offsets in raw are one past the block's (the leading NUL added above)
    ctypes.memset(start + value_start - 1, ord("0"), value_end - value_start)
