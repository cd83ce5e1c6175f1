"""How the agent learns that a child exited, and reaps it.

Where the kernel has pidfds (Linux 5.3, and an engine's seccomp profile that lets
``pidfd_open`` through), each command's leader and each search child is watched by a pidfd on
the agent's loop, and SIGCHLD keeps its default disposition, which discards it. Otherwise a
SIGCHLD handler writes to the loop's wakeup pipe, as before.

Why not always the signal: measured (``benchmarks/agent_floor.py``), catching SIGCHLD cost
the agent 40-45 µs of CPU and 30-35 µs of latency per command — the signal's delivery, the
interpreter running its handler, the wakeup pipe's write and read, and one more loop pass,
mostly on caches gone cold while the command ran. A pidfd is one more descriptor in the same
``epoll``, and with the pipes' write ends held by the agent until the leader is reaped
(``jobs.py``) it is the one event at a command's end.

A readable pidfd calls ``reap_all`` (``waitpid(-1)``), which hands each status to the owner's
``on_exit`` — a leader's job — and closes that pid's pidfd: a pidfd left open on a reaped
child stays readable and would spin the loop. A job that reaps its own leader (its pipes
closed first: a raw exec, or SIGCHLD mode) says so through ``reaped``, which closes the
pidfd the same way. In pidfd mode nothing wakes the agent
for an orphan that exits (a command's ``cmd &`` left behind, re-parented to the agent); its
zombie is reaped at the next pass — when a watched child exits, when a job ends with children
left, and after a kill — and a zombie costs a process-table slot, nothing else.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from .loop import Loop

# "sigchld" makes the agent take the signal even where pidfds work (the fallback, tested on
# kernels that have pidfds; a way out should a kernel's pidfds misbehave).
MODE_VAR = "TOOLSEAM_AGENT_REAPER"


def _pidfds_work() -> bool:
    """Whether ``pidfd_open`` works here (kernel and seccomp profile)."""
    if os.environ.get(MODE_VAR) == "sigchld":
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


class Reaper:
    """Watches children and reaps them; ``on_exit(pid, status)`` is told of each one reaped."""

    def __init__(self, loop: Loop, on_exit: Callable[[int, int], None], *,
                 signals: bool = True) -> None:
        """``signals``: take the process's signal wakeup pipe (and, without pidfds, SIGCHLD):
        the agent's main thread. Without it, only watched children are reaped by pidfd."""
        self._loop = loop
        self._on_exit = on_exit
        self.last_usage: Any = None  # resource.struct_rusage of the child reaped last
        self._pidfds: dict[int, int] = {}
        self.by_pidfd = _pidfds_work()
        if signals:
            self._take_signals()

    def _take_signals(self) -> None:
        # The wakeup pipe stays in both modes: SIGTERM/SIGHUP/SIGINT handlers run promptly
        # while the loop sleeps. In pidfd mode no SIGCHLD is caught, so it stays quiet.
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        self._wake_r = wake_r
        self._loop.add_reader(wake_r, self._on_wakeup)
        if not self.by_pidfd:
            signal.signal(signal.SIGCHLD, lambda *_: None)

    @property
    def mode(self) -> str:
        return "pidfd" if self.by_pidfd else "sigchld"

    def watch(self, pid: int) -> bool:
        """Be told when ``pid`` (a child just started) exits: True when a pidfd watches it.
        False in SIGCHLD mode, and when no pidfd could be had (out of descriptors): then the
        pipes' EOF and the reaps at a job's end and after a kill find its exit, as they do in
        SIGCHLD mode without the signal."""
        if not self.by_pidfd:
            return False
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return False
        self._pidfds[pid] = fd
        self._loop.add_reader(fd, self.reap_all)
        return True

    def reaped(self, pid: int) -> None:
        """``pid`` was reaped outside ``reap_all`` (or will never be watched again)."""
        fd = self._pidfds.pop(pid, None)
        if fd is not None:
            self._loop.remove_reader(fd)
            os.close(fd)

    def reap_all(self) -> None:
        """Reap every child that has exited, telling ``on_exit`` of each."""
        while True:
            try:  # wait4: the same reap, with the child's resource usage (a job's accounting)
                pid, status, self.last_usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.reaped(pid)
            self._on_exit(pid, status)

    def _on_wakeup(self) -> None:
        try:  # one byte per signal: a read of 4 KiB drains it unless thousands are pending
            while len(os.read(self._wake_r, 4096)) == 4096:
                pass
        except BlockingIOError:
            pass
        if not self.by_pidfd:
            self.reap_all()
