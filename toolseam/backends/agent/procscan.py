"""Which processes belong to a job, read from ``/proc``.

Hand-written rather than psutil because this runs inside sandboxes that have only the standard
library. A job's processes are the descendants of its leader, plus every process that was
orphaned out of it (``setsid``, a double fork, ``set -m``): the agent is a child subreaper (or
pid 1 of its own namespace), so such orphans are re-parented to the agent, and each carries the
job's token in its environment, which tells the agent whose orphan it is.
"""

from __future__ import annotations

import ctypes
import os

_PR_SET_CHILD_SUBREAPER = 36
TOKEN_VAR = "TOOLSEAM_JOB_TOKEN"


_orphans_come_here = os.getpid() == 1  # pid 1 of a namespace adopts every orphan in it


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process instead of init."""
    global _orphans_come_here
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
        _orphans_come_here = True
    return _orphans_come_here


def orphans_come_here() -> bool:
    """True when orphans of this process's descendants are re-parented to it."""
    return _orphans_come_here


def _stat(pid: int) -> tuple[int, str] | None:
    """(ppid, state) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    return int(fields[1]), fields[0].decode()


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, state) for every visible process."""
    table: dict[int, tuple[int, str]] = {}
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


def has_token(pid: int) -> bool:
    """Whether the process carries any job token (an orphan that can be attributed)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return (TOKEN_VAR + "=").encode() in f.read()
    except OSError:
        return False


def job_members(leader: int | None, token: bytes, other_leaders: set[int],
                claim_anonymous: bool) -> set[int]:
    """Live processes of one job: the leader's subtree plus its orphans' subtrees.

    An orphan (a child of this agent that is no job's leader) belongs to the job whose token it
    carries; one with no readable token is claimed only when ``claim_anonymous`` (no other job is
    running, so it can only have come from this one).
    """
    me = os.getpid()
    table = process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    roots = [leader] if leader is not None and leader in table else []
    # Without subreaping, orphans go to init: every process must be asked for the token.
    candidates = children.get(me, []) if _orphans_come_here else list(table)
    for pid in candidates:
        if pid == leader or pid in other_leaders:
            continue
        adopted = table[pid][0] == me
        if carries_token(pid, token) or (claim_anonymous and adopted and not has_token(pid)):
            roots.append(pid)
    members: set[int] = set()
    while roots:
        pid = roots.pop()
        if pid in members or pid == me:
            continue
        if table[pid][1] not in ("Z", "X"):
            members.add(pid)
        roots.extend(children.get(pid, []))
    return members
