"""``--relay ADDRESS``: join stdin/stdout to the durable agent's unix socket (an abstract name
``@…``, or a path) — one connection, copied both ways until either side ends.

Copy mode's durable sessions reach their agent through an engine ``exec`` of this relay
(``toolseam/backends/containers/exec_stream.py``): the exec's stream is one connection to the
agent, and its end ends only the relay.

The relay carries sealed lines only (``attach_auth.py``): it never sees the secret or the key
(the exec blanks the key's variable in its environment), and a line a process changed on the way
fails its seal. It still makes itself undumpable first thing, so no command of the same user
opens its ``/proc/PID/fd``, memory or environment; the commands' Landlock domain (``landlock.py``)
keeps them from tracing or signalling it too.
"""

from __future__ import annotations

import os
import select
import socket
import sys

from .procscan import guard_own_descriptors

_CHUNK = 1 << 16


def socket_address(address: str) -> str:
    """``@name`` is Linux's abstract namespace: no file a command could remove or replace."""
    return "\0" + address[1:] if address.startswith("@") else address


def relay(address: str) -> int:
    guard_own_descriptors()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(socket_address(address))
    except OSError as exc:
        print(f"relay: cannot connect to the agent at {address}: {exc}", file=sys.stderr)
        return 1
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    sources = [stdin, conn.fileno()]
    while sources:
        ready, _, _ = select.select(sources, [], [])
        for fd in ready:
            data = os.read(fd, _CHUNK) if fd == stdin else conn.recv(_CHUNK)
            if fd == stdin:
                if not data:  # the client is gone: so is this connection
                    conn.shutdown(socket.SHUT_WR)
                    sources.remove(stdin)
                else:
                    conn.sendall(data)
            elif not data:
                return 0  # the agent ended the connection
            else:
                view = memoryview(data)
                while view:
                    view = view[os.write(stdout, view):]
    return 0
