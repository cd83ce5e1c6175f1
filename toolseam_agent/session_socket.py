"""A durable agent: its state outlives every connection to it (docs/sessions.md).

``server.py``'s agent ends with its one channel. Started with ``--durable PATH``, the agent
listens on the unix socket at PATH instead, and a connection is just one stream to it:

* every connection starts with ``attach`` carrying the session's secret; the agent knows only
  the secret's SHA-256 (from its environment, ``SECRET_VAR``), so reading the agent's memory or
  ``/proc/1/environ`` from a command yields nothing that attaches;
* one connection at a time: an ``attach`` while another is live is refused (``in_use``), so a
  second client never cuts the first off by mistake;
* answers are kept (bounded) until a later attach no longer names them: a client that lost its
  connection mid-call names its pending request ids and gets each answer — sent again, still to
  come, or an error that says plainly it was lost;
* with no connection the jobs go on; after ``orphan_timeout_s`` without an attach the agent
  ends every job and exits (in a container: the container ends with it);
* the client's own state (its jobs table, pinned shell, settings: opaque JSON) is stored with
  ``state_put`` and handed back by ``attach``.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import select
import socket
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from . import wire
from .loop import Timer
from .relay import socket_address
from .server import Agent
from .wire import ErrorKind

SECRET_VAR = "TOOLSEAM_SESSION_SECRET_SHA256"  # hex SHA-256 of the attach secret
ORPHAN_VAR = "TOOLSEAM_ORPHAN_TIMEOUT_S"
ATTACH, STATE_PUT = "attach", "state_put"
_KEPT_ANSWERS = 256  # answers kept for a client that reconnects ...
_KEPT_BYTES = 64 << 20  # ... and their total size
_FIRST_LINE_MAX = 1 << 16  # an attach line is small: a bigger one is not a client
_CANDIDATES_MAX = 16  # connections not yet attached, kept at once (each holds a descriptor)


class DurableAgent(Agent):
    """The agent with connections that come and go (module docstring)."""

    def __init__(self, server: socket.socket, secret_sha256: str, orphan_timeout_s: float,
                 path: str | None = None) -> None:
        """``path``: where the socket file is (it may have been bound under another name)."""
        self._server = server
        self._path = path
        self._secret_sha256 = bytes.fromhex(secret_sha256)
        self._orphan_timeout_s = orphan_timeout_s
        self._conn: socket.socket | None = None
        self._candidates: dict[int, tuple[socket.socket, bytearray]] = {}
        self._kept: OrderedDict[Any, bytes] = OrderedDict()  # rid -> its answer line
        self._kept_bytes = 0
        self._in_flight: set[Any] = set()
        self._max_rid = 0
        self._state: dict[str, Any] = {}  # the client's own, by part (toolkit, copy)
        self._orphan_timer: Timer | None = None
        idle_r, idle_w = os.pipe()  # Agent wants a channel fd; it is swapped at each attach
        os.close(idle_w)
        self._idle_fd = idle_r
        super().__init__(idle_r, idle_r)
        self.loop.remove_reader(idle_r)
        server.setblocking(False)
        self.loop.add_reader(server.fileno(), self._accept)
        self._orphaned()  # nobody is attached yet: the creator has the same window to attach

    # --- connections -----------------------------------------------------------------------
    def _accept(self) -> None:
        while True:  # every waiting connection: a full backlog refuses the next client
            try:
                conn, _ = self._server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, say: the oldest candidate makes room
                if not self._candidates:
                    return
                self._drop_candidate(next(iter(self._candidates.values()))[0])
                continue
            conn.setblocking(False)
            if len(self._candidates) >= _CANDIDATES_MAX:  # a command holding connections open
                self._drop_candidate(next(iter(self._candidates.values()))[0])  # the oldest goes
            self._candidates[conn.fileno()] = (conn, bytearray())
            self.loop.add_reader(conn.fileno(), functools.partial(self._on_candidate, conn))

    def _on_candidate(self, conn: socket.socket) -> None:
        """A new connection's first line must be an ``attach``; nothing else is read from it."""
        _, buf = self._candidates[conn.fileno()]
        try:
            data = conn.recv(_FIRST_LINE_MAX)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        buf += data
        if not data or len(buf) > _FIRST_LINE_MAX:
            self._drop_candidate(conn)
            return
        if b"\n" not in buf:
            return
        line, _, rest = bytes(buf).partition(b"\n")
        self.loop.remove_reader(conn.fileno())
        del self._candidates[conn.fileno()]
        try:
            request = wire.loads(line.decode())
            rid, op, secret = request["id"], request["op"], str(request.get("secret", ""))
        except (ValueError, KeyError, TypeError) as exc:
            self._refuse(conn, None, "protocol", f"the first request must be attach: {exc}")
            return
        if op != ATTACH:
            self._refuse(conn, rid, "protocol", f"the first request must be attach, not {op!r}")
        elif not hmac.compare_digest(hashlib.sha256(secret.encode()).digest(),
                                     self._secret_sha256):
            self._refuse(conn, rid, "wrong_secret", "wrong secret for this session")
        elif self._closing:
            self._refuse(conn, rid, "ended", "the session is ending")
        elif self._conn is not None and not self._current_ended():
            self._refuse(conn, rid, "in_use", "another client is attached to this session; "
                         "it must detach or end first")
        else:
            self._take(conn, rid, request.get("pending") or [], rest)

    def _current_ended(self) -> bool:
        """Whether the attached connection has ended though its end is not read yet (a client
        killed a moment ago): then it is let go now, and the new attach is not refused."""
        assert self._conn is not None
        try:
            ended = self._conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            ended = True
        if ended:
            self.loop.remove_reader(self._conn.fileno())
            self._input_ended()
        return ended

    def _drop_candidate(self, conn: socket.socket) -> None:
        self.loop.remove_reader(conn.fileno())
        self._candidates.pop(conn.fileno(), None)
        conn.close()

    def _refuse(self, conn: socket.socket, rid: Any, reason: str, message: str) -> None:
        line = (wire.dumps(wire.failure(rid, ErrorKind.ATTACH, message, reason=reason)) + "\n")
        try:
            conn.setblocking(True)
            conn.settimeout(1.0)
            conn.sendall(line.encode())
        except OSError:
            pass
        conn.close()

    def _take(self, conn: socket.socket, rid: Any, pending: list[Any], rest: bytes) -> None:
        if self._orphan_timer is not None:
            self._orphan_timer.cancel()
            self._orphan_timer = None
        self._conn = conn
        self.infd = self.outfd = conn.fileno()
        self._inbuf = b""
        self._answer(rid, {"state": self._state, "next_id": self._max_rid + 1,
                           "jobs": [{"job": job.id, "argv": job.argv, "pid": job.pid,
                                     "started": job.started,
                                     "state": "exited" if job.state == "done" else "running"}
                                    for job in self.jobs.values()],
                           "orphan_timeout_s": self._orphan_timeout_s})
        for pending_rid in pending:  # what the client still waits for, in its order
            kept = self._kept.get(pending_rid)
            if kept is not None:
                self._write(kept)
            elif pending_rid not in self._in_flight:
                self._fail(pending_rid, ErrorKind.ATTACH, "the connection dropped before this "
                           "answer could be kept; the request's effect is unknown", reason="lost")
        self._kept.clear()  # the client has named all it waits for
        self._kept_bytes = 0
        self.loop.add_reader(conn.fileno(), self._on_input)
        if rest:
            self._inbuf = rest
            self._on_input_lines()

    def _on_input_lines(self) -> None:
        *lines, self._inbuf = self._inbuf.split(b"\n")
        for line in lines:
            if line.strip():
                self._handle(line)

    def _input_ended(self) -> None:
        """The connection ended without ``shutdown``: keep everything, wait for an attach."""
        conn, self._conn = self._conn, None
        self.infd = self.outfd = self._idle_fd
        if conn is not None:
            conn.close()
        if not self._closing:
            self._orphaned()

    def _orphaned(self) -> None:
        if self._orphan_timeout_s <= 0:
            self.shut_down()
            return
        self._orphan_timer = self.loop.call_later(self._orphan_timeout_s, self.shut_down)

    # --- requests and answers ----------------------------------------------------------------
    def _handle(self, line: bytes) -> None:
        try:
            request = wire.loads(line.decode())
        except ValueError:
            request = None
        if isinstance(request, dict):
            rid = request.get("id")
            if isinstance(rid, int):
                self._max_rid = max(self._max_rid, rid)
            if request.get("op") == STATE_PUT:
                self._state[str(request.get("key", "toolkit"))] = request.get("state")
                self._answer(rid, {})
                return
            if rid is not None:
                self._in_flight.add(rid)
        super()._handle(line)

    def send(self, message: Mapping[str, Any]) -> None:
        rid = message.get("id")
        if rid is None or "ev" in message:
            if self._conn is not None:
                super().send(message)  # live output: only to a client that is there
            return
        line = (wire.dumps(message) + "\n").encode()
        with self._write_lock:
            self._in_flight.discard(rid)
            self._kept[rid] = line
            self._kept_bytes += len(line)
            while len(self._kept) > _KEPT_ANSWERS or self._kept_bytes > _KEPT_BYTES:
                self._kept_bytes -= len(self._kept.popitem(last=False)[1])
        if self._conn is not None:
            self._write(line)

    def send_bytes(self, data: bytes) -> None:
        """A tunnel's data frame (egress): only to a client that is there, like live output."""
        if self._conn is not None:
            self._write(data)

    def _write(self, line: bytes) -> None:
        with self._write_lock:
            view = memoryview(line)
            fd = self.outfd
            while view:
                try:
                    view = view[os.write(fd, view):]
                except BlockingIOError:
                    select.select([], [fd], [], 5)
                except OSError:
                    return  # the connection is gone: the answer is kept for the next attach

    def run(self) -> None:
        try:
            super().run()
        finally:
            path = self._path or self._server.getsockname()
            self._server.close()
            if isinstance(path, str) and path and not path.startswith("\0"):
                try:
                    os.unlink(path)
                    if os.path.basename(os.path.dirname(path)).startswith("toolseam-session-"):
                        os.rmdir(os.path.dirname(path))  # the host's session dir, made for it
                except OSError:
                    pass


def serve(path: str, environ: Mapping[str, str]) -> None:
    """Listen at ``path`` (0600) and serve until shut down or orphaned too long."""
    secret = environ.get(SECRET_VAR, "")
    if len(secret) != 64:
        raise SystemExit(f"--durable needs {SECRET_VAR} (a hex SHA-256)")
    timeout = float(environ.get(ORPHAN_VAR, "0") or 0)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if path.startswith("@"):  # abstract (copy mode): no file to remove or replace
        server.bind(socket_address(path))
        server.listen(64)
    else:
        # Bound and listening under another name, then renamed into place: a client waiting
        # for the path to appear could otherwise connect between bind and listen (refused).
        staging = f"{path}.{os.getpid()}"
        for stale in (path, staging):
            if os.path.exists(stale):
                os.unlink(stale)
        old = os.umask(0o177)  # 0600 from the start: no window in which others may connect
        try:
            server.bind(staging)
        finally:
            os.umask(old)
        server.listen(64)
        os.rename(staging, path)
    DurableAgent(server, secret, timeout, None if path.startswith("@") else path).run()
