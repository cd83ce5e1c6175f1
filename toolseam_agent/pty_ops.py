"""The agent's interactive-process ops (``pty_*``): the table of processes and its limits.

Mixed into ``server.Agent``, so these ops are rows of the same op table as ``start`` and travel
the same channel — sealed line by line in a durable agent (``session_socket.py``), whose
processes outlive a client's connection like its jobs do.

* ``pty_start`` {spec: argv, cwd, env, rows, cols, tty} → {pty, pid}; refused (``limit``) when
  ``MAX_LIVE`` are running;
* ``pty_write`` {pty, data_b64} → {} once the program's terminal has taken all of it;
* ``pty_read`` {pty, yield_ms, max_bytes} → {data_b64, exited, exit_code, dropped}: what is
  there, else what comes within ``yield_ms``; a process is forgotten once a read has said it
  exited;
* ``pty_resize`` {pty, rows, cols} → {};
* ``pty_terminate`` {pty} → {exit_code, killed_tree}: SIGHUP (and SIGCONT) to its process
  group and every process it started, SIGKILL after ``HANGUP_GRACE_S``; forgotten then;
* ``pty_list`` → {ptys: [...]}: what a client that attached again can reach.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from .jobroot import Roots
from .jobs import SpawnError
from .loop import Loop
from .pty_procs import PtyError, PtyProc, size_of
from .wire import ErrorKind

MAX_LIVE = 64  # running at once; the 65th start is refused
KEPT_EXITED = 64  # ended, their last output not read: the oldest beyond this is forgotten
HANGUP_GRACE_S = 1.0
GIVE_UP_S = 3.0  # after SIGKILL: a process still there cannot be killed (D state)
_POLL_S = 0.01


class PtyTable:
    """The agent's interactive processes by number."""

    def __init__(self, loop: Loop, roots: Roots) -> None:
        """``roots``: the agent's job roots (``jobroot.py``); each process gets one."""
        self.loop, self._roots = loop, roots
        self.procs: dict[int, PtyProc] = {}
        self.by_pid: dict[int, PtyProc] = {}
        self._next = 0

    def running(self) -> int:
        return len(self.by_pid)

    def start(self, spec: dict[str, Any], env: dict[str, str]) -> PtyProc:
        if self.running() >= MAX_LIVE:
            raise PtyError(ErrorKind.LIMIT, f"{MAX_LIVE} interactive processes are running, the "
                           "most a session may have; terminate one first")
        self._next += 1
        number = self._next
        proc = PtyProc(self.loop, number, spec, env, self._roots, self._exited)
        self.procs[number] = proc
        self.by_pid[proc.pid] = proc
        return proc

    def get(self, number: Any) -> PtyProc:
        proc = self.procs.get(int(number)) if str(number).isdecimal() else None
        if proc is None:
            raise PtyError(ErrorKind.UNKNOWN_JOB, f"no interactive process {number!r} (it was "
                           "terminated, or a read already reported its exit)")
        return proc

    def on_exit(self, pid: int, status: int) -> bool:
        proc = self.by_pid.get(pid)
        if proc is None:
            return False
        proc.on_exit(status)
        return True

    def _exited(self, proc: PtyProc) -> None:
        self.by_pid.pop(proc.pid, None)
        ended = [p for p in self.procs.values() if p.state == "exited" and p is not proc]
        for old in ended[:max(0, len(ended) + 1 - KEPT_EXITED)]:
            self.procs.pop(old.id, None)

    def read(self, proc: PtyProc, answer: Callable[[dict[str, Any]], None], yield_s: float,
             max_bytes: int) -> None:
        def forget_at_end(result: dict[str, Any]) -> None:
            if result["exited"]:
                self.procs.pop(proc.id, None)
            answer(result)
        proc.read(forget_at_end, yield_s, max_bytes)

    def terminate(self, proc: PtyProc, answer: Callable[[dict[str, Any]], None]) -> None:
        """Hang the process and all it started up; kill what is left after the grace."""
        began = time.monotonic()
        killed: list[bool] = [False]
        for sig in (signal.SIGHUP, signal.SIGCONT):  # a stopped program takes the hang-up too
            proc.signal_all(sig)

        def poll() -> None:
            left = proc.members()
            waited = time.monotonic() - began
            if (not left and proc.exit_status is not None) or waited > HANGUP_GRACE_S + GIVE_UP_S:
                self.procs.pop(proc.id, None)
                self.by_pid.pop(proc.pid, None)
                result: dict[str, Any] = {"killed_tree": not left}
                if proc.exit_status is not None:
                    result["exit_code"] = os.waitstatus_to_exitcode(proc.exit_status)
                proc.close()
                answer(result)
                return
            if left and waited > HANGUP_GRACE_S and not killed[0]:
                killed[0] = True
                proc.signal_all(signal.SIGKILL)
            elif left and killed[0]:
                proc.signal_all(signal.SIGKILL)
            self.loop.call_later(_POLL_S, poll)

        self.loop.call_later(0, poll)

    def kill_all(self) -> None:
        """At the agent's end: every process and what it started, at once."""
        for proc in list(self.by_pid.values()):
            with contextlib.suppress(OSError):
                proc.signal_all(signal.SIGKILL)


class PtyOps:
    """The ``pty_*`` ops of ``server.Agent`` (module docstring)."""

    ptys: PtyTable
    _closing: bool

    def _answer(self, rid: Any, result: dict[str, Any]) -> None: ...
    def _fail(self, rid: Any, kind: str, message: str, **extra: Any) -> None: ...

    def _pty_op(self, rid: Any, request: dict[str, Any], run: Callable[[], None]) -> None:
        try:
            run()
        except PtyError as exc:
            self._fail(rid, exc.kind, str(exc))
        except (KeyError, TypeError, ValueError) as exc:
            self._fail(rid, ErrorKind.PROTOCOL, f"bad {request.get('op')} request: {exc!r}")

    def _op_pty_start(self, rid: Any, request: dict[str, Any]) -> None:
        if self._closing:
            self._fail(rid, ErrorKind.CLOSING, "the agent is shutting down")
            return

        def run() -> None:
            spec = request["spec"]
            _check_size(*size_of(spec))
            if not spec["argv"]:
                raise ValueError("argv is empty")
            env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
            try:
                proc = self.ptys.start(spec, env)
            except SpawnError as exc:
                self._fail(rid, ErrorKind.SPAWN, exc.strerror, errno=exc.errno, in_cwd=exc.in_cwd)
                return
            except OSError as exc:  # out of terminals, say
                self._fail(rid, ErrorKind.SPAWN, exc.strerror or str(exc),
                           errno=exc.errno or 0)
                return
            self._answer(rid, {"pty": proc.id, "pid": proc.pid})
        self._pty_op(rid, request, run)

    def _op_pty_write(self, rid: Any, request: dict[str, Any]) -> None:
        def run() -> None:
            proc = self.ptys.get(request["pty"])
            data = base64.b64decode(request.get("data_b64") or "")

            def done(result: dict[str, Any]) -> None:
                if "error" in result:
                    self._fail(rid, ErrorKind.PTY_EXITED, result["error"])
                else:
                    self._answer(rid, {"written": len(data)})
            proc.write(data, done)
        self._pty_op(rid, request, run)

    def _op_pty_read(self, rid: Any, request: dict[str, Any]) -> None:
        def run() -> None:
            proc = self.ptys.get(request["pty"])
            yield_s = max(0.0, float(request.get("yield_ms") or 0)) / 1000
            max_bytes = max(1, int(request.get("max_bytes") or 1 << 20))

            def done(result: dict[str, Any]) -> None:
                data = result.pop("data")
                result["data_b64"] = base64.b64encode(data).decode("ascii")
                self._answer(rid, result)
            self.ptys.read(proc, done, yield_s, max_bytes)
        self._pty_op(rid, request, run)

    def _op_pty_resize(self, rid: Any, request: dict[str, Any]) -> None:
        def run() -> None:
            rows, cols = int(request["rows"]), int(request["cols"])
            _check_size(rows, cols)
            self.ptys.get(request["pty"]).resize(rows, cols)
            self._answer(rid, {})
        self._pty_op(rid, request, run)

    def _op_pty_terminate(self, rid: Any, request: dict[str, Any]) -> None:
        def run() -> None:
            proc = self.ptys.get(request["pty"])
            self.ptys.terminate(proc, lambda result: self._answer(rid, result))
        self._pty_op(rid, request, run)

    def _op_pty_list(self, rid: Any, request: dict[str, Any]) -> None:
        self._answer(rid, {"ptys": [p.status() for p in self.ptys.procs.values()]})


def _check_size(rows: int, cols: int) -> None:
    if not (0 < rows < 1 << 16 and 0 < cols < 1 << 16):
        raise ValueError(f"rows and cols must be 1-65535, got {rows}x{cols}")

