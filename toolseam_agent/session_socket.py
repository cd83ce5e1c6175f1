"""A durable agent: its state outlives every connection to it (docs/sessions.md).

``server.py``'s agent ends with its one channel. Started with ``--durable PATH``, the agent
listens on the unix socket at PATH instead, and a connection is just one stream to it:

* every connection starts with a two-step ``attach`` that proves, both ways, knowledge of the
  key derived from the session's secret, without sending it (``attach_auth.py``); the agent is
  given only that key (``KEY_VAR``), scrubbed from its environment block at start, and is not
  dumpable, so no command can read it; every line after the attach is sealed with a key new
  for that connection, so a process relaying between client and agent cannot change a line;
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
import os
import select
import socket
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from . import frames, userns, wire
from .attach_auth import (
    KEY_VAR,
    NONCE_BYTES,
    TAG_LEN,
    Sealer,
    SealError,
    agent_proof,
    new_nonce,
    scrub_environ,
    session_key,
)
from .loop import Timer
from .relay import socket_address
from .server import TURN_WAIT_S, Agent
from .wire import ErrorKind

ORPHAN_VAR = "TOOLSEAM_ORPHAN_TIMEOUT_S"
_SESSION_DIR_PREFIX, _ROOT_PREFIX = "toolseam-session-", "toolseam-sessions-"  # host_durable.py
ATTACH, STATE_PUT = "attach", "state_put"
_KEPT_ANSWERS = 256  # answers kept for a client that reconnects ...
_KEPT_BYTES = 64 << 20  # ... and their total size
_FIRST_LINE_MAX = 1 << 16  # an attach line is small: a bigger one is not a client
_CANDIDATES_MAX = 16  # connections not yet attached, kept at once (each holds a descriptor)


class _Candidate:
    """A connection not yet attached: its bytes so far, and after the first step its nonces
    and the seals the attach must carry."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buf = bytearray()
        self.rid: Any = None
        self.incoming: Sealer | None = None  # set once the agent has answered the challenge
        self.outgoing: Sealer | None = None


class DurableAgent(Agent):
    """The agent with connections that come and go (module docstring)."""

    def __init__(self, server: socket.socket, key: bytes, orphan_timeout_s: float,
                 path: str | None = None, listener: Listener | None = None) -> None:
        """``path``: where the socket file is (it may have been bound under another name);
        ``listener``: how it was bound (a hidden directory is removed through its fds)."""
        self._server = server
        self._path = path
        self._listener = listener
        self._key = key
        self._orphan_timeout_s = orphan_timeout_s
        self._conn: socket.socket | None = None
        self._seal: Sealer | None = None  # the attached connection's, both ways
        self._unseal: Sealer | None = None
        self._candidates: dict[int, _Candidate] = {}
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
                self._drop_candidate(next(iter(self._candidates.values())).conn)
                continue
            conn.setblocking(False)
            if len(self._candidates) >= _CANDIDATES_MAX:  # a command holding connections open
                self._drop_candidate(next(iter(self._candidates.values())).conn)  # the oldest
            self._candidates[conn.fileno()] = _Candidate(conn)
            self.loop.add_reader(conn.fileno(), functools.partial(self._on_candidate, conn))

    def _on_candidate(self, conn: socket.socket) -> None:
        """A new connection: the attach's two steps (``attach_auth.py``), nothing else."""
        candidate = self._candidates[conn.fileno()]
        try:
            data = conn.recv(_FIRST_LINE_MAX)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        candidate.buf += data
        if not data or len(candidate.buf) > _FIRST_LINE_MAX:
            self._drop_candidate(conn)
            return
        while b"\n" in candidate.buf and conn.fileno() in self._candidates:
            line, _, rest = bytes(candidate.buf).partition(b"\n")
            candidate.buf = bytearray(rest)
            if candidate.incoming is None:
                self._challenge(candidate, line)
            else:
                self._prove(candidate, line)

    def _challenge(self, candidate: _Candidate, line: bytes) -> None:
        """Step one: the client's nonce in; this agent's nonce and proof out."""
        try:
            request = wire.loads(line.decode())
            rid, op, nonce = request["id"], request["op"], request.get("nonce")
        except (ValueError, KeyError, TypeError) as exc:
            self._refuse(candidate, "protocol", f"the first request must be attach: {exc}")
            return
        candidate.rid = rid
        if op != ATTACH:
            self._refuse(candidate, "protocol", f"the first request must be attach, not {op!r}")
            return
        if not isinstance(nonce, str) or len(nonce) != 2 * NONCE_BYTES:
            self._refuse(candidate, "unsupported", "this session's agent wants an attach that "
                         "proves the secret without sending it (a toolseam of this version)")
            return
        mine = new_nonce()
        session = session_key(self._key, nonce, mine)
        candidate.incoming, candidate.outgoing = Sealer(session, b"C"), Sealer(session, b"A")
        self._send_to(candidate.conn, wire.answer(rid, {
            "nonce": mine, "proof": agent_proof(self._key, nonce, mine)}))

    def _prove(self, candidate: _Candidate, line: bytes) -> None:
        """Step two: the client's first sealed line — the attach itself, naming what it waits
        for. A seal that does not hold means the client does not know the key."""
        assert candidate.incoming is not None and candidate.outgoing is not None
        try:
            request = wire.loads(candidate.incoming.open(line).decode())
            rid, pending = request["id"], request.get("pending") or []
            candidate.rid = rid
        except SealError:
            self._refuse(candidate, "wrong_secret", "wrong secret for this session")
            return
        except (ValueError, KeyError, TypeError) as exc:
            self._refuse(candidate, "protocol", f"a malformed attach: {exc}", sealed=True)
            return
        conn = candidate.conn
        if self._closing:
            self._refuse(candidate, "ended", "the session is ending", sealed=True)
        elif self._conn is not None and not self._current_ended():
            self._refuse(candidate, "in_use", "another client is attached to this session; "
                         "it must detach or end first", sealed=True)
        else:
            self.loop.remove_reader(conn.fileno())
            del self._candidates[conn.fileno()]
            self._take(conn, rid, pending, bytes(candidate.buf),
                       candidate.outgoing, candidate.incoming)

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

    def _send_to(self, conn: socket.socket, message: Mapping[str, Any],
                 seal: Sealer | None = None) -> bool:
        payload = wire.dumps(message).encode()
        line = (seal.seal(payload) if seal is not None else payload) + b"\n"
        try:
            conn.setblocking(True)
            conn.settimeout(1.0)
            conn.sendall(line)
            conn.setblocking(False)
        except OSError:
            return False
        return True

    def _refuse(self, candidate: _Candidate, reason: str, message: str,
                sealed: bool = False) -> None:
        """Answer a refusal (sealed once the client has proved itself: it can trust it) and
        end the connection."""
        self._send_to(candidate.conn, wire.failure(candidate.rid, ErrorKind.ATTACH, message,
                                                   reason=reason),
                      candidate.outgoing if sealed else None)
        self._drop_candidate(candidate.conn)

    def _take(self, conn: socket.socket, rid: Any, pending: list[Any], rest: bytes,
              seal: Sealer, unseal: Sealer) -> None:
        if self._orphan_timer is not None:
            self._orphan_timer.cancel()
            self._orphan_timer = None
        with self._write_lock:  # a file operation's thread may be answering right now
            self._conn = conn
            self._seal, self._unseal = seal, unseal
            self.infd = self.outfd = conn.fileno()
            self._passing.forget()  # the last connection's number may be this one's
        self._splitter.reset()
        self._splitter.tag_len = TAG_LEN  # every frame from here on is sealed too
        self.connection_number += 1
        for pending_rid in pending:  # a start still in flight has its client back
            if pending_rid in self.start_connection:
                self.start_connection[pending_rid] = self.connection_number
        self._forget_delivered(pending)
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
            try:
                items = self._splitter.feed(rest)
            except frames.FrameError:
                items = [b"not a frame"]  # fails its seal below: the connection ends
            self._lines(items)

    def _forget_delivered(self, pending: list[Any]) -> None:
        """A forget-start answered (exited) while its client was gone: if this attach names
        it, its client takes that answer now, and the job goes as the start asked; if not, the
        client that started it is gone for good and the job stays listed, so the attaching one
        can take it over and read how it ended (issue 45)."""
        for pending_rid in pending:
            job_id = self.forget_on_delivery.get(pending_rid)
            if job_id is not None and pending_rid in self._kept:
                self.jobs.pop(job_id, None)
        self.forget_on_delivery.clear()

    def _lines(self, items: list[bytes | frames.Frame]) -> None:
        """Every line and data frame of an attached connection is sealed: one that does not
        hold ends the connection (something between client and agent changed it); nothing
        else is lost."""
        unseal = self._unseal
        for item in items:
            if unseal is None or (not isinstance(item, frames.Frame) and not item.strip()):
                continue
            try:
                if isinstance(item, frames.Frame):
                    unseal.open_frame(item.head, item.data, item.tag)
                else:
                    item = unseal.open(item)
            except SealError:
                if self._conn is not None:
                    self.loop.remove_reader(self._conn.fileno())
                    self._input_ended()
                return
            if isinstance(item, frames.Frame):
                self.tunnels.from_host_data(item.number, item.data)
            elif not self.ports.from_host_line(item):
                self._handle(item)

    def _input_ended(self) -> None:
        """The connection ended without ``shutdown``: keep everything, wait for an attach."""
        with self._write_lock:
            conn, self._conn = self._conn, None
            self._seal = self._unseal = None
            self.infd = self.outfd = self._idle_fd
            self._passing.forget()
        self.connection_number += 1  # answers from now on find their client gone
        self.ports.end_all()  # exposed ports are the client's: their connections go with it
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
        """An exposed port's data lines: only to a client that is there, like live output."""
        if self._conn is not None:
            self._write(data)

    def send_data(self, number: int, data: bytes) -> None:
        """A tunnel's data frame (egress): only to a client that is there, like live output;
        sealed like a line, in the same sequence."""
        if self._conn is None:
            return
        with self._turn:
            self._turn.wait_for(lambda: not self._urgent, TURN_WAIT_S)
        head = frames.header(number, len(data))
        with self._write_lock:
            seal, fd = self._seal, self.outfd
            if seal is None:
                return
            self._write_all(fd, head + data + seal.seal_frame(head, data))

    def _write(self, data: bytes) -> None:
        """Whole lines to the attached connection, each sealed (in the order written: the
        sequence numbers are in the seals)."""
        with self._write_lock:
            seal, fd = self._seal, self.outfd
            if seal is None:
                return  # nobody attached: an answer is kept for the next attach
            self._write_all(fd, b"".join(seal.seal(line) + b"\n"
                                         for line in data.split(b"\n")[:-1]))

    @staticmethod
    def _write_all(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                select.select([], [fd], [], 5)
            except OSError:
                return  # the connection is gone: an answer is kept for the next attach

    def run(self) -> None:
        try:
            super().run()
        finally:
            self._server.close()
            if self._path is not None:
                self._remove_socket(self._path)

    def _remove_socket(self, path: str) -> None:
        """The socket and the host's session directory made for it — through the directories
        opened before they were hidden from commands, where they were (host backend)."""
        directory = os.path.dirname(path)
        hidden = self._listener is not None and self._listener.root_fd is not None
        dir_fd = self._listener.dir_fd if hidden and self._listener else None
        root_fd = self._listener.root_fd if hidden and self._listener else None
        try:
            os.unlink(os.path.basename(path) if hidden else path, dir_fd=dir_fd)
            if os.path.basename(directory).startswith(_SESSION_DIR_PREFIX):
                os.rmdir(os.path.basename(directory) if hidden else directory, dir_fd=root_fd)
        except OSError:
            pass


class Listener:
    """The durable agent's socket, bound before the agent hides anything (``main.main``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.dir_fd: int | None = None
        self.root_fd: int | None = None
        if path.startswith("@"):  # abstract (copy mode): no file to remove or replace
            self.server.bind(socket_address(path))
            self.server.listen(64)
            return
        # Bound and listening under another name, then renamed into place: a client waiting
        # for the path to appear could otherwise connect between bind and listen (refused).
        staging = f"{path}.{os.getpid()}"
        for stale in (path, staging):
            if os.path.exists(stale):
                os.unlink(stale)
        old = os.umask(0o177)  # 0600 from the start: no window in which others may connect
        try:
            self.server.bind(staging)
        finally:
            os.umask(old)
        self.server.listen(64)
        os.rename(staging, path)

    def hide_from_commands(self) -> bool:
        """Cover the sessions root (the session directory's parent) with an empty tmpfs in this
        mount namespace — the host agent's, before it enters its own user namespace: the mount
        is then locked, so no command can lift it. Clients outside see the socket; commands see
        nothing to rename or replace. Both directories are opened first: the agent removes the
        socket and its directory through them at its end. False where the layout is not the
        host backend's."""
        directory = os.path.dirname(self.path)
        root = os.path.dirname(directory)
        if (self.path.startswith("@") or not os.path.basename(directory).startswith(
                _SESSION_DIR_PREFIX) or not os.path.basename(root).startswith(_ROOT_PREFIX)):
            return False
        self.dir_fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        userns.cover_with_empty_tmpfs(root)
        return True


def serve(listener: Listener, environ: Mapping[str, str]) -> None:
    """Serve on ``listener`` until shut down or orphaned too long. The key comes from
    ``environ`` and is scrubbed from the process's environment block at once."""
    key = environ.get(KEY_VAR, "")
    scrub_environ(KEY_VAR)
    if len(key) != 64:
        raise SystemExit(f"--durable needs {KEY_VAR} (the session's attach key, hex)")
    timeout = float(environ.get(ORPHAN_VAR, "0") or 0)
    path = None if listener.path.startswith("@") else listener.path
    DurableAgent(listener.server, bytes.fromhex(key), timeout, path, listener).run()
