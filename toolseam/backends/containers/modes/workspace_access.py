"""Whether the user a rootless engine runs containers as can use a bind-mode workspace.

Rootless podman's container root is an unprivileged host user (the engine socket's owner), and
every capability is dropped in the sandbox: the workspace's host permissions apply to it as to
that user. Run by root for another user, a workspace that user cannot write opened silently
and every step then failed ``Permission denied``; one it could not reach failed with the
engine's own words (``statfs … permission denied``, runc's ``chdir to cwd``), naming neither the
user nor the fix (issue 33, item 7). The check here says so at open, in one line.

The verdict is the kernel's: a child forked as that user (its groups, no capabilities) asks
``access(2)`` — permission bits, ACLs and all — of each directory on the way and of the
workspace. Only root can make it; a process that is the engine's user asks for itself.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import warnings

from ....seam.errors import ConfigurationError


def check_workspace_access(workspace: str, owner: int | None, engine: str, *,
                           through_parents: bool = True) -> None:
    """Raise ``ConfigurationError`` naming the directory, the user and the fix when ``owner``
    (the uid container root maps to; None or 0: a rootful engine, nothing to check) cannot
    enter every directory on the way to ``workspace`` (``through_parents``: a pool's hand-out
    mounts it as root, so only the workspace itself counts there) or read, write and enter
    the workspace. ``engine`` names the engine in the message."""
    if owner is None or owner == 0:
        return
    parents = _parents(workspace) if through_parents else []
    found = _probe(workspace, parents, owner)
    if found is None:
        return
    lacking, path = found
    user = _user_name(owner)
    who = f"{user} (uid {owner}), the user the {engine} engine runs containers as"
    where = f"{path} (mode {_mode_of(path)})"
    if lacking == "x" and path != workspace:
        raise ConfigurationError(
            f"the workspace {workspace} is out of reach of {who}: it may not enter {where}; "
            f"let it through (setfacl -m u:{user}:x {path}, or chmod o+x {path} for every "
            "user) or pass workspace_mode='copy'")
    raise ConfigurationError(
        f"the workspace {where} is not {_rights(lacking)} by {who}; give it "
        f"access (chown -R {user} {workspace}, or setfacl -R -m u:{user}:rwX {workspace}) or "
        "pass workspace_mode='copy'")


def _parents(workspace: str) -> list[str]:
    """Every directory a lookup of ``workspace`` enters: its lexical parents and, where a link
    leads elsewhere, the parents of where it leads."""
    found: list[str] = []
    for path in dict.fromkeys((os.path.abspath(workspace), os.path.realpath(workspace))):
        parent = os.path.dirname(path)
        chain = []
        while True:
            chain.append(parent)
            if parent == os.path.dirname(parent):
                break
            parent = os.path.dirname(parent)
        found.extend(d for d in reversed(chain) if d not in found)
    return found


def _verdict(workspace: str, parents: list[str]) -> tuple[str, str] | None:
    """As this process's user: the first directory on the way it may not enter (``"x"``),
    else the rights it lacks on the workspace (``"rwx"``'s letters), else None."""
    for d in parents:
        if not os.access(d, os.X_OK):
            return "x", d
    lacking = "".join(c for c, m in (("r", os.R_OK), ("w", os.W_OK), ("x", os.X_OK))
                      if not os.access(workspace, m))
    return (lacking, workspace) if lacking else None


def _probe(workspace: str, parents: list[str], owner: int) -> tuple[str, str] | None:
    """What ``owner`` lacks, by the kernel's word; None: nothing, or no way to ask.

    Root asks through a forked child that takes the user's ids and groups (and so loses every
    capability) and execs nothing: no interpreter the user may not reach (root's home is
    0700), and a child that stays undumpable, so the user cannot steer its answer."""
    if os.geteuid() == owner:
        return _verdict(workspace, parents)
    if os.geteuid() != 0:
        return None  # another user's view needs root; the engine will speak for itself
    try:
        entry = pwd.getpwuid(owner)
        gid, groups = entry.pw_gid, os.getgrouplist(entry.pw_name, entry.pw_gid)
    except KeyError:
        gid, groups = owner, []
    read_end, write_end = os.pipe()
    try:
        with warnings.catch_warnings():  # 3.12+ warns about fork in a threaded process:
            warnings.simplefilter("ignore", DeprecationWarning)  # the child execs nothing
            child = os.fork()
        if child == 0:  # pragma: no cover - the child: ids, access(2), one write, _exit
            code = 1
            try:
                os.setgroups(groups)
                os.setresgid(gid, gid, gid)
                os.setresuid(owner, owner, owner)
                found = _verdict(workspace, parents)
                os.write(write_end, (" ".join(found) if found else "ok").encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        write_end = -1
        with os.fdopen(read_end, "rb") as pipe:
            read_end = -1
            answer = pipe.read().decode()
        _, status = os.waitpid(child, 0)
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0 or answer in ("", "ok"):
        return None
    lacking, _, path = answer.partition(" ")
    return lacking, path


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _mode_of(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return "unknown"
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"{stat.S_IMODE(st.st_mode):04o}, owner {owner}:{group}"


def _rights(lacking: str) -> str:
    words = {"r": "readable", "w": "writable", "x": "enterable"}
    return " or ".join(words[c] for c in lacking)
