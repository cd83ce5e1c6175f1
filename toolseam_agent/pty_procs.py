"""One interactive process: a command on a terminal (or on pipes) that the host writes to and
reads from over many calls — a REPL, a password prompt, a full-screen program.

Started through the same path as every job (under a root of its own, ``jobroot.py``, with
``spawning.spawn_with``: the set-id guard's thread and its Landlock domain, default signals, a
session of its own, the session's scrubbed environment): a command on a terminal gets nothing a
bash command does not, and what it starts is exactly its root's descendants. The agent keeps the
terminal's master end (close-on-exec: no command inherits it); the child opens the slave by its
path after ``setsid``, which makes it the child's controlling terminal, so Ctrl-C (``\\x03``)
and a hang-up reach its foreground process group as on a real terminal.

Output not yet read is kept up to ``BUFFER_BYTES``; a flood drops the oldest bytes and counts
them (the next read says how many). When the leader exits, whatever still holds its terminal
after ``DRAIN_S`` is killed: a process owns what it started, as a bash call does.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import struct
import termios
import time
from collections.abc import Callable
from typing import Any

from .jobroot import Roots, passed
from .loop import Loop, Timer
from .procscan import descendants, signal_if_same
from .wire import ErrorKind

BUFFER_BYTES = 1 << 20  # output kept per process between reads (the oldest is dropped)
WRITE_MAX = 1 << 20  # input waiting for the program to take it
DRAIN_S = 0.2  # after the leader's exit: what still holds the terminal is killed then
POLL_S = 0.01
_READ = 1 << 16

Answer = Callable[[dict[str, Any]], None]


class PtyError(Exception):
    """A request refused: ``kind`` is the wire error kind (``wire.ErrorKind``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def size_of(spec: dict[str, Any]) -> tuple[int, int]:
    """A start's terminal size (24 x 80 unless given)."""
    rows, cols = spec.get("rows"), spec.get("cols")
    return 24 if rows is None else int(rows), 80 if cols is None else int(cols)


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _stdio(tty: bool, rows: int, cols: int) -> tuple[list[Any], int, int, list[int]]:
    """The child's descriptors 0-2 as spawn actions; the agent's read and write ends; the
    descriptors to close once the child has its own."""
    if tty:
        master, slave = os.openpty()  # both close-on-exec
        try:
            # 0600, not devpts' 0620 group tty: no other local user's `write` or `wall`
            # (set-gid tty) reaches a session's terminal on the host backend
            os.fchmod(slave, 0o600)
            set_size(slave, rows, cols)
            path = os.ttyname(slave)
        except BaseException:
            os.close(master)
            os.close(slave)
            raise
        actions = [(os.POSIX_SPAWN_OPEN, 0, path, os.O_RDWR, 0),  # after setsid: the ctty
                   (os.POSIX_SPAWN_DUP2, 0, 1), (os.POSIX_SPAWN_DUP2, 0, 2)]
        return actions, master, master, [slave]
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    actions = [(os.POSIX_SPAWN_DUP2, in_r, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
               (os.POSIX_SPAWN_DUP2, out_w, 2)]
    return actions, out_r, in_w, [in_r, out_w]


class PtyProc:
    """One interactive process: its terminal, its unread output, its end."""

    def __init__(self, loop: Loop, number: int, spec: dict[str, Any], env: dict[str, str],
                 roots: Roots, on_exited: Callable[[PtyProc], None]) -> None:
        self.loop, self.id, self._roots, self._on_exited = loop, number, roots, on_exited
        self.argv = [str(a) for a in spec["argv"]]
        self.tty = bool(spec.get("tty", True))
        self.exit_status: int | None = None
        self._root_lost = False
        actions, self._reader, self._writer, theirs = _stdio(self.tty, *size_of(spec))
        try:
            actions, fds = passed(actions)
            self.root = roots.start("spawn", self.argv, str(spec.get("cwd") or "/"), env,
                                    actions, {}, fds, self)
            self.pid = self.root.leader
            self._root_lost = not self.root.alive
        except BaseException:
            for fd in {self._reader, self._writer}:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        for fd in {self._reader, self._writer}:
            os.set_blocking(fd, False)
        loop.add_reader(self._reader, self._on_readable)
        self.started = time.time()
        self.buffer = bytearray()
        self.dropped = 0  # bytes dropped since the last read
        self.state = "running"  # running -> ending (the leader exited) -> exited
        self._eof = False
        self._waiter: tuple[Answer, int, Timer] | None = None
        self._pending = bytearray()  # input not yet taken by the terminal
        self._write_answers: list[Answer] = []
        self._write_timer: Timer | None = None
        self._drain: Timer | None = None

    # --- output -----------------------------------------------------------------------------
    def _on_readable(self) -> None:
        try:
            data = os.read(self._reader, _READ)
        except BlockingIOError:
            return
        except OSError:  # EIO: every holder of the terminal's slave end has closed it
            data = b""
        if not data:
            self._eof = True
            self.loop.remove_reader(self._reader)
            if self.state == "ending":
                self.close()
            return
        self.buffer += data
        over = len(self.buffer) - BUFFER_BYTES
        if over > 0:
            del self.buffer[:over]
            self.dropped += over
        if self._waiter is not None:
            self.loop.call_soon(self._answer_waiter)  # what came in this loop pass, together

    def read(self, answer: Answer, yield_s: float, max_bytes: int) -> None:
        """Answer with the output there now; with none, once some comes, the process has
        ended or ``yield_s`` passed. A second read answers a waiting one first."""
        self._answer_waiter()
        if self.buffer or self.dropped or self.state == "exited" or yield_s <= 0:
            answer(self._take(max_bytes))
            return
        self._waiter = (answer, max_bytes, self.loop.call_later(yield_s, self._answer_waiter))

    def _answer_waiter(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter[2].cancel()
            waiter[0](self._take(waiter[1]))

    def _take(self, max_bytes: int) -> dict[str, Any]:
        data = bytes(self.buffer[:max_bytes])
        del self.buffer[:max_bytes]
        dropped, self.dropped = self.dropped, 0
        exited = self.state == "exited" and not self.buffer
        result: dict[str, Any] = {"data": data, "exited": exited, "dropped": dropped}
        if exited and self.exit_status is not None:
            result["exit_code"] = os.waitstatus_to_exitcode(self.exit_status)
        return result

    def unread(self) -> bool:
        return bool(self.buffer) or self._waiter is not None

    # --- input ------------------------------------------------------------------------------
    def write(self, data: bytes, answer: Answer) -> None:
        """Queue ``data`` for the program; ``answer`` once the terminal has taken all of it."""
        if self.state != "running":
            raise PtyError(ErrorKind.PTY_EXITED, f"process {self.id} has exited: nothing reads its input")
        if len(self._pending) + len(data) > WRITE_MAX:
            raise PtyError(ErrorKind.LIMIT, f"process {self.id} has not read {len(self._pending)} bytes "
                           f"of its input; at most {WRITE_MAX} may wait")
        self._pending += data
        self._write_answers.append(answer)
        if self._write_timer is None:
            self._flush()

    def _flush(self) -> None:
        self._write_timer = None
        while self._pending:
            try:
                sent = os.write(self._writer, self._pending)
            except BlockingIOError:  # the program is not reading now: try again soon
                self._write_timer = self.loop.call_later(POLL_S, self._flush)
                return
            except OSError:
                self._end_writes("its input is closed")
                return
            del self._pending[:sent]
        answers, self._write_answers = self._write_answers, []
        for answer in answers:
            answer({})

    def _end_writes(self, why: str) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        self._pending.clear()
        answers, self._write_answers = self._write_answers, []
        for answer in answers:
            answer({"error": f"process {self.id}: {why}; the input was not all taken"})

    def resize(self, rows: int, cols: int) -> None:
        if not self.tty:
            raise PtyError(ErrorKind.PROTOCOL, f"process {self.id} has no terminal (started with tty off)")
        if self.state != "exited":
            set_size(self._reader, rows, cols)  # the kernel sends SIGWINCH to its foreground

    # --- the end ----------------------------------------------------------------------------
    def on_root_lost(self) -> None:
        """A command killed its root: only the leader's own tree is known to be its now."""
        self._root_lost = True

    def on_exit(self, status: int, clean: bool = False,
                usage: tuple[float, int] | None = None) -> None:
        """The leader was reaped (by its root; by the agent when the root was lost)."""
        if self.exit_status is not None:
            return
        self.exit_status = status
        self._end_writes("it exited")
        self.state = "ending"
        if self._eof:
            self.close()
        else:
            self._drain = self.loop.call_later(DRAIN_S, self._end_leftovers)

    def _end_leftovers(self) -> None:
        """The leader is gone and something still holds its terminal: kill it, keep what
        the terminal still holds, and end."""
        self._drain = None
        self.signal_all(signal.SIGKILL)
        for _ in range(64):
            if self._eof or not _readable(self._reader):
                break
            self._on_readable()
        self.close()

    def close(self) -> None:
        """Ended (or given up on): the terminal closed, a waiting read answered."""
        if self.state == "exited":
            return
        self.state = "exited"
        self._end_writes("it ended")
        if self._drain is not None:
            self._drain.cancel()
        if not self._eof:
            self.loop.remove_reader(self._reader)
            self._eof = True
        for fd in {self._reader, self._writer}:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._roots.release(self.root)
        self._on_exited(self)
        if self._waiter is not None:
            self.loop.call_soon(self._answer_waiter)

    def members(self) -> dict[int, int]:
        """pid -> start ticks of its live processes: everything under its root."""
        if self._root_lost:
            return descendants(self.pid, with_top=True) if self.exit_status is None else {}
        return descendants(self.root.pid)

    def signal_all(self, sig: int) -> None:
        if self.exit_status is None:  # the group first (members forked between scans), only
            with contextlib.suppress(OSError):  # while the leader's pid cannot be another's
                os.killpg(self.pid, sig)
        for pid, started in self.members().items():
            signal_if_same(pid, started, sig)

    def status(self) -> dict[str, Any]:
        return {"pty": self.id, "pid": self.pid, "argv": self.argv, "started": self.started,
                "tty": self.tty, "state": "exited" if self.state == "exited" else "running"}


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])
