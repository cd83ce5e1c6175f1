"""A node actor is who it says it is: the name a driver looks up is one no other job can guess,
and an actor this process did not create itself is adopted only after it proved the node key
over its direct port — before any Ray answer of it is read (decision 336).

Why not over Ray: a Ray answer is unpickled by Ray itself, so an impostor's answer to the very
question "who are you" could run code in the driver. The direct port is read by toolseam's
own codec; the proof is ``HMAC(node key, "identity" | actor id | nonces)``, so an impostor can
neither answer it nor pass off a genuine actor's answer as its own (the actor id is in it).

Keys: the **cluster key** is ``TOOLSEAM_RAY_CLUSTER_KEY`` when set (the same on every driver
that shares node actors or hands sessions to another machine or user), else a random key kept
in a 0600 file of this user's (``staging.user_dir``), so one user's drivers on one machine share
their node actors. A node's key is ``HMAC(cluster key, node id)``; the actor's name carries
``HMAC(node key, "name")``, which names nothing secret; the actor holds the node key from the
creating driver's first call (an actor call's arguments are not kept by Ray's GCS, a
constructor's are). The KV entry saying where the actor listens can be written by anyone: a
wrong one makes the proof fail, never pass.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import socket
import struct
import time
from typing import Any

from ..backends.remote.handshake import holds, is_nonce, nonce, proof
from ..backends.staging import user_dir
from ..seam.errors import CouldNotRunError
from .handshake import client_tls

KEY_VAR = "TOOLSEAM_RAY_CLUSTER_KEY"
IDENTITY_HELLO = b"toolseam-ray-identity-1"
KV_NAMESPACE = "toolseam"
VERIFY_WAIT_S = 10.0  # an actor another driver is creating: how long it may take to listen
_LENGTH = struct.Struct(">I")


def cluster_key() -> bytes:
    """The cluster key (module docstring); the file is made once, this user's alone."""
    given = os.environ.get(KEY_VAR)
    if given:
        return hmac.digest(given.encode(), b"toolseam ray cluster key v1", "sha256")
    path = user_dir("ray-driver") / "cluster.key"
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as kept:
        seen = os.fstat(kept.fileno())
        if seen.st_uid != os.geteuid() or seen.st_mode & 0o077:
            raise CouldNotRunError(f"{path} is not this user's alone: not used as the Ray "
                                   "cluster key", retryable=False)
        return bytes.fromhex(kept.read().strip())


def node_key(key: bytes, node_id: str) -> bytes:
    return hmac.digest(key, f"node|{node_id}".encode(), "sha256")


def actor_name(prefix: str, key: bytes, node_id: str) -> str:
    """The node actor's name under ``key`` (a node key): guessable by no one without it."""
    return f"{prefix}{node_id}-{hmac.digest(key, b'name', 'sha256').hex()[:20]}"


def kv_key(actor_id: str) -> str:
    return f"direct:{actor_id}"


def identity_proof(key: bytes, actor_id: str, theirs: str, mine: str) -> str:
    return proof(key, "identity", actor_id, theirs, mine)


def operator_proof(key: bytes, nonce: str, what: str) -> str:
    """A cluster-key holder's proof for one operator request to a node actor (``what``: "list"
    or "kill SID") under the node's key, bound to a nonce the actor handed out
    (``node_operator.py``)."""
    return proof(key, "operator", what, nonce, "")


class ActorGone(CouldNotRunError):
    """The actor under the name refuses connections on the port it registered: its process is
    gone. A driver that did not see its node die meets this for as long as Ray still reports
    the node alive (its health check takes several seconds), and must not wait
    ``VERIFY_WAIT_S`` for a proof that cannot come, nor call the node's lost actor an
    impostor (``Placement.reach`` places elsewhere)."""


def wait_proven(ray: Any, actor: Any, key: bytes, name: str) -> None:
    """Return once ``actor`` proved ``key`` on its direct port; ``CouldNotRunError`` naming
    ``name`` when it does not within ``VERIFY_WAIT_S`` (or proves something else),
    ``ActorGone`` at once when nothing listens where it said it does."""
    from ray.experimental import internal_kv

    actor_id = actor._actor_id.hex()
    deadline = time.monotonic() + VERIFY_WAIT_S
    why = "it never said where it listens"
    while time.monotonic() < deadline:
        where = internal_kv._internal_kv_get(kv_key(actor_id), namespace=KV_NAMESPACE)
        if where:
            host, _, port = where.decode("ascii", "replace").rpartition(":")
            try:
                proved = _proves(host, int(port), key, actor_id)
                if proved:
                    return
                if proved is False:
                    why = "it did not prove toolseam's node key"
                    break
                why = "it was given no node key"
            except ConnectionRefusedError as exc:  # nothing listens where it said: gone
                raise ActorGone(
                    f"the Ray actor named {name} does not listen where it said it does "
                    f"({exc}): it is gone, most likely with its node, lost moments ago (Ray "
                    "reports a lost node alive for several seconds more); nothing was sent to "
                    "it", retryable=False) from None
            except (OSError, ValueError) as exc:
                why = f"its direct port did not answer ({exc})"
        time.sleep(0.2)
    raise CouldNotRunError(
        f"the Ray actor named {name} is not toolseam's node actor ({why}): another job of the "
        "cluster may have registered the name; nothing was sent to it. End it "
        f"(ray.kill(ray.get_actor({name!r}, namespace='toolseam'))) or set {KEY_VAR}",
        retryable=False)


def _proves(host: str, port: int, key: bytes, actor_id: str) -> bool | None:
    """One challenge on the actor's direct port (blocking; a few milliseconds); None: the
    actor holds no key yet (its creator's first call has not reached it)."""
    with socket.create_connection((host, port), timeout=5.0) as raw:
        tls = client_tls()
        conn = tls.wrap_socket(raw) if tls is not None else raw
        mine = nonce()
        body = IDENTITY_HELLO + b"\0" + mine.encode()
        conn.sendall(_LENGTH.pack(len(body)) + body)
        answer = _read(conn, 4096)
    if not answer:
        return None
    theirs, _, given = answer.partition(b"\0")
    text = theirs.decode("ascii", "replace")
    return is_nonce(text) and holds(key, "identity", actor_id, mine, text,
                                    given.decode("ascii", "replace"))


def _read(conn: socket.socket, limit: int) -> bytes:
    head = _exactly(conn, _LENGTH.size)
    (length,) = _LENGTH.unpack(head)
    if length > limit:
        raise ValueError(f"an answer of {length} bytes")
    return _exactly(conn, length)


def _exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        more = conn.recv(size - len(data))
        if not more:
            raise ValueError("the connection ended")
        data += more
    return data
