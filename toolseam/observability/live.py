"""Every live session of this process, answerable to ``toolseam ps`` and ``toolseam metrics``
of the same user: one unix socket per process (``<staging root>/live/<pid>.sock``, in a 0700
directory, mode 0600, each peer's uid checked with ``SO_PEERCRED``), served by a thread — so a
session whose event loop is busy or hung is still listed and can still be killed.

A request is one JSON line: ``{"op": "list"}`` answers each session's row (its usage asked of
its own loop, two seconds at most); ``{"op": "kill", "id": ID}`` ends that sandbox with
everything in it (``seam.capabilities.SandboxKill``), and its owner's calls then fail as
``sandbox_lost``. A kill is answered in two lines — ``{"found": ...}`` at once, then the
outcome — because an engine under load can take a minute to remove a container, and the
asker must not read that wait as "no such session".
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar, cast

from ..backends.staging import user_dir
from ..seam.capabilities import ResourceUsage, SandboxKill, SandboxUsage, supports
from ..seam.errors import CouldNotRunError
from .observed import ObservedSession

T = TypeVar("T")

_USAGE_WAIT_S = 2.0
_ANSWER_WAIT_S = 10.0  # a process's thread answers a list or "found" at once, even when busy
_KILL_WAIT_S = 120.0  # an engine removing a container under load can take a minute


def live_dir() -> Path:
    """This user's directory of live-session sockets (0700)."""
    path = user_dir("live")
    os.chmod(path, 0o700)
    return path


@dataclass
class LiveSession:
    observer: ObservedSession
    backend: object
    loop: asyncio.AbstractEventLoop
    durable: bool
    started: float = field(default_factory=time.time)

    def row(self) -> dict[str, Any]:
        usage = self._usage()
        attributes = self.observer.attributes
        return {"id": self.observer.session_id, "backend": self.observer.backend,
                "image": attributes.get("container.image.name"),
                "node": attributes.get("toolseam.node"), "started": self.started,
                "owner_pid": os.getpid(), "durable": self.durable,
                "calls": sum(self.observer.meter.calls.values()),
                "calls_by_outcome": dict(self.observer.meter.calls),
                "cpu_seconds": usage.cpu_seconds, "memory_bytes": usage.memory_bytes,
                "pids": usage.pids,
                "egress": {h: asdict(t) for h, t in self.observer.meter.egress.items()}}

    def _usage(self) -> SandboxUsage:
        if not supports(self.backend, ResourceUsage) or self.loop.is_closed():
            return SandboxUsage()
        measured = cast(ResourceUsage, self.backend)
        asked = asyncio.run_coroutine_threadsafe(measured.resource_usage(), self.loop)
        try:
            return asked.result(_USAGE_WAIT_S)
        except Exception:  # noqa: BLE001 - a busy or failing session is listed without figures
            asked.cancel()
            return SandboxUsage()

    def kill(self) -> bool:
        if not supports(self.backend, SandboxKill):
            return False
        cast(SandboxKill, self.backend).kill_sandbox()
        return True


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        creds = self.request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                        struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", creds)
        if uid != os.geteuid():  # the directory is 0700 already; a second lock
            return
        try:
            request = json.loads(self.rfile.readline(4096))
            if isinstance(request, dict) and request.get("op") == "kill":
                found = self.server.table.find(request.get("id"))
                self._send({"found": found is not None})
                if found is None:
                    return
                answer: dict[str, Any] = {"killed": found.kill()}
            else:
                answer = self.server.table.answer(request)
        except (ValueError, TypeError, AttributeError) as exc:
            answer = {"error": f"bad request: {exc}"}
        except Exception as exc:  # noqa: BLE001 - an engine's failure is the answer, said
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        self._send(answer)

    def _send(self, answer: dict[str, Any]) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the asker gave up
            self.wfile.write(json.dumps(answer).encode() + b"\n")
            self.wfile.flush()


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    table: LiveTable


class LiveTable:
    """This process's live sessions and the socket that answers for them."""

    def __init__(self) -> None:
        self._sessions: dict[str, LiveSession] = {}
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self.path: Path | None = None

    def add(self, session: LiveSession) -> None:
        with self._lock:
            self._sessions[session.observer.session_id] = session
            if self._server is None or self._pid != os.getpid():
                self._serve()

    def remove(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    def close(self) -> None:
        """Stop answering (the process-wide table answers until the process exits)."""
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            _unlink(Path(server.server_address), self._pid)  # type: ignore[arg-type]

    def find(self, session_id: object) -> LiveSession | None:
        with self._lock:
            return self._sessions.get(session_id) if isinstance(session_id, str) else None

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """A list request's answer (a kill is answered by the handler, in two lines)."""
        with self._lock:
            sessions = list(self._sessions.values())
        if request.get("op") == "list":
            return {"sessions": [s.row() for s in sessions]}
        return {"error": "unknown op"}

    def _serve(self) -> None:
        self._pid = os.getpid()
        path = live_dir() / f"{self._pid}.sock"
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a socket of an earlier process with this pid
        old = os.umask(0o177)
        try:
            server = _Server(str(path), _Handler)
        finally:
            os.umask(old)
        server.table = self
        self._server, self.path = server, path
        atexit.register(_unlink, path, self._pid)
        threading.Thread(target=server.serve_forever, name="toolseam-live", daemon=True).start()


def _unlink(path: Path, pid: int) -> None:
    if os.getpid() == pid:  # a forked child leaves its parent's socket alone
        with contextlib.suppress(OSError):
            path.unlink()


LIVE = LiveTable()


# --- the other side: toolseam ps and toolseam metrics ---------------------------------------
def _sockets() -> list[Path]:
    return sorted(live_dir().glob("*.sock"))


def _asked_in_parallel(ask: Callable[[Path], T | None]) -> list[T]:
    """``ask`` of every process's socket at once: a slow process costs its own wait only."""
    paths = _sockets()
    if not paths:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(paths))) as pool:
        return [answer for answer in pool.map(ask, paths) if answer is not None]


def ask_every_process(request: dict[str, Any], timeout_s: float = _ANSWER_WAIT_S
                      ) -> list[dict[str, Any]]:
    """``request`` to every process of this user that holds live sessions; each answer once.
    A socket whose process has ended is removed."""
    def ask(path: Path) -> dict[str, Any] | None:
        with _connected(path, timeout_s) as peer:
            if peer is None:
                return None
            peer.sendall(json.dumps(request).encode() + b"\n")
            with peer.makefile("rb") as lines:
                return _line(lines)
        return None  # a peer that did not answer in time, or answered garble
    return _asked_in_parallel(ask)


@contextlib.contextmanager
def _connected(path: Path, timeout_s: float) -> Iterator[socket.socket | None]:
    """A connection to one process's socket, or None (with its stale socket removed) when the
    process is gone; an unanswering or garbled peer also gives None."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
        peer.settimeout(timeout_s)
        try:
            peer.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            if not _alive(path.stem):  # its process ended without removing it (killed)
                with contextlib.suppress(OSError):
                    path.unlink()
            yield None
            return
        except OSError:
            yield None
            return
        try:
            yield peer
        except (OSError, ValueError):
            return


def _line(lines: IO[bytes]) -> dict[str, Any] | None:
    answer = json.loads(lines.readline(1 << 24) or b"null")
    return answer if isinstance(answer, dict) else None


def _still_held(path: Path, session_id: str) -> bool:
    """Whether the process of socket ``path`` still lists session ``session_id``."""
    if not _alive(path.stem):
        return False
    with _connected(path, _ANSWER_WAIT_S) as peer:
        if peer is None:
            return False
        peer.sendall(json.dumps({"op": "list"}).encode() + b"\n")
        with peer.makefile("rb") as lines:
            answer = _line(lines) or {}
            return any(row.get("id") == session_id for row in answer.get("sessions", []))
    return True  # it did not answer in time: not shown to be gone


def _alive(pid_text: str) -> bool:
    try:
        os.kill(int(pid_text), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def live_sessions() -> list[dict[str, Any]]:
    """Every live session of this user on this machine, a row each."""
    return [row for answer in ask_every_process({"op": "list"})
            for row in answer.get("sessions", [])]


def kill_session(session_id: str) -> bool:
    """End the sandbox of session ``session_id`` with everything in it; False when no process
    of this user holds such a session. Raises ``CouldNotRunError`` when its owner could not
    end it (the engine refused, say) or did not finish in ``_KILL_WAIT_S``."""
    request = json.dumps({"op": "kill", "id": session_id}).encode() + b"\n"

    def ask(path: Path) -> dict[str, Any] | None:
        with _connected(path, _ANSWER_WAIT_S) as peer:
            if peer is None:
                return None
            peer.sendall(request)
            with peer.makefile("rb") as lines:
                found = _line(lines)
                if not (found and found.get("found")):
                    return None
                peer.settimeout(_KILL_WAIT_S)
                try:
                    outcome = _line(lines)
                    if outcome is None:  # the owner closed without a word: it often exits
                        # at once when its sandbox is gone, before its answer is written
                        outcome = ({"error": "its owner closed the connection"}
                                   if _still_held(path, session_id) else {"killed": True})
                    return outcome
                except TimeoutError:
                    return {"error": f"its owner (pid {path.stem}) had not ended it after "
                                     f"{_KILL_WAIT_S:.0f} s"}
        return None

    answers = _asked_in_parallel(ask)
    if any(answer.get("killed") for answer in answers):
        return True
    failed = [str(a["error"]) for a in answers if a.get("error")]
    if failed:
        raise CouldNotRunError(f"session {session_id}: {failed[0]}", retryable=True,
                               cause="engine_error")
    return False
