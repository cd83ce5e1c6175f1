"""Which process opened a connection the agent accepted (egress attribution).

The accepted socket's peer is the client's end: its local address and port are a row of
``/proc/net/tcp`` whose inode is the client's socket, and the process holding that inode is
among ``/proc/*/fd``. Stdlib only, best effort: a process that exited, or one the agent may not
inspect, leaves the answer empty.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct


def _hex_address(address: str, port: int) -> str:
    """``/proc/net/tcp``'s form: the IPv4 address as a little-endian word, then the port."""
    packed = socket.inet_aton(address)
    return f"{struct.unpack('<I', packed)[0]:08X}:{port:04X}"


def socket_inode(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The inode of the TCP socket whose own end is ``local`` and peer ``remote``."""
    want_local, want_remote = _hex_address(*local), _hex_address(*remote)
    with contextlib.suppress(OSError), open("/proc/net/tcp", encoding="ascii") as table:
        next(table, None)
        for line in table:
            fields = line.split()
            if len(fields) > 9 and fields[1] == want_local and fields[2] == want_remote:
                return int(fields[9]) or None
    return None


def inode_owner(inode: int) -> int | None:
    """The pid of a process holding the socket ``inode`` (the lowest, if several do)."""
    target = f"socket:[{inode}]"
    own = os.getpid()
    pids = sorted(int(name) for name in os.listdir("/proc") if name.isdigit())
    for pid in pids:
        if pid == own:
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return pid
    return None


def argv_head(pid: int, words: int = 4, limit: int = 200) -> list[str]:
    """The first words of a process's command line, each cut to ``limit`` characters."""
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            raw = cmdline.read(4096)
        return [part.decode("utf-8", "replace")[:limit] for part in raw.split(b"\0") if part][:words]
    return []


def parent_of(pid: int) -> int | None:
    with (contextlib.suppress(OSError, ValueError, IndexError),
          open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat):
        return int(stat.read().rsplit(")", 1)[1].split()[1])
    return None


def owner(sock: socket.socket) -> tuple[int, list[str]] | None:
    """(pid, argv head) of the process at the other end of an accepted loopback socket."""
    try:
        peer, mine = sock.getpeername(), sock.getsockname()
    except OSError:
        return None
    if sock.family != socket.AF_INET:
        return None
    inode = socket_inode((peer[0], peer[1]), (mine[0], mine[1]))
    pid = None if inode is None else inode_owner(inode)
    return None if pid is None else (pid, argv_head(pid))
