"""Which processes are under a job's root, read from ``/proc``.

Hand-written rather than psutil because this runs inside sandboxes that have only the standard
library. Whose process is it is decided by construction (``jobroot.py``): every job's leader is
the child of a root of its own, a child subreaper, so everything the job started — orphans
included (``setsid``, a double fork, ``set -m``, whatever its environment says) — stays among
that root's descendants. Nothing here guesses from start times or environments.

A process is named by its pid AND its start time (ticks since boot): pids are reused (32 768
of them here, a wrap in seconds under load), so a pid seen in one scan is signalled only while
the process behind it still started when it did.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_DUMPABLE = 4


_orphans_come_here = os.getpid() == 1  # pid 1 of a namespace adopts every orphan in it


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process instead of init: where a root dies
    (a command killed it), its job's processes stay in the agent's reach."""
    global _orphans_come_here
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
        _orphans_come_here = True
    return _orphans_come_here


def guard_own_descriptors() -> bool:
    """Not dumpable: a command running as the same user cannot open this process's
    ``/proc/PID/fd/*`` — where a container's agent has its channel (stdin and stdout in copy
    mode) — nor read its memory or environment. Commands get the default back at ``execve``;
    a job's root, forked from the agent and never exec'ing, stays not dumpable."""
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)


def orphans_come_here() -> bool:
    """True when orphans of this process's descendants are re-parented to it."""
    return _orphans_come_here


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time in ticks since boot) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    return int(fields[1]), fields[0].decode(), int(fields[19])


def process_table() -> dict[int, tuple[int, str, int]]:
    """pid -> (ppid, state, start ticks) for every visible process."""
    table: dict[int, tuple[int, str, int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            entry = _stat(int(name))
            if entry is not None:
                table[int(name)] = entry
    return table


def is_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    entry = _stat(pid)
    return entry is not None and entry[1] not in ("Z", "X")


def descendants(top: int, *, with_top: bool = False) -> dict[int, int]:
    """pid -> start ticks of every live process under ``top`` (a job's root, or a leader whose
    root is gone), ``top`` itself only ``with_top``."""
    table = process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, int] = {}
    todo = [top] if with_top and top in table else list(children.get(top, []))
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        if table[pid][1] not in ("Z", "X"):
            found[pid] = table[pid][2]
        todo.extend(children.get(pid, []))
    return found


def signal_if_same(pid: int, started: int, sig: int) -> bool:
    """Signal ``pid`` only while it is the process that started at ``started`` (not a later
    one given the same pid); True when it was signalled."""
    entry = _stat(pid)
    if entry is None or entry[2] != started:
        return False
    with contextlib.suppress(OSError):
        os.kill(pid, sig)
        return True
    return False
