"""One command as a job: spawn, capture, deadline, and the whole-job kill.

A job lives until its leader has exited AND its output pipes are closed — or until it is killed.
Killing is TERM to every process of the job, a grace window (2000 ms), then KILL to whatever is
left, re-reading the process table every 10 ms so processes forked during the grace are caught
too, and returning as soon as nothing is left. The set of processes is taken BEFORE any signal
is sent (after the leader dies its children are re-parented and the tree is gone).

When the leader exits on its own, whatever it left behind — a ``cmd &`` holding the output pipe,
a ``setsid`` daemon — is killed the same way after a short drain window: a call owns every
process it started, and a command that must outlive its call belongs in a detached job.
Every process of a job is under its root (``jobroot.py``), so "every process of the job" is
that root's descendants: no other job's process is ever among them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from . import spawn_as
from .capture import OutputCapture
from .jobroot import Roots, passed
from .loop import Loop, Timer
from .procscan import descendants, signal_if_same
from .spawning import SpawnError, spawn, spawn_with
from .wire import output_event

__all__ = ["HELD_WRITERS", "Job", "SpawnError", "spawn", "spawn_with"]

KILL_GRACE_S = 2.0
KILL_POLL_S = 0.01
DRAIN_S = 0.2  # how long output pipes may stay open after the leader exited
KILL_GIVE_UP_S = 2.0  # after SIGKILL: a process still there is unkillable (D state)

# emit(event) sends an event line to the host
Emit = Callable[[Mapping[str, Any]], None]


# The pipes' write ends the agent holds for running jobs (``Job._writers``): a forked search
# child closes them first thing, or a job ending during a search would wait for its EOF.
HELD_WRITERS: set[int] = set()


class Job:
    def __init__(self, loop: Loop, job_id: str, spec: dict[str, Any], env: dict[str, str],
                 roots: Roots, emit: Emit, on_done: Callable[[Job], None]) -> None:
        """Spawn the job's command under a root of its own (``jobroot.py``).

        Little comes before the spawn: this is the start of every bash call's critical path."""
        self.argv = argv = [str(a) for a in spec["argv"]]
        cwd = spec.get("cwd") or "/"
        self.loop = loop
        # The pipes are watched BEFORE the spawn: epoll then reports them readable in the order
        # the command wrote them (one already readable when registered would go in registration
        # order, and a fast command's stderr could come after its later stdout).
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self._pipes: dict[int, str] = {out_r: "stdout", err_r: "stderr"}
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
            loop.add_reader(fd, functools.partial(self._on_readable, fd))
        self.exit_status: int | None = None
        self._clean = False
        self._roots = roots
        try:
            if spec.get("stdin_file") or spec.get("user") is not None:  # spawn_as.py
                try:
                    stdin, options, env = spawn_as.prepare(env, spec)
                except OSError as exc:
                    raise SpawnError(exc, cwd) from None
                try:
                    self.root = roots.start("raw", argv, cwd, env, [], options,
                                            [stdin, out_w, err_w], self)
                finally:
                    os.close(stdin)
            else:
                actions, fds = passed(
                    [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                     (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)])
                self.root = roots.start("spawn", argv, cwd, env, actions, {}, fds, self)
        except BaseException:
            for fd in (out_r, err_r):
                loop.remove_reader(fd)
            for fd in (out_r, err_r, out_w, err_w):
                os.close(fd)
            raise
        self.pid = self.root.leader
        self._root_lost = not self.root.alive  # killed by the command as it started
        # The agent holds the pipes' write ends until the root reports the leader's exit: the
        # command's end is ONE wakeup (that report), not one per pipe's EOF and one for the
        # exit — those came in two or three wakeups, each paying the loop on cold caches.
        self._writers: tuple[int, ...] = (out_w, err_w)
        HELD_WRITERS.update(self._writers)
        self._release_due = False
        self._t0 = time.monotonic()
        self.started = time.time()
        # The OOM counter's "before" is read just after the spawn: no command can have run
        # the cgroup out of memory in the microseconds since, and it is off the critical path.
        self._oom_before = oom_counters()
        self.id = job_id
        self.emit = emit
        self._on_done = on_done
        self.stream = bool(spec.get("stream", False))
        # a raw exec may ask that what the command leaves running outlive it (pydantic-ai's
        # contract): background jobs when it ends, and at its timeout or cancellation what
        # moved into a session of its own (setsid); the session's close still ends them all
        self.keep_detached = bool(spec.get("keep_detached", False))
        self.detached_kept = False
        self.grace_s = float(spec.get("grace_ms", KILL_GRACE_S * 1000)) / 1000
        self._output_limit = int(spec.get("output_limit") or 1 << 20)
        self.capture: OutputCapture | None = None  # made at the first byte: most commands write none
        self.state = "running"  # running -> killing -> done
        self.timed_out = False
        self.killed = False
        self.killed_tree: bool | None = None
        self.kill_reason = ""
        self.usage: tuple[float, int] | None = None  # on_exit's: CPU seconds, peak RSS KiB
        self.leftovers = 0
        self.ended: float | None = None
        self.waiters: list[tuple[Callable[[dict[str, Any]], None], Timer | None]] = []
        self._drain_timer: Timer | None = None
        self._deadlines = _deadlines(loop)
        deadline_ms = spec.get("deadline_ms")
        if deadline_ms is not None:
            self._deadlines.add(self, self._t0 + float(deadline_ms) / 1000)
        self._signalled: set[tuple[int, int]] = set()
        self._kill_started = 0.0
        self._kill_sent: float | None = None

    # --- output -------------------------------------------------------------------------
    def _on_readable(self, fd: int) -> None:
        if self._read(fd) is None:
            self._check_finished()

    def _read(self, fd: int) -> bool | None:
        """One read of a pipe: True when it gave data, False when it had none now (or is not
        this job's), None when it ended (it is closed now)."""
        name = self._pipes.get(fd)
        if name is None:
            return False
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if data:
            capture = self.capture
            if capture is None:
                capture = self.capture = OutputCapture(self._output_limit)
            capture.add(name, data)
            if self.stream:
                text = capture.live_text(name, data)
                if text:
                    self.emit(output_event(self.id, name, text))
            return True
        self._close_pipe(fd)
        return None

    def _after_exit(self) -> None:
        self._release_writers()
        self._check_finished()

    def _release_writers(self) -> None:
        """Close the write ends this agent held; then each pipe ends at once unless a process
        the command left behind holds it — read what is there (at most 1 MiB a pipe here: a
        writer that goes on is read by the loop)."""
        writers, self._writers = self._writers, ()
        for fd in writers:
            HELD_WRITERS.discard(fd)
            os.close(fd)
        for fd in list(self._pipes):
            for _ in range(16):
                if not self._read(fd):
                    break

    def _close_pipe(self, fd: int) -> None:
        name = self._pipes.pop(fd)
        self.loop.remove_reader(fd)
        os.close(fd)
        if self.stream and self.capture is not None:
            rest = self.capture.live_text(name, b"", final=True)
            if rest:
                self.emit(output_event(self.id, name, rest))

    def _drain_pipes(self) -> None:
        """Read what is buffered in the pipes without waiting for writers that are gone."""
        for fd in list(self._pipes):
            while fd in self._pipes:
                self._on_readable(fd)
                if fd in self._pipes and not _readable_now(fd):
                    self._close_pipe(fd)

    # --- lifecycle ----------------------------------------------------------------------
    def on_exit(self, status: int, clean: bool = False,
                usage: tuple[float, int] | None = None) -> None:
        """The leader was reaped (by its root; by the agent when the root was lost).
        ``clean``: nothing else of the job was left under its root. ``usage``: the leader's
        ``wait4`` figures, CPU seconds and peak RSS in KiB (itself and what it waited for)."""
        self.exit_status = status
        self._clean = clean
        self.usage = usage
        self._check_finished()

    def on_root_lost(self) -> None:
        """A command killed this job's root: from now on the leader is the agent's child (its
        exit comes through ``on_exit``), and only the leader's own tree is known to be the
        job's — what had been re-parented to the root is the agent's, ended at its close."""
        self._root_lost = True

    def _check_finished(self) -> None:
        if self.state != "running" or self.exit_status is None:
            return
        if self._writers:
            # At the end of this loop pass: output that came in the same wakeup as the exit is
            # read first, in the order it came (epoll's), so stdout and stderr keep their order.
            if not self._release_due:
                self._release_due = True
                self.loop.call_soon(self._after_exit)
            return
        if self._pipes:
            if self._drain_timer is None:
                self._drain_timer = self.loop.call_later(DRAIN_S, lambda: self.kill("leftover"))
            return
        if self._clean:
            self._finish(True)  # nothing under the root: the cheap common case, no /proc scan
        elif self._members():
            self.kill("leftover")
        else:
            self._finish(True)

    def _on_deadline(self) -> None:
        if self.state == "running":
            self.timed_out = True
            self.kill("timeout")

    def _members(self) -> dict[int, int]:
        """pid -> start ticks of the job's live processes: everything under its root."""
        if self._root_lost:
            found = descendants(self.pid, with_top=True) if self.exit_status is None else {}
        else:
            found = descendants(self.root.pid)
        if self.keep_detached:
            kept = [pid for pid in found if _session_of(pid) not in (self.pid, None)]
            if kept:
                self.detached_kept = True
            for pid in kept:
                del found[pid]
        return found

    def kill(self, reason: str) -> None:
        """Start the whole-job kill; waiters are answered when nothing of the job is left."""
        if self.state != "running":
            return
        if reason == "leftover" and self.keep_detached:
            self.detached_kept = True  # background work outlives the command, as in a shell
            self._finish(True)
            return
        self.state = "killing"
        self.kill_reason = reason
        self.killed = reason in ("kill", "shutdown", "stopped")
        members = self._members()  # snapshot BEFORE the first signal
        if reason == "leftover":
            self.leftovers = len(members)
        self._kill_started = time.monotonic()
        self._signal(members, signal.SIGTERM)
        self.loop.call_later(0, self._poll_kill)

    def _signal(self, members: dict[int, int], sig: signal.Signals) -> None:
        if sig == signal.SIGTERM and self.exit_status is None:
            # the group too (members forked between scans), only while the leader is unreaped:
            # after, its pid may name another job's group
            with contextlib.suppress(OSError):
                os.killpg(self.pid, sig)
        for pid, started in members.items():
            signal_if_same(pid, started, sig)
            self._signalled.add((pid, started))

    def _poll_kill(self) -> None:
        current = self._members()
        now = time.monotonic()
        if not current:
            if self.exit_status is not None or self._root_lost or now - self._kill_started \
                    >= self.grace_s + KILL_GIVE_UP_S:
                self._finish(True)
                return
            # the leader is gone; its status is on its way from the root
        elif self._kill_sent is None:
            self._signal({p: t for p, t in current.items() if (p, t) not in self._signalled},
                         signal.SIGTERM)
            if now - self._kill_started >= self.grace_s:
                self._signal(current, signal.SIGKILL)
                self._kill_sent = now
        elif now - self._kill_sent >= KILL_GIVE_UP_S:
            self._finish(False)
            return
        else:
            self._signal(current, signal.SIGKILL)
        self.loop.call_later(KILL_POLL_S, self._poll_kill)

    def _finish(self, tree_gone: bool) -> None:
        self.state = "done"
        self.ended = time.monotonic()
        if self.kill_reason:
            self.killed_tree = tree_gone
        if self._writers:  # killed before its leader was reaped
            self._release_writers()
        self._deadlines.discard(self)
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        self._drain_pipes()
        self._roots.release(self.root)
        self._on_done(self)
        status = self.status()
        for answer, timer in self.waiters:
            if timer is not None:
                timer.cancel()
            answer(status)
        self.waiters.clear()

    def add_waiter(self, answer: Callable[[dict[str, Any]], None], wait_s: float | None) -> None:
        """Answer when the job is done, or with a running status after ``wait_s``."""
        if self.state == "done":
            answer(self.status())
            return
        entry: list[Any] = [answer, None]

        def on_timeout() -> None:
            self.waiters[:] = [w for w in self.waiters if w[0] is not answer]
            answer(self.status())

        if wait_s is not None:
            entry[1] = self.loop.call_later(wait_s, on_timeout)
        self.waiters.append((entry[0], entry[1]))

    def status(self) -> dict[str, Any]:
        """Where the job stands, each field at its ``wire.STATUS_DEFAULTS`` value left out."""
        end = self.ended if self.ended is not None else time.monotonic()
        result: dict[str, Any] = {
            "job": self.id, "pid": self.pid, "state": "exited" if self.state == "done" else "running",
            "started": self.started, "duration_ms": int((end - self._t0) * 1000)}
        if self.exit_status is not None:
            result["exit_code"] = os.waitstatus_to_exitcode(self.exit_status)
        if self.timed_out:
            result["timed_out"] = True
        if self.killed:
            result["killed"] = True
        if self.killed_tree is not None:
            result["killed_tree"] = self.killed_tree
        if self.leftovers:
            result["leftovers_killed"] = self.leftovers
        if self.state == "done" and self._oom_killed():
            result["oom_killed"] = True
        if self.kill_reason == "stopped":
            result["sandbox_stopping"] = True
        if self.usage is not None:  # the leader and every descendant it waited for
            result["cpu_seconds"] = round(self.usage[0], 6)
            result["memory_peak_bytes"] = self.usage[1] * 1024  # Linux: KiB
        if self.capture is not None:
            self.capture.add_snapshot(result)
        return result

    def _oom_killed(self) -> bool:
        before = self._oom_before
        if before is None:
            return False
        now = oom_counters()
        # the same bytes: nothing was killed (the common case needs no parsing)
        return now is not None and now != before and _oom_kill_count(now) > _oom_kill_count(before)


class _Deadlines:
    """Every running job's deadline on ONE loop timer, set for the earliest of them.

    Not a timer per job: a job almost always ends long before its deadline, and the loop drops
    a cancelled timer only once it reaches the top of its heap — behind one long job's live
    timer (a dev server under a ten-minute timeout), every later call's dead timer stayed until
    that deadline passed. Here a job is a dict entry while it runs; the one timer moves only to
    an earlier deadline, so the loop holds at most one dead timer however many jobs come.
    """

    def __init__(self, loop: Loop) -> None:
        self._loop = loop
        self._due: dict[Job, float] = {}  # running job -> its deadline (time.monotonic())
        self._timer: Timer | None = None
        self._at = float("inf")  # when the timer fires

    def add(self, job: Job, when: float) -> None:
        self._due[job] = when
        if when < self._at:
            self._schedule(when)

    def discard(self, job: Job) -> None:
        self._due.pop(job, None)

    def _schedule(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = when
        self._timer = self._loop.call_later(max(0.0, when - time.monotonic()), self._fire)

    def _fire(self) -> None:
        self._timer, self._at = None, float("inf")
        now = time.monotonic()
        for job in [job for job, when in self._due.items() if when <= now]:
            del self._due[job]
            job._on_deadline()
        if self._due:
            self._schedule(min(self._due.values()))


_deadlines_of: weakref.WeakKeyDictionary[Loop, _Deadlines] = weakref.WeakKeyDictionary()


def _deadlines(loop: Loop) -> _Deadlines:
    deadlines = _deadlines_of.get(loop)
    if deadlines is None:
        deadlines = _deadlines_of[loop] = _Deadlines(loop)
    return deadlines


_OOM_COUNTERS = (("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"),  # cgroup v1
                 ("/sys/fs/cgroup/memory.events", "oom_kill"))  # cgroup v2


_oom_fd: int | None = None
_oom_key = b""


def oom_counters() -> bytes | None:
    """The raw counter file of the OOM killer for this (container's) cgroup; how many processes
    it has killed is ``_oom_kill_count`` of it.

    The engines' OOMKilled flag speaks of the whole container (and podman 4.3 reports it false
    even then); a command killed for memory inside a live sandbox shows only here. The counter
    file stays open and is re-read from offset 0: twice per command, an open is worth saving,
    and so is parsing — a job compares the bytes and parses only when they changed.
    """
    global _oom_fd, _oom_key
    if _oom_fd is None:
        for path, key in _OOM_COUNTERS:
            try:
                _oom_fd, _oom_key = os.open(path, os.O_RDONLY | os.O_CLOEXEC), key.encode()
                break
            except OSError:
                continue
        else:
            _oom_fd = -1
    if _oom_fd < 0:
        return None
    try:
        return os.pread(_oom_fd, 4096, 0)
    except OSError:
        return None


def _oom_kill_count(counters: bytes) -> int:
    for line in counters.splitlines():
        name, _, value = line.partition(b" ")
        if name == _oom_key:
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


def _readable_now(fd: int) -> bool:
    ready, _, _ = select.select([fd], [], [], 0)
    return bool(ready)


def _session_of(pid: int) -> int | None:
    """The session id of ``pid``; None once it is gone. A job's leader starts a session of
    its own (``setsid``), so a member in another one moved there itself."""
    try:
        return os.getsid(pid)
    except OSError:
        return None
