"""Commands cannot reach the session's control path: a Landlock domain on the thread that starts
them (``setid_guard.Guard``), so every command and everything it starts is inside it.

What the domain takes from commands, and why (docs/security.md, "The session's control path"):

* **ptrace and /proc of the agent and the relays** — a Landlock domain never lets a process
  trace, read the memory of, or open ``/proc/PID/fd`` of a process outside it (always, ABI 1);
* **the agent's abstract socket** (copy mode: ``@toolseam-agent-…``) — ``SCOPE_ABSTRACT_UNIX_
  SOCKET`` (ABI 6): no connection to an abstract socket made outside the domain, so a command
  cannot even take the one attach slot;
* **signals** to the agent and the relays (``SCOPE_SIGNAL``, ABI 6);
* **the control directory** (bind mode: where the agent's socket is, a bind mount the host
  connects through) — no entry in it made, removed or renamed: the domain handles every
  right that changes a directory and grants them beneath every other top-level directory,
  never beneath the control path. A sibling made later at a level above the control path
  gets no rights: the container's root filesystem is read-only, and the control path is a
  top-level mount of its own.

Reads are not handled, so nothing else changes for a command. Standard library only (ctypes).
"""

from __future__ import annotations

import ctypes
import errno
import os

DOMAIN_VAR = "TOOLSEAM_COMMAND_DOMAIN"  # "scope" or "scope:/control/path" (containers)

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # every arch, one table
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1, 2

_WRITE_FILE, _REMOVE_DIR, _REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
_MAKE = sum(1 << bit for bit in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
_REFER, _TRUNCATE = 1 << 13, 1 << 14
_FILE_RIGHTS = _WRITE_FILE | _TRUNCATE  # the only handled rights a rule on a file may carry


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)


def _syscall(number: int, *args: object) -> int:
    result = int(_libc.syscall(number, *args))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (or a filter forbids it)."""
    try:
        return _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except OSError:
        return 0


def _handled(version: int) -> int:
    rights = _WRITE_FILE | _REMOVE_DIR | _REMOVE_FILE | _MAKE
    return rights | (_REFER if version >= 2 else 0) | (_TRUNCATE if version >= 3 else 0)


def _allow_beneath(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # gone since it was listed: nothing to allow
    try:
        if not os.path.isdir(f"/proc/self/fd/{fd}"):
            rights &= _FILE_RIGHTS
        if rights:
            rule = _PathBeneath(rights, fd)
            _syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                     ctypes.byref(rule), ctypes.c_uint32(0))
    finally:
        os.close(fd)


def _allow_all_but(ruleset: int, control: str, rights: int) -> None:
    """Rights beneath everything but ``control``: at each level from ``/`` down to it, every
    sibling of the path's next component."""
    parts = [p for p in control.split("/") if p]
    here = "/"
    for part in parts:
        for name in os.listdir(here):
            if name != part:
                _allow_beneath(ruleset, os.path.join(here, name), rights)
        here = os.path.join(here, part)


def restrict_thread(control: str | None) -> str:
    """Put the calling thread (and what it starts from now on) in the commands' domain; the
    description of what holds, for the agent's hello.

    Raises:
        OSError: no Landlock (ENOSYS, EOPNOTSUPP), or an ABI without scopes (below 6).
    """
    version = abi()
    if version < 6:
        raise OSError(errno.EOPNOTSUPP, f"Landlock ABI {version}: scopes need ABI 6 (Linux 6.12)")
    handled = _handled(version) if control else 0
    attr = _RulesetAttr(handled, 0, _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL)
    ruleset = _syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
                       ctypes.c_uint32(0))
    try:
        if control:
            _allow_all_but(ruleset, control, handled)
        if _libc.prctl(ctypes.c_int(_PR_SET_NO_NEW_PRIVS), ctypes.c_ulong(1), ctypes.c_ulong(0),
                       ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
        _syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
    held = "abstract sockets, signals, ptrace"
    return f"landlock {version}: {held}" + (f", {control} unchangeable" if control else "")


def configured(environ: os._Environ[str] | dict[str, str] = os.environ) -> tuple[bool, str | None]:
    """Whether the agent was asked for the domain, and the control path to protect."""
    value = environ.get(DOMAIN_VAR, "")
    if not value.startswith("scope"):
        return False, None
    _, _, control = value.partition(":")
    return True, control or None
