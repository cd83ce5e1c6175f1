"""Which processes belong to a job, read from ``/proc``.

Hand-written rather than psutil because this runs inside sandboxes that have only the standard
library. A job's processes are the descendants of its leader, plus every process that was
orphaned out of it (``setsid``, a double fork, ``set -m``): the agent is a child subreaper (or
pid 1 of its own namespace), so such orphans are re-parented to the agent.

Whose orphan is it? Decided by what the kernel keeps and a command cannot change: its start
time. An orphan belongs to the live jobs that had started when it did. With one such job, that
is the answer; with several running side by side, the job token in its environment picks one —
and an orphan with no token, or a token naming none of them (``env -i``, ``unset``, a forged
one), is claimed by every candidate, so it dies with the first of them to end: never later
than its own call. The token alone decides only where orphans go to init (no subreaper).
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import NamedTuple

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_DUMPABLE = 4
TOKEN_VAR = "TOOLSEAM_JOB_TOKEN"


_orphans_come_here = os.getpid() == 1  # pid 1 of a namespace adopts every orphan in it


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process instead of init."""
    global _orphans_come_here
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
        _orphans_come_here = True
    return _orphans_come_here


def guard_own_descriptors() -> bool:
    """Not dumpable: a command running as the same user cannot open this process's
    ``/proc/PID/fd/*`` — where a container's agent has its channel (stdin and stdout in copy
    mode) — nor read its memory or environment. Commands get the default back at ``execve``."""
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)


def orphans_come_here() -> bool:
    """True when orphans of this process's descendants are re-parented to it."""
    return _orphans_come_here


_TICKS = os.sysconf("SC_CLK_TCK")


def now_ticks() -> int:
    """The clock a process's start time is kept in (ticks since boot), rounded down."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _TICKS)


class JobMark(NamedTuple):
    """What identifies a live job: its leader, when it started, its token."""

    leader: int
    started: int  # ticks since boot, taken just before its leader was forked
    token: bytes  # b"TOOLSEAM_JOB_TOKEN=..."


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


def carries_token(pid: int, token: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return token in f.read().split(b"\0")
    except OSError:
        return False


def _is_ours(pid: int, started: int, job: JobMark, others: list[JobMark]) -> bool:
    """Whether an orphan that started at ``started`` belongs to ``job`` (module docstring)."""
    if started < job.started:
        return False  # older than the job
    rivals = [o for o in others if o.started <= started]
    if not rivals:
        return True  # the only job that was running when it started
    if carries_token(pid, job.token):
        return True
    return not any(carries_token(pid, o.token) for o in rivals)


def job_members(job: JobMark, leader_alive: bool, others: list[JobMark], excluded: set[int]
                ) -> set[int]:
    """Live processes of one job: the leader's subtree plus its orphans' subtrees.

    ``others`` are the other live jobs; ``excluded`` are the agent's own helpers (searches).
    """
    me = os.getpid()
    table = process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    leader = job.leader if leader_alive else None
    roots = [leader] if leader is not None and leader in table else []
    skip = excluded | {o.leader for o in others} | {job.leader}
    if _orphans_come_here:
        for pid in children.get(me, []):
            if pid not in skip and _is_ours(pid, table[pid][2], job, others):
                roots.append(pid)
    else:  # orphans went to init: every process must be asked for the token
        roots += [pid for pid in table if pid not in skip and carries_token(pid, job.token)]
    members: set[int] = set()
    while roots:
        pid = roots.pop()
        if pid in members or pid == me:
            continue
        if table[pid][1] not in ("Z", "X") and pid not in excluded:
            members.add(pid)
        roots.extend(children.get(pid, []))
    return members
