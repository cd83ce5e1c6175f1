"""``tools.sandbox.expose``: a port of the sandbox reachable from this machine.

What it is: a tunnel for the session's owner, and only the owner: a TCP listener on
``127.0.0.1`` here (another address only when the caller passes one) that admits a connection
only from a local socket of the uid this process runs as (``agentlink/peer_uid.py``: the
kernel's answer to identd's question), and carries each one it admits over the session's own
channel to ``127.0.0.1:PORT`` inside the sandbox — the sandbox needs no network (``none``
works), the engine may be on another machine, and a durable session's lines stay sealed. It
ends with the session (the listener closes, its connections end) or at ``close()``. A server in
the sandbox must listen on its loopback (``127.0.0.1`` or every address) to be reached.
"""

from __future__ import annotations

from ..seam.capabilities import ExposedPort, exposed_ports
from .toolkit_view import ToolkitView

_MAX_PORT = 65535


def _port(value: object, what: str, lowest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= _MAX_PORT:
        raise ValueError(f"{what} must be a whole number from {lowest} to {_MAX_PORT}, "
                         f"got {value!r}")
    return value


async def expose(tk: ToolkitView, port: int, host: str, host_port: int) -> ExposedPort:
    """Validate, open the session if needed, and ask the backend's capability."""
    sandbox_port = _port(port, "port", 1)
    listen_port = _port(host_port, "host_port", 0)
    if not isinstance(host, str) or not host or "\0" in host:
        raise ValueError(f"host must be an address to listen on here, got {host!r}")
    await tk.open()
    return await exposed_ports(tk.backend).expose_port(sandbox_port, host, listen_port)


__all__ = ["ExposedPort", "expose"]
