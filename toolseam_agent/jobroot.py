"""Every job under a root of its own: whose process it is, known by construction.

A root is a fork of the agent that makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``)
and then starts one job's leader at a time as its child. Whatever the job leaves behind — a
``setsid`` daemon, a double fork, ``set -m``, ``env -i``, a forged environment — is re-parented
to the nearest living subreaper above it when its parent dies, and that is the job's root, never
the agent: **a job's processes are exactly its root's descendants.** Another call's leader, a
search the agent forked, a terminal, a detached job: none is under this root, so none can be
taken for this job's leftover, however the calls interleave (decision 345).

The root reaps the leader, tells the agent its status and whether anything is left under it
(one ``waitid``: no child at all means no process of the job is left), and if something is,
keeps reaping until nothing is and says so. A root with nothing under it whose job the agent
has finished waits for the next job: a fork (about a millisecond) is paid only when more jobs
run at once than ever before in the session. The root is forked on the set-id guard's thread,
so it and every command it starts carry the guard's filter and Landlock domain; it keeps none
of the agent's descriptors, dies with the agent (``PR_SET_PDEATHSIG``) and is not dumpable.

This module is the agent's side; the root's is ``rootproc.py``. Messages are ``marshal``-ed
tuples on a ``SOCK_SEQPACKET`` pair (one message a datagram; the
descriptors a job needs ride on its request). Agent to root: ``(kind, argv, cwd, env, actions,
options)`` with ``kind`` ``"spawn"`` (posix_spawn file actions, a passed descriptor written as
``-1 - its index``) or ``"raw"`` (``spawn_as``: stdin, stdout, stderr passed). Root to agent:
``("pid", pid)`` or ``("error", errno, strerror, in_cwd)``, then ``("exit", status, clean)``,
then ``("empty",)`` when it was not clean.
"""

from __future__ import annotations

import array
import contextlib
import errno
import functools
import marshal
import os
import select
import signal
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

from . import setid_guard
from .loop import Loop
from .procscan import process_table
from .reaper import Reaper
from .rootproc import SMALL, fork_root
from .spawning import SpawnError

_PF_EXITING = 0x4  # /proc/PID/stat's flags
_ANSWER_WAIT_S = 10.0  # a root that does not answer a start (stopped by a command) is given up


class Owner(Protocol):
    """What a root serves: a job or an interactive process."""

    def on_exit(self, status: int, clean: bool = False,
                usage: tuple[float, int] | None = None) -> None:
        """The leader was reaped; ``clean``: nothing else of it is left; ``usage``: its CPU
        seconds and peak RSS in KiB."""

    def on_root_lost(self) -> None:
        """The root died (a command killed it): only the leader's own tree is still known."""


class Root:
    """One root as the agent sees it."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock
        self.owner: Owner | None = None  # the job it serves, until that job is finished
        self.leader = 0
        self.reported = False  # the leader's exit was reported
        self.empty = True  # no process of a job is under it
        self.idle = False
        self.suspect = False  # another root died since it went idle: `kill -9 -1` may have hit it
        self.alive = True


class Roots:
    """The agent's roots: idle ones kept for the next job."""

    def __init__(self, loop: Loop, reaper: Reaper,
                 known: Callable[[], set[int]] = set) -> None:
        """``known``: the agent's children that are not roots (searches, leaders whose root
        was lost): never taken for a leader whose root died before naming it."""
        self._loop = loop
        self._reaper = reaper
        self._known = known
        self._idle: list[Root] = []
        self.by_pid: dict[int, Root] = {}

    def start(self, kind: str, argv: list[str], cwd: str, env: dict[str, str],
              actions: list[Any], options: dict[str, Any], fds: list[int], owner: Owner) -> Root:
        """Start a leader under an idle root (a new one when none is); the root, whose
        ``leader`` is its pid. Raises SpawnError."""
        message = marshal.dumps((kind, argv, cwd, env, actions, options))
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        since = _now_ticks()  # before the leader can exist
        while True:
            fresh = not self._idle
            root = self._idle.pop() if self._idle else self._new()
            root.idle = False
            if root.suspect and _dying(root.pid):  # killed while idle: never asked to start
                self._lost(root)
                continue
            root.suspect = False
            try:
                if len(message) > SMALL:  # a big command: its size, then pieces
                    root.sock.send(b"#%d" % len(message))
                    for at in range(0, len(message) - SMALL, SMALL):
                        root.sock.send(message[at:at + SMALL])
                    message = message[(len(message) - 1) // SMALL * SMALL:]
                root.sock.sendmsg([message], rights)  # the descriptors ride on the last one
                break
            except OSError as exc:  # it died while idle (`kill -9 -1`): nothing was started
                self._lost(root)
                if fresh:
                    raise SpawnError(exc, "") from None
        try:
            answered = select.poll()  # poll, not select: a root's descriptor may be past 1023
            answered.register(root.sock, select.POLLIN)
            if not answered.poll(_ANSWER_WAIT_S * 1000):
                raise TimeoutError("no answer in time")
            answer = marshal.loads(root.sock.recv(4096))
        except (OSError, EOFError, ValueError) as exc:  # the root died or hangs: never reused
            self._lost(root)
            with contextlib.suppress(ChildProcessError):  # its children are re-parented only
                os.waitpid(root.pid, 0)  # at the end of its exit, after its socket closed
            self._reaper.reaped(root.pid)
            leader = self._orphaned_leader(since, root.pid)
            if leader is None:
                raise SpawnError(OSError(errno.ESRCH, f"the job's root process failed: {exc}"),
                                 "") from None
            # the command killed its root at once (`kill -9 -1`): it runs, now the agent's
            # child, and is this job's leader with its root lost
            self._reaper.watch(leader)
            root.leader, root.owner, root.empty = leader, owner, False
            return root
        if answer[0] != "pid":
            self._make_idle(root)
            raise SpawnError(OSError(answer[1], answer[2], cwd if answer[3] else None), cwd)
        root.leader, root.owner, root.empty, root.reported = answer[1], owner, False, False
        return root

    def _orphaned_leader(self, since: int, dead_root: int) -> int | None:
        """The one child of the agent, started since ``since``, that is no root and nothing
        the agent knows: a leader whose root (``dead_root``) died before it answered (it may
        have ended already: a zombie's status is the job's too)."""
        me = os.getpid()
        known = set(self.by_pid) | self._known() | {dead_root}
        found = [pid for pid, (ppid, _, started) in process_table().items()
                 if ppid == me and pid not in known and started >= since]  # zombies too
        return found[0] if len(found) == 1 else None

    def release(self, root: Root) -> None:
        """Its owner is finished: the root serves the next job once nothing is under it."""
        root.owner = None
        self._make_idle(root)

    def busy(self) -> list[Root]:
        """Roots with processes of a job under them (running, or detached ones kept)."""
        return [root for root in self.by_pid.values() if not root.empty]

    def close(self) -> None:
        """The agent is ending: idle roots exit at their socket's end, busy ones with it."""
        for root in list(self.by_pid.values()):
            self._loop.remove_reader(root.sock.fileno())
            root.sock.close()
        self.by_pid.clear()
        self._idle.clear()

    def _new(self) -> Root:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # a bare descriptor: no object of the agent's that the fork copies may close it there
        fd = theirs.detach()
        try:  # forked on the guard's thread: the root carries its filter and domain
            pid = setid_guard.start_command(functools.partial(fork_root, fd, os.getpid()))
        except OSError as exc:
            ours.close()
            raise SpawnError(exc, "") from None
        finally:
            os.close(fd)
        root = self.by_pid[pid] = Root(pid, ours)
        self._loop.add_reader(ours.fileno(), functools.partial(self._on_message, root))
        return root

    def _make_idle(self, root: Root) -> None:
        if root.alive and root.empty and root.owner is None and not root.idle:
            root.idle = True
            self._idle.append(root)

    def _on_message(self, root: Root) -> None:
        while root.alive:
            try:
                data = root.sock.recv(64, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._lost(root)
                return
            message = marshal.loads(data)
            if message[0] == "exit":
                root.empty, root.reported = bool(message[2]), True
                if root.owner is not None:
                    root.owner.on_exit(message[1], bool(message[2]), (message[3], message[4]))
            elif message[0] == "empty":
                root.empty = True
            self._make_idle(root)

    def _lost(self, root: Root) -> None:
        """The root died (or stopped answering): its leader, re-parented to the agent, is
        reaped by the agent's reaper from now on. What killed it may have killed the idle
        ones too (``kill -9 -1``), whose sockets close only once their exit has torn a copy
        of the agent down: each is checked before its next job."""
        for idle in self._idle:
            idle.suspect = True
        root.alive = False
        if self.by_pid.pop(root.pid, None) is not None:
            self._loop.remove_reader(root.sock.fileno())
        root.sock.close()
        if root in self._idle:
            self._idle.remove(root)
        with contextlib.suppress(OSError):
            os.kill(root.pid, signal.SIGKILL)  # one that stopped answering
        self._reaper.watch(root.pid)
        if root.owner is not None:
            if not root.reported:  # the leader is (or is about to be) the agent's child
                self._reaper.watch(root.leader)
            root.owner.on_root_lost()
        self._loop.call_later(0.05, self._reaper.reap_all)


_TICKS = os.sysconf("SC_CLK_TCK")


def _now_ticks() -> int:
    """The clock /proc keeps start times in (ticks since boot), rounded down."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _TICKS)


def _dying(pid: int) -> bool:
    """Whether a root is gone, a zombie, exiting (``PF_EXITING``), or has a SIGKILL pending."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open(f"/proc/{pid}/status", "rb") as f:
            status = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
    except OSError:
        return True
    if fields[0] in (b"Z", b"X") or int(fields[6]) & _PF_EXITING:
        return True
    pending = int(status.get(b"SigPnd", b"0"), 16) | int(status.get(b"ShdPnd", b"0"), 16)
    return bool(pending >> (signal.SIGKILL - 1) & 1)


def passed(actions: list[Any]) -> tuple[list[Any], list[int]]:
    """Spawn actions with each agent descriptor they duplicate written as ``-1 - index`` into
    the descriptors to pass (a descriptor 0-2 is the child's own, as in ``2>&1``)."""
    fds: list[int] = []
    out: list[Any] = []
    for action in actions:
        if action[0] == os.POSIX_SPAWN_DUP2 and action[1] > 2:
            if action[1] not in fds:
                fds.append(action[1])
            action = (action[0], -1 - fds.index(action[1]), *action[2:])
        out.append(tuple(action))
    return out, fds
