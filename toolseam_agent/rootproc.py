"""The root's side of a job root (``jobroot.py`` is the agent's): a fork of the agent that
makes itself a child subreaper, then starts one job's leader at a time, reaps it, and tells
the agent its status and whether anything of the job is left under it.

It keeps none of the agent's descriptors, dies with the agent (``PR_SET_PDEATHSIG``), is not
dumpable (inherited), and runs on what was the set-id guard's thread, so every command it
starts carries the guard's filter and Landlock domain. Messages: ``jobroot.py``'s docstring.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import marshal
import os
import signal
import socket
from typing import Any

from . import setid_guard, spawn_as, spawning
from .spawning import SpawnError

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
SMALL = 1 << 16  # a bigger request goes as its size first ("#N"), then in pieces of this size
_MAX_FDS = 8
_libc = ctypes.CDLL(None, use_errno=True)
ROOT_NAME = "toolseam-job-root"  # a root's command line


def fork_root(fd: int, agent: int) -> int:
    pid = os.fork()
    if pid == 0:  # the root: serve jobs, never return into the agent
        status = 0
        try:
            _become_root(fd, agent)
            sock = socket.socket(fileno=fd)
            while _serve_one(sock):
                pass
        except BaseException:  # noqa: BLE001 - the root must exit whatever happened
            status = 1
        os._exit(status)
    return pid


def _become_root(fd: int, agent: int) -> None:
    signal.set_wakeup_fd(-1)  # the agent's wakeup pipe and handlers are not the root's
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    setid_guard.forked_from_guard()
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != agent:  # the agent died before the line above
        os._exit(0)
    _rename()
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):  # never the agent's channel (a container agent's stdio)
        os.dup2(null, target, inheritable=False)
    # nothing of the agent's: its channel, epoll, other jobs' pipes (which must end with them)
    os.closerange(3, fd)
    os.closerange(fd + 1, os.sysconf("SC_OPEN_MAX"))


def _rename() -> None:
    """Its command line says what it is (``ps``, and whoever counts agents by theirs): the
    argument area is overwritten through ``/proc/self/mem``, which a process may always do
    to itself; where it cannot, the root keeps the agent's."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
        name = ROOT_NAME.encode()[: end - start - 1]
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(name + b"\0" * (end - start - len(name)))
    except (OSError, ValueError, IndexError):
        pass


def _receive(sock: socket.socket) -> tuple[bytes, list[int]]:
    data, ancdata, _, _ = sock.recvmsg(SMALL, socket.CMSG_SPACE(_MAX_FDS * 4))
    if data[:1] == b"#":
        # a big command comes in pieces of SMALL: one datagram cannot be larger than the
        # socket's send buffer (about 200 KiB), and a command line may be megabytes
        size, pieces = int(data[1:]), []
        while size > 0:
            data, ancdata, _, _ = sock.recvmsg(SMALL, socket.CMSG_SPACE(_MAX_FDS * 4))
            pieces.append(data)
            size -= len(data)
        data = b"".join(pieces)
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    for fd in fds:  # as the agent's are: a command gets them only where an action puts them
        os.set_inheritable(fd, False)
    return data, list(fds)


def _serve_one(sock: socket.socket) -> bool:
    """One job: start its leader, reap it, report; then wait until nothing of it is left."""
    data, fds = _receive(sock)
    if not data:
        return False  # the agent closed: no job is under this root
    kind, argv, cwd, env, actions, options = marshal.loads(data)
    try:
        if kind == "raw":
            leader = spawn_as.start_prepared(argv, cwd, env, fds[0], (fds[1], fds[2]), options)
        else:
            leader = spawning.spawn_with(argv, cwd, env, [
                (a[0], fds[-1 - a[1]], *a[2:]) if a[0] == os.POSIX_SPAWN_DUP2 and a[1] < 0
                else tuple(a) for a in actions])
    except SpawnError as exc:
        answer: tuple[Any, ...] = ("error", exc.errno, exc.strerror, exc.in_cwd)
    except OSError as exc:
        answer = ("error", exc.errno or 0, exc.strerror or str(exc),
                  bool(cwd) and exc.filename == cwd)
    else:
        answer = ("pid", leader)
    finally:
        for fd in fds:
            os.close(fd)
    sock.send(marshal.dumps(answer))
    if answer[0] != "pid":
        return True
    while True:  # orphans of the job that end first are reaped on the way
        # Seen first, reaped after (WNOWAIT): a command that kills its root as it ends (`kill
        # -9 -1`, whose SIGKILL is pending by the time the leader's exit is seen) kills it on
        # this call's return, the leader still unreaped, so the agent inherits it and reaps it
        # with its status. A reap here would take the status into a root about to die, and
        # the job would wait for a status that never comes (until its deadline).
        seen = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        assert seen is not None  # None only with WNOHANG
        pid, status, used = os.wait4(seen.si_pid, 0)  # wait4: the leader's figures
        if pid == leader:
            break
    clean = not _has_children()
    sock.send(marshal.dumps(("exit", status, clean, used.ru_utime + used.ru_stime,
                             used.ru_maxrss)))
    if not clean:
        with contextlib.suppress(ChildProcessError):
            while True:
                os.waitpid(-1, 0)
        sock.send(marshal.dumps(("empty",)))
    return True


def _has_children() -> bool:
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True
