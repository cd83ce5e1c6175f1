"""Resolve a tool's path against the base dir, and open it confined to that base atomically.

Confinement is two steps, and only the second is a guarantee:

1. ``resolve`` canonicalises the path by hand (``lstat``/``readlink``, component by component)
   and checks the canonical form against the canonical base by path relation. Doing it by hand,
   not with ``os.path.realpath``, is deliberate: ``realpath(strict=False)`` silently stops on
   ELOOP/ENAMETOOLONG, and ``abspath`` collapses ``link/..`` lexically — both would turn an
   escape into "inside".
2. The open itself goes through ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
   RESOLVE_NO_MAGICLINKS)`` from a held base-dir fd, with the canonical (symlink-free) relative
   path. If a component was swapped for a symlink after step 1, the kernel refuses the open, so
   the check and the open cannot be raced apart. Where ``openat2`` is refused (old kernel,
   seccomp), an ``O_NOFOLLOW`` component walk with ``dir_fd`` gives the same refusal.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import stat
import threading
from typing import NamedTuple

from .errors import (
    INVALID,
    NOT_DIRECTORY,
    NOT_FOUND,
    OUTSIDE_BASE,
    PERMISSION,
    FsError,
    from_os_error,
)

_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64 (asm-generic)
_MAX_SYMLINKS = 40  # the kernel's MAXSYMLINKS
_PATH_MAX = 4096
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_openat2_usable: bool | None = None  # None: not tried yet


def openat2_available() -> bool:
    """Whether the kernel (and any seccomp filter) lets ``openat2`` through here."""
    if _openat2_usable is None:
        root = os.open("/", _DIR_FLAGS)
        try:
            os.close(_openat2(root, ".", _DIR_FLAGS, 0))
        except (OSError, _Openat2Refused):
            pass
        finally:
            os.close(root)
    return bool(_openat2_usable)


class _Openat2Refused(Exception):
    pass


_CONFINED = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
_AT_FDCWD = -100


def _openat2(dir_fd: int, rel: str, flags: int, mode: int, resolve: int = _CONFINED) -> int:
    global _openat2_usable
    if _openat2_usable is False:
        raise _Openat2Refused
    # O_TMPFILE holds O_DIRECTORY's bit: test it whole, or every directory open keeps a mode
    if not (flags & os.O_CREAT or flags & os.O_TMPFILE == os.O_TMPFILE):
        mode = 0  # openat2 refuses a mode it would not use (EINVAL)
    how = _OpenHow(flags, mode, resolve)
    fd = _libc.syscall(_SYS_OPENAT2, dir_fd, os.fsencode(rel), ctypes.byref(how), ctypes.sizeof(how))
    if fd >= 0:
        _openat2_usable = True
        return int(fd)
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM, errno.E2BIG) and _openat2_usable is None:
        _openat2_usable = False
        raise _Openat2Refused
    raise OSError(err, os.strerror(err), rel)


def _walk_open(dir_fd: int, parts: tuple[str, ...], flags: int, mode: int) -> int:
    """The ``openat2`` fallback: every component opened with O_NOFOLLOW relative to the last."""
    cur = os.dup(dir_fd)
    try:
        for comp in parts[:-1]:
            nxt = _open_dir_component(cur, comp)
            os.close(cur)
            cur = nxt
        leaf = parts[-1] if parts else "."
        try:
            return os.open(leaf, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=cur)
        except NotADirectoryError:  # O_DIRECTORY met a symlink: say so, like openat2 does
            if stat.S_ISLNK(os.lstat(leaf, dir_fd=cur).st_mode):
                raise OSError(errno.ELOOP, "symlink in a confined path", leaf) from None
            raise
    finally:
        os.close(cur)


def _open_dir_component(dir_fd: int, comp: str) -> int:
    try:
        return os.open(comp, _DIR_FLAGS, dir_fd=dir_fd)
    except NotADirectoryError:
        if stat.S_ISLNK(os.lstat(comp, dir_fd=dir_fd).st_mode):
            raise OSError(errno.ELOOP, "symlink in a confined path", comp) from None
        raise


_base_fds: dict[str, tuple[int, int, int]] = {}  # canonical base -> (fd, st_dev, st_ino)
_base_lock = threading.Lock()


def reset_locks_after_fork() -> None:
    global _base_lock
    _base_lock = threading.Lock()


def _base_fd(base_canonical: str) -> int:
    """A held O_PATH fd on the base dir: every confined open starts from it.

    Operations follow the NAME: a base dir renamed away and recreated mid-session is the new
    directory (one stat per operation checks it), never the old one through a stale fd.
    """
    try:
        now = os.stat(base_canonical)
    except OSError as exc:
        raise FsError(NOT_FOUND, base_canonical, f"base dir does not exist ({exc.strerror})") from None
    with _base_lock:
        held = _base_fds.get(base_canonical)
        if held is not None and (held[1], held[2]) == (now.st_dev, now.st_ino):
            return held[0]
        fd = os.open(base_canonical, _DIR_FLAGS)
        st = os.fstat(fd)
        if held is not None:
            os.close(held[0])
        _base_fds[base_canonical] = (fd, st.st_dev, st.st_ino)
        return fd


class Resolved(NamedTuple):
    """A tool path mapped onto the filesystem (a NamedTuple: built on every file operation,
    and a third the cost of a frozen dataclass)."""

    given: str  # as the model wrote it
    canonical: str  # absolute, symlinks resolved on the deepest existing ancestor
    confined: bool
    base: str  # canonical base dir
    parts: tuple[str, ...]  # canonical path relative to base (confined) or to "/" (not)
    trailing_slash: bool

    @property
    def anchor_fd(self) -> int:
        return _base_fd(self.base if self.confined else "/")


def canonicalize(path: str) -> str:
    """Resolve every symlink of ``path`` that exists; re-attach the missing tail lexically."""
    real = "/"
    tail: list[str] = []
    pending = path.split("/")
    links = 0
    while pending:
        comp = pending.pop(0)
        if comp in ("", "."):
            continue
        if comp == "..":
            if tail:
                tail.pop()
            else:
                real = os.path.dirname(real)
            continue
        if tail:
            tail.append(comp)
            continue
        candidate = os.path.join(real, comp)
        try:
            st = os.lstat(candidate)
        except (FileNotFoundError, NotADirectoryError):
            tail.append(comp)
            continue
        except OSError as exc:
            raise from_os_error(exc, path) from None
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_SYMLINKS:
                raise FsError(OUTSIDE_BASE, path, "too many levels of symbolic links")
            try:
                target = os.readlink(candidate)
            except OSError:  # swapped between lstat and readlink: look again (bounded by links)
                pending.insert(0, comp)
                continue
            if target.startswith("/"):
                real = "/"
            pending[:0] = target.split("/")
        else:
            real = candidate
    result = os.path.join(real, *tail) if tail else real
    if len(os.fsencode(result)) >= _PATH_MAX:
        raise FsError(OUTSIDE_BASE, path, "path too long to resolve")
    return result


def resolve(base: str, given: str, confine: bool, canonical_needed: bool = True) -> Resolved:
    """Map ``given`` onto the filesystem relative to ``base``; refuse escapes when confined.

    Unconfined, a plain open needs no canonical form (the kernel resolves the path as given):
    ``canonical_needed=False`` skips the lstat walk on that hot path.
    """
    if not given:
        raise FsError(INVALID, given, "empty path")
    if "\x00" in given:
        raise FsError(INVALID, given, "path contains a NUL byte")
    full = given if given.startswith("/") else f"{base.rstrip('/')}/{given}"
    if "\\x" in full:
        full = _unescaped_if_named(full)
    trailing = given.endswith("/") and given.strip("/") != ""
    if not confine and not canonical_needed:
        return Resolved(given, full, False, "/", (), trailing)
    canonical = canonicalize(full)
    if not confine:
        return Resolved(given, canonical, False, "/", _split(canonical), trailing)
    base_canonical = canonicalize(base)
    if not os.path.isdir(base_canonical):
        raise FsError(NOT_FOUND, base, "base dir does not exist")
    base_parts, parts = _split(base_canonical), _split(canonical)
    if parts[: len(base_parts)] != base_parts:
        raise FsError(OUTSIDE_BASE, given)
    return Resolved(given, canonical, True, base_canonical, parts[len(base_parts) :], trailing)


_ESCAPED_BYTE = re.compile(r"\\x([89a-fA-F][0-9a-fA-F])")


def _unescaped_if_named(full: str) -> str:
    r"""A listing shows a name's undecodable bytes as ``\xNN`` (``names.escape_name``); the same
    text, given back as a path, names that file. A name that literally holds ``\xNN`` and
    exists wins over the escaped reading; otherwise the escaped reading is taken when it exists.
    """
    raw = _ESCAPED_BYTE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), full)
    if raw == full or os.path.lexists(full):
        return full
    parent = os.path.dirname(raw)
    escaped_parent = parent != os.path.dirname(full) and os.path.lexists(parent)
    return raw if os.path.lexists(raw) or escaped_parent else full


def _split(path: str) -> tuple[str, ...]:
    return tuple(p for p in path.split("/") if p)


# What the file tools never read, whatever path led there: a process's environment and memory.
# On the host backend they run in the toolseam process, whose environment holds every secret
# the command filter keeps from bash (and its parent's holds the same).
_PROCESS_SECRETS = re.compile(r"/proc/\d+/(?:task/\d+/)?(?:environ|mem)")
_procfs_dev: list[int] = []


def _open_unconfined(r: Resolved, flags: int, mode: int) -> int:
    """A content open outside confinement, through no ``/proc`` magic link (``/proc/*/fd/*``,
    ``/proc/*/root``, ``/proc/*/cwd``, hence ``/dev/stdin`` and ``/dev/fd/*``): on the host
    backend those are the toolseam process's own files, pipes and directories. Where openat2 is
    refused (old kernel, seccomp), a plain open: the ``_refuse_process_secrets`` check remains."""
    try:
        fd = _openat2(_AT_FDCWD, r.canonical, flags, mode, _RESOLVE_NO_MAGICLINKS)
    except _Openat2Refused:
        fd = os.open(r.canonical, flags, mode)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        try:  # a real loop fails this too; a magic link does not (O_PATH reads nothing)
            os.close(os.open(r.canonical, os.O_PATH | os.O_CLOEXEC))
        except OSError:
            raise exc from None
        raise FsError(PERMISSION, r.given, "the file tools do not open through /proc links "
                      "(/proc/*/fd, /proc/*/root, /proc/*/cwd, /dev/stdin)") from None
    _refuse_process_secrets(fd, r)
    return fd


def _refuse_process_secrets(fd: int, r: Resolved) -> None:
    """Called on a fd opened for content: close it and refuse when it is a ``_PROCESS_SECRETS``
    entry (checked on the open file, so no symlink or ``/proc/self`` spelling gets around it)."""
    if not _procfs_dev:
        _procfs_dev.append(os.stat("/proc").st_dev)
    if os.fstat(fd).st_dev != _procfs_dev[0]:
        return
    with contextlib.suppress(OSError):
        if not _PROCESS_SECRETS.fullmatch(os.readlink(f"/proc/self/fd/{fd}")):
            return
    os.close(fd)
    raise FsError(PERMISSION, r.given, "a process's environment and memory are never read "
                  "by the file tools")


def open_path(r: Resolved, flags: int, mode: int = 0o666) -> int:
    """Open the resolved path; under confinement the kernel re-checks every component."""
    try:
        if not r.confined:
            if flags & os.O_PATH:  # metadata only
                return os.open(r.canonical, flags | os.O_CLOEXEC, mode)
            return _open_unconfined(r, flags | os.O_CLOEXEC, mode)
        rel = "/".join(r.parts) or "."
        try:
            return _openat2(r.anchor_fd, rel, flags | os.O_CLOEXEC, mode)
        except _Openat2Refused:
            return _walk_open(r.anchor_fd, r.parts, flags, mode)
    except OSError as exc:
        raise _confined_error(exc, r) from None


def open_parent(r: Resolved, create: bool) -> tuple[int, str, list[str]]:
    """Open the parent dir of ``r`` (O_PATH) and return it, the leaf name, and dirs created.

    Parents are walked one O_NOFOLLOW component at a time from the anchor, so a directory
    created here can never be a symlink planted by someone else.
    """
    if not r.parts:
        raise FsError("is_directory", r.given)
    parent = _open_existing_parent(r)
    if parent is not None:
        return parent, r.parts[-1], []
    created: list[str] = []
    cur = os.dup(r.anchor_fd)
    prefix = r.base if r.confined else ""
    try:
        for comp in r.parts[:-1]:
            prefix = f"{prefix}/{comp}"
            try:
                nxt = _open_dir_component(cur, comp)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(comp, 0o777, dir_fd=cur)
                created.append(prefix)
                nxt = _open_dir_component(cur, comp)
            os.close(cur)
            cur = nxt
        return cur, r.parts[-1], created
    except OSError as exc:
        os.close(cur)
        raise _confined_error(exc, r) from None
    except BaseException:
        os.close(cur)
        raise


def _open_existing_parent(r: Resolved) -> int | None:
    """The common case in one syscall: the parent exists. None sends the caller to the walk
    (which creates missing parents); a refusal is raised as the walk would raise it."""
    try:
        if not r.confined:
            return os.open("/" + "/".join(r.parts[:-1]), _DIR_FLAGS)
        return _openat2(r.anchor_fd, "/".join(r.parts[:-1]) or ".", _DIR_FLAGS, 0)
    except (_Openat2Refused, FileNotFoundError):
        return None
    except OSError as exc:
        raise _confined_error(exc, r) from None


def _confined_error(exc: OSError, r: Resolved) -> FsError:
    if r.confined and exc.errno in (errno.EXDEV, errno.ELOOP):
        return FsError(OUTSIDE_BASE, r.given)
    if exc.errno == errno.ENOTDIR and r.trailing_slash:
        return FsError(NOT_DIRECTORY, r.given)
    return from_os_error(exc, r.given)
