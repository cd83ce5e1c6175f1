"""The remote backend: where a sandbox lives, below the seam (docs/architecture.md).

``RemoteBackend`` (``client.py``) drives a sandbox that a ``RemoteServer`` (``server.py``)
hosts as any local backend, through a ``Transport`` (``transport.py``: a unix socket,
``unix.py``, or the in-process loopback)."""

from .client import RemoteBackend
from .server import RemoteServer
from .spec import HostedSpec
from .transport import LoopbackTransport, Transport, TransportLost
from .unix import UnixListener, UnixTransport

__all__ = ["HostedSpec", "LoopbackTransport", "RemoteBackend", "RemoteServer", "Transport",
           "TransportLost", "UnixListener", "UnixTransport"]
