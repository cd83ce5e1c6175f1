"""The host agent's own user namespace: commands get no power over the host's mounts.

``unshare --pid --fork --mount-proc`` gives the agent a private ``/proc``, but mounted by a
process that may unmount it again: as root (or as the root of the user namespace ``unshare
--user`` made) a command's ``umount -l /proc`` uncovers the host's ``/proc``, and with it the
environment of every process of the same user — the toolseam process's secrets included.

So the agent, pid 1 of that pid namespace, moves itself into one more user namespace with a mount
namespace of its own before anything else. Mounts copied into a mount namespace owned by a less
privileged user namespace are locked together by the kernel: ``/proc`` can no longer be
unmounted (EINVAL) and a fresh ``proc`` cannot be mounted (the pid namespace belongs to the
outer user namespace), whatever capabilities a command holds. Every id the outer namespace
knows is mapped to itself (``0 0 4294967295`` for root), so files keep their owners and
permission checks are what they were; only what needs a capability over the host's own kernel
objects (mounts, modules, raw devices, ports below 1024, raw sockets) is refused.

The map of a new user namespace must be written from the outer one: a short-lived child does it
(the way util-linux ``unshare`` writes ``--map-users``), so the agent stays pid 1.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def _identity(kind: str) -> str:
    """Every id this namespace maps, mapped to itself (lines "inside outside count")."""
    with open(f"/proc/self/{kind}_map", encoding="ascii") as ids:
        rows = [line.split() for line in ids if line.strip()]
    return "".join(f"{first} {first} {count}\n" for first, _, count in rows)


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as target:
        target.write(text)


def _map_parent(go: int, uid_map: str, gid_map: str) -> int:
    """The child's part: wait for the parent's unshare, write its maps; the exit status."""
    if os.read(go, 1) != b"1":
        return 2
    parent = os.getppid()
    try:
        _write(f"/proc/{parent}/uid_map", uid_map)
        try:
            _write(f"/proc/{parent}/gid_map", gid_map)
        except PermissionError:  # without CAP_SETGID outside, setgroups must be denied first
            _write(f"/proc/{parent}/setgroups", "deny")
            _write(f"/proc/{parent}/gid_map", gid_map)
    except OSError:
        return 1
    return 0


def enter_own_user_namespace(network: bool = False) -> None:
    """Move this process into a new user and mount namespace, ids mapped to themselves; with
    ``network``, into a network namespace of its own too, holding only loopback (brought up).
    Raises OSError naming what failed."""
    uid_map, gid_map = _identity("uid"), _identity("gid")
    go_read, go_write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked child, which only ever _exits
        status = 1
        try:
            os.close(go_write)
            status = _map_parent(go_read, uid_map, gid_map)
        finally:
            os._exit(status)
    os.close(go_read)
    libc = ctypes.CDLL(None, use_errno=True)
    flags = _CLONE_NEWUSER | _CLONE_NEWNS | (_CLONE_NEWNET if network else 0)
    failed = libc.unshare(flags) != 0
    err = ctypes.get_errno()
    os.write(go_write, b"0" if failed else b"1")
    os.close(go_write)
    _, status = os.waitpid(child, 0)
    if failed:
        what = "CLONE_NEWUSER|CLONE_NEWNS" + ("|CLONE_NEWNET" if network else "")
        raise OSError(err, f"unshare({what}): {os.strerror(err)}")
    if status != 0:
        raise OSError(f"could not write the id maps of the agent's user namespace ({uid_map!r})")
    if network:
        loopback_up()


_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8


def hide_run() -> None:
    """An empty tmpfs over ``/run`` in this mount namespace (egress mode on the host backend).

    A network namespace hides the host's interfaces but not its unix sockets, and ``/run`` holds
    the ones that reach the network for a caller: the container engines' APIs (a command could
    start a container on the host's network), D-Bus and the resolvers (names sent out as DNS
    queries). Mounted before the agent's own user namespace is entered, the mount is locked
    there: no command, root included, can unmount it. Raises OSError."""
    libc = ctypes.CDLL(None, use_errno=True)
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    # /var/run is a link to /run almost everywhere; where it is a directory of its own, it too
    for path in dict.fromkeys(os.path.realpath(p) for p in ("/run", "/var/run")
                              if os.path.isdir(p)):
        if libc.mount(b"tmpfs", path.encode(), b"tmpfs", flags, b"mode=755,size=1m") != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount tmpfs on {path}: {os.strerror(err)}")


def cover_with_empty_tmpfs(directory: str) -> None:
    """An empty, read-only tmpfs over ``directory`` in this mount namespace (the host durable
    agent's session directory: ``session_socket.Listener``). Like ``hide_run``, mounted before
    the agent's own user namespace is entered, so it is locked there. Raises OSError."""
    libc = ctypes.CDLL(None, use_errno=True)
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_RDONLY
    if libc.mount(b"tmpfs", directory.encode(), b"tmpfs", flags, b"mode=500,size=4k") != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {directory}: {os.strerror(err)}")


def loopback_up() -> None:
    """Bring ``lo`` up in this (new) network namespace: the stdlib has no netlink, and the two
    ioctls ``ip link set lo up`` makes are all it takes (struct ifreq: name, then flags)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


def interfaces() -> list[str]:
    """The network interfaces this process sees (``/proc/net/dev``)."""
    with open("/proc/net/dev", encoding="ascii") as table:
        return [line.split(":", 1)[0].strip() for line in table.readlines()[2:]]
