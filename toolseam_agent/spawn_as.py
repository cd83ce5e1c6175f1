"""Starting a job with stdin from a file and/or as another user: the raw exec API's jobs.

The bash tool's jobs take ``spawning.spawn``'s posix_spawn fast path (stdin ``/dev/null``, the
agent's own user). A raw exec may bring stdin — the host writes it to a file in the sandbox
first, the job reads it from there, and the file is unlinked as soon as the job holds it open,
so a 50 MiB stdin never sits in the agent's memory or in a pipe the agent must feed — and a
user. posix_spawn cannot change user, so these jobs go through ``subprocess``'s fork_exec (C,
safe in the agent's threaded process), which does setgroups/setgid/setuid in the child.

A user switch needs root with CAP_SETUID and CAP_SETGID. Containers drop every capability, so
there the switch is refused up front with a message starting ``user-unsupported:``; a name
the sandbox's passwd does not know is refused with ``user-unknown:``. Both travel as spawn
errors; the host's raw API turns the prefixes into its own exception types.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import shutil
from typing import Any

from .setid_guard import start_command

USER_UNKNOWN = "user-unknown"
USER_UNSUPPORTED = "user-unsupported"
_CAP_SETGID, _CAP_SETUID = 6, 7
_USER_VARS = ("HOME", "USER", "LOGNAME")


def can_switch_user() -> bool:
    """Root with CAP_SETUID and CAP_SETGID in its effective set."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    caps = int(line.split()[1], 16)
                    return bool(caps >> _CAP_SETUID & 1 and caps >> _CAP_SETGID & 1)
    except (OSError, ValueError):
        return False
    return False


def resolve_user(user: str) -> tuple[int, int, list[int], dict[str, str]] | None:
    """(uid, gid, supplementary groups, HOME/USER/LOGNAME) for ``user``, a name or a uid as
    the sandbox's own passwd knows it; None when it is the agent's own user (no switch).
    A uid with no passwd entry runs with gid = uid and no groups, as the engines do."""
    target: tuple[int, int, list[int], dict[str, str]]
    try:
        entry = pwd.getpwuid(int(user)) if user.isdecimal() else pwd.getpwnam(user)
    except KeyError:
        if not user.isdecimal():
            raise OSError(errno.ENOENT, f"{USER_UNKNOWN}: no user {user!r} in the sandbox "
                          "(not in its /etc/passwd)") from None
        uid = int(user)
        target = (uid, uid, [], {"HOME": "/", "USER": user, "LOGNAME": user})
    else:
        groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
        names = {"HOME": entry.pw_dir or "/", "USER": entry.pw_name, "LOGNAME": entry.pw_name}
        target = (entry.pw_uid, entry.pw_gid, groups, names)
    if target[0] == os.geteuid() and target[1] == os.getegid():
        return None
    if not can_switch_user():
        raise OSError(errno.EPERM, f"{USER_UNSUPPORTED}: cannot run as user {user!r}: the "
                      f"sandbox's agent runs as uid {os.geteuid()} without CAP_SETUID and "
                      "CAP_SETGID (a container sandbox drops every capability)")
    return target


def prepare(env: dict[str, str], spec: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    """In the agent: stdin (``spec["stdin_file"]``, unlinked once open, or /dev/null), the user
    switch as ``Popen`` options, and the environment with the user's HOME/USER/LOGNAME.

    Raises OSError (an unknown user, a user switch this sandbox cannot make).
    """
    stdin_file = spec.get("stdin_file")
    try:
        target = resolve_user(str(spec["user"])) if spec.get("user") is not None else None
        stdin = os.open(stdin_file or os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    finally:
        if stdin_file:  # the job holds it open now (or failed): nobody else may read it
            with contextlib.suppress(OSError):
                os.unlink(stdin_file)
    options: dict[str, Any] = {}
    if target is not None:
        uid, gid, groups, names = target
        given = set(spec.get("env_given") or ())  # variables the caller set win over passwd
        env = {**env, **{k: v for k, v in names.items() if k not in given}}
        options = {"user": uid, "group": gid, "extra_groups": groups}
    return stdin, options, env


def start_prepared(argv: list[str], cwd: str, env: dict[str, str], stdin: int,
                   writers: tuple[int, int], options: dict[str, Any]) -> int:
    """In the job's root: a session leader with ``prepare``'s stdin, user and environment,
    stdout/stderr on ``writers``. Raises OSError; ``filename == cwd`` when the working
    directory is what failed."""
    import subprocess  # only raw execs pay for the import

    program = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH")) or argv[0]
    # on the set-id guard's thread where the agent has one (setid_guard): it carries the filter
    process = start_command(lambda: subprocess.Popen(
        argv, executable=program, stdin=stdin, stdout=writers[0], stderr=writers[1], cwd=cwd,
        env=env, start_new_session=True, restore_signals=True, close_fds=True, **options))
    # The root reaps its children itself (waitpid(-1)); a returncode keeps Popen's own
    # reaping (__del__, _cleanup at the next Popen) away from this pid, whose status is the job's.
    process.returncode = 0
    return process.pid
