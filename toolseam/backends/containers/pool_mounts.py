"""The host mounts behind a pool's bind mode (``pool.py``; docs/pool.md, decision 110).

A pool directory is bind-mounted onto itself and made a *shared* mount; each pre-warmed
container gets one slot below it, bind-mounted at ``/workspace`` with *slave* propagation. At
hand-out the base dir is bind-mounted onto the slot on the host and appears in the running
container at once — one ``mount(2)``, no copy, no restart. Only a process that may mount
(root, in the engine's mount namespace) can do this; elsewhere the pool copies.

Mounts outlive a process killed with ``-9``: each pool directory holds its owner's label, and
``sweep_dead_pools`` unmounts and removes those whose owner is gone (the janitor calls it).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import glob
import os
import shutil
import tempfile

from .sandbox import owner_is_gone, owner_label

MS_BIND = 0x1000
MS_REC = 0x4000
MS_SHARED = 0x100000
MNT_DETACH = 2
_PREFIX = "toolseam-pool-"
_OWNER_FILE = "owner"
_CAP_SYS_ADMIN = 21

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def can_mount() -> bool:
    """Whether this process may make bind mounts (root with CAP_SYS_ADMIN)."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            caps = next(line for line in status if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caps.split()[1], 16) >> _CAP_SYS_ADMIN & 1)


def _mount(source: str | None, target: str, flags: int) -> None:
    if _libc.mount(source.encode() if source else None, target.encode(), None, flags, None):
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source or ''} on {target}: {os.strerror(err)}")


def unmount(target: str) -> None:
    """Detach the mount at ``target``; nothing mounted there is no failure."""
    if _libc.umount2(target.encode(), MNT_DETACH):
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            raise OSError(err, f"umount {target}: {os.strerror(err)}")


def make_pool_dir(shared: bool) -> str:
    """A fresh pool directory owned by this process (its label inside); ``shared``: mounted
    onto itself as a shared mount, for slots (bind mode)."""
    path = tempfile.mkdtemp(prefix=_PREFIX)
    with open(os.path.join(path, _OWNER_FILE), "w", encoding="utf-8") as owner:
        owner.write(owner_label())
    if not shared:
        return path
    try:
        _mount(path, path, MS_BIND)
        _mount(None, path, MS_SHARED)
    except OSError:
        remove_pool_dir(path)
        raise
    return path


def make_slot(pool_dir: str, name: str) -> str:
    """A slot directory for one sandbox; a marker inside tells an unmounted slot apart."""
    slot = os.path.join(pool_dir, name)
    os.mkdir(slot, 0o700)
    with open(os.path.join(slot, slot_marker(name)), "w", encoding="ascii"):
        pass
    return slot


def slot_marker(name: str) -> str:
    """A file only the empty slot holds: if a sandbox still sees it after the base dir was
    mounted, the mount did not reach the container's mount namespace."""
    return f".toolseam-empty-slot-{name}"


def bind_onto(source: str, slot: str) -> None:
    """The base dir (with whatever is mounted below it) onto a slot."""
    _mount(source, slot, MS_BIND | MS_REC)


def release_slot(slot: str) -> None:
    """Unmount the base dir from a slot (the container sees it go) and remove the slot."""
    for target in sorted(_mounts_below(slot), key=len, reverse=True):
        unmount(target)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(slot, slot_marker(os.path.basename(slot))))
    with contextlib.suppress(FileNotFoundError, OSError):
        os.rmdir(slot)


def remove_pool_dir(path: str) -> None:
    """Unmount everything at and below a pool directory, deepest first, and remove it."""
    for target in sorted(_mounts_below(path), key=len, reverse=True):
        unmount(target)
    shutil.rmtree(path, ignore_errors=True)


def sweep_dead_pools() -> list[str]:
    """Remove the pool directories (and their mounts) of processes that are gone."""
    removed = []
    for path in glob.glob(os.path.join(tempfile.gettempdir(), _PREFIX + "*")):
        try:
            with open(os.path.join(path, _OWNER_FILE), encoding="utf-8") as owner:
                label = owner.read().strip()
        except OSError:
            continue  # being made, or not ours to judge
        if label and owner_is_gone(label):
            with contextlib.suppress(OSError):  # another user's, or already going
                remove_pool_dir(path)
                removed.append(path)
    return removed


def _mounts_below(path: str) -> list[str]:
    """Mount points at or below ``path`` in this mount namespace (``/proc/self/mountinfo``)."""
    real = os.path.realpath(path)
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as info:
            for line in info:
                point = _unescape(line.split(" ", 5)[4])
                if point == real or point.startswith(real + "/"):
                    found.append(point)
    except OSError:
        return []
    return found


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field
