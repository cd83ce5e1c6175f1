"""mount(2), umount2(2) and this namespace's mount table, for the parts that mount as root: a
pool's slots (``containers/pool/mounts.py``), a root host's fork overlays (``host_overlay.py``),
and the staging root's exit check (``staging.py``). No library binds mount(2) (the stdlib has
none; util-linux's ``mount`` is a process per call), so libc's is called here, its errno raised
as ``OSError``."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
from typing import NamedTuple

MNT_DETACH = 2  # umount2(2): gone from the namespace now, freed when nothing uses it
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_ESCAPE = re.compile(r"\\([0-7]{3})")  # mountinfo writes space, tab, newline, "\" as \040 …


def mount(source: str | None, target: str, flags: int, fstype: str | None = None,
          options: str | None = None) -> None:
    if libc.mount(source.encode() if source else None, os.fsencode(target),
                  fstype.encode() if fstype else None, flags,
                  options.encode() if options else None):
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source or ''} on {target}: {os.strerror(err)}")


def unmount(target: str) -> None:
    """Detach the mount at ``target``; nothing mounted there is no failure."""
    if libc.umount2(os.fsencode(target), MNT_DETACH):
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            raise OSError(err, f"umount {target}: {os.strerror(err)}")


class Mounted(NamedTuple):
    point: str
    fstype: str
    options: str  # the superblock's (an overlay's lowerdir=…, upperdir=…)


def mount_table(mountinfo: str = "/proc/self/mountinfo") -> list[Mounted]:
    """The mounts of a mount namespace (its ``mountinfo``), their points unescaped; a table
    that cannot be read is an ``OSError``."""
    found = []
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as info:
        for line in info:
            fields, _, rest = line.rstrip("\n").partition(" - ")
            point = _ESCAPE.sub(lambda match: chr(int(match[1], 8)), fields.split(" ", 5)[4])
            fstype, _, more = rest.partition(" ")
            found.append(Mounted(point, fstype, more.partition(" ")[2]))
    return found
