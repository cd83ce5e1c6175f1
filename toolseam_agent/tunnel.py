"""The sandbox's end of egress: a listener on 127.0.0.1 whose connections travel over the
session's channel to the toolseam process (``toolseam/backends/agentlink/tunnel.py``), which
decides, resolves and connects. Nothing here decides anything or holds a secret.

Each accepted connection is a numbered stream of ``tun`` frames on the channel:

* agent → host (events): ``{"ev": "tun", "c": N, "o": "open"}``, data ``{"ev": "tun", "c": N,
  "d": BASE64}``, ``"o": "eof"`` (the client half-closed), ``"o": "end"`` (the socket failed or
  was closed), and ``"a": COUNT`` — bytes the host sent that reached the client.
* host → agent (``op: "tun"``, no answer): the same ``d``, ``eof``, ``end`` and ``a``.

Credit-based flow control, as SSH channels and HTTP/2 streams do it: each side keeps at most
``WINDOW`` bytes of a connection unacknowledged on the channel, so a download the client reads
slowly never fills the channel, and a tool call's answer waits behind at most a window per
busy connection. Threads, two per connection, because a blocking ``sendall`` to a slow client
must never stall the agent's loop (job output and deadlines live there).
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import tempfile
import threading
from collections.abc import Callable
from typing import Any, Protocol

from .wire import TO_AGENT, TO_HOST, TUNNEL_EVENT, tunnel_data, tunnel_number, tunnel_payload

WINDOW = 512 * 1024  # unacknowledged bytes per connection and direction
CHUNK = 64 * 1024
_LINGER_S = 2.0  # after the last byte, how long a client may take to close its end
MAX_CONNECTIONS = 512  # beyond it the agent closes at once; the host's limit (503) comes first
# Where images keep their trusted roots (Debian/Ubuntu/Alpine, Fedora/RHEL, others).
SYSTEM_ROOTS = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                "/etc/ssl/cert.pem", "/etc/ssl/ca-bundle.pem")

Send = Callable[[dict[str, Any]], None]
SendBytes = Callable[[bytes], None]
_END = object()
_EOF = object()


_NICE = 10


def _yield_to_calls() -> None:
    """This thread at a lower CPU priority than the agent's loop (tool calls, job output):
    on a busy machine a download waits, not a call. Raising one's own nice needs no privilege."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _NICE)


class StreamOwner(Protocol):
    """What a connection needs of the table that holds it: egress's ``Tunnels`` here, and the
    exposed ports' ``PortForwards`` (``ports.py``), which frame their streams under another
    name so neither end can take one kind for the other."""

    event: str  # the ``ev`` of this kind's frames to the host
    to_host: bytes  # the start of this kind's data frames to the host

    def send(self, message: dict[str, Any]) -> None: ...
    def send_bytes(self, data: bytes) -> None: ...
    def forget(self, number: int) -> None: ...


class Connection:
    """One connection inside the sandbox, carried as a numbered stream: a reader and a writer
    thread, each direction within ``WINDOW``."""

    def __init__(self, tunnels: StreamOwner, number: int, sock: socket.socket) -> None:
        self.tunnels, self.number, self.sock = tunnels, number, sock
        self.unacked = 0  # bytes sent to the host it has not yet passed on
        self.credit = threading.Condition()
        self.outbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.ended = False
        self.reader = threading.Thread(target=self._read, daemon=True, name=f"tun{number}r")
        self.writer = threading.Thread(target=self._write, daemon=True, name=f"tun{number}w")

    def start(self) -> None:
        self.reader.start()
        self.writer.start()

    def _event(self, **fields: Any) -> None:
        self.tunnels.send({"ev": self.tunnels.event, "c": self.number, **fields})

    def _read(self) -> None:
        """Client → host, within the credit the host grants."""
        _yield_to_calls()
        while True:
            with self.credit:
                while self.unacked >= WINDOW and not self.ended:
                    self.credit.wait()
            if self.ended:
                return
            try:
                data = self.sock.recv(CHUNK)
            except OSError:
                self.end(tell_host=True)
                return
            if self.ended:
                return
            if not data:
                self._event(o="eof")
                return
            with self.credit:
                self.unacked += len(data)
            self.tunnels.send_bytes(tunnel_data(self.tunnels.to_host, self.number, data))

    def _write(self) -> None:
        """Host → client, each piece acknowledged once the client's socket took it."""
        _yield_to_calls()
        while True:
            item = self.outbox.get()
            if item is _END:
                break
            try:
                if item is _EOF:
                    self.sock.shutdown(socket.SHUT_WR)
                    continue
                assert isinstance(item, bytes)
                data = tunnel_payload(item)  # decoded here, off the agent's loop thread
                self.sock.sendall(data)
            except (OSError, ValueError):  # the socket failed, or a frame was not base64
                self.end(tell_host=True)
                break
            self._event(a=len(data))
        # Everything the host sent is out: FIN, then a moment for the client to read it and
        # close — closing a socket with unread input resets it, and a reset can destroy the
        # answer still in flight to the client.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
        self.reader.join(_LINGER_S)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.reader.join()
        self.sock.close()
        self.tunnels.forget(self.number)

    def from_host(self, frame: dict[str, Any]) -> None:
        if "a" in frame:
            with self.credit:
                self.unacked -= int(frame["a"])
                self.credit.notify()
        elif frame.get("o") == "eof":
            self.outbox.put(_EOF)
        elif frame.get("o") == "end":
            self.end(tell_host=False)

    def end(self, tell_host: bool) -> None:
        with self.credit:
            if self.ended:
                return
            self.ended = True
            self.credit.notify()
        if tell_host:  # the socket failed: nothing more can reach the client
            self._event(o="end")
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader blocked in recv
        self.outbox.put(_END)  # after what the host sent before its end: the writer sends it


class Tunnels:
    """The listener and its connections; ``send`` writes one message to the host."""

    event, to_host = TUNNEL_EVENT, TO_HOST

    def __init__(self, send: Send, send_bytes: SendBytes) -> None:
        self.send, self.send_bytes = send, send_bytes
        self._server: socket.socket | None = None
        self._connections: dict[int, Connection] = {}
        self._lock = threading.Lock()
        self._numbers = 0
        self._listened = False
        self.ca_dir: str | None = None

    def listen(self, ca_pem: str | None) -> dict[str, Any]:
        """Listen on 127.0.0.1 (a port the kernel picks); write the CA bundle when given.
        Returns what the host puts in the commands' environment."""
        if self._server is not None:
            return self._relisten(ca_pem)
        if self._listened:
            raise RuntimeError("egress was closed")
        self._listened = True
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.bind(("127.0.0.1", 0))
        server.listen(128)
        self._server = server
        threading.Thread(target=self._accept, daemon=True, name="tun-accept").start()
        ca_file = None if ca_pem is None else self._write_bundle(ca_pem)
        return {"port": server.getsockname()[1], "ca_file": ca_file}

    def _relisten(self, ca_pem: str | None) -> dict[str, Any]:
        """A client attached again (a durable session): the listener and its port stay, so the
        commands' proxy variables stay true; connections of the proxy that went with the last
        client end; the bundle is rewritten in place for the new client's session CA."""
        assert self._server is not None
        with self._lock:
            connections = list(self._connections.values())
        for connection in connections:
            connection.end(tell_host=False)
        ca_file = None
        if ca_pem is not None:
            ca_file = self._write_bundle(ca_pem)
        return {"port": self._server.getsockname()[1], "ca_file": ca_file}

    def _write_bundle(self, ca_pem: str) -> str:
        """The image's own roots, then the session CA, in a fresh directory every user of the
        sandbox can read (a raw exec may run as another user)."""
        roots = ""
        for path in SYSTEM_ROOTS:
            with contextlib.suppress(OSError, UnicodeDecodeError):
                with open(path, encoding="utf-8") as found:
                    roots = found.read()
                break
        if self.ca_dir is None:
            self.ca_dir = tempfile.mkdtemp(prefix="toolseam-egress-")
            os.chmod(self.ca_dir, 0o755)
        path = os.path.join(self.ca_dir, "ca-bundle.pem")
        fresh = path + ".new"  # replaced whole: a command reading it never sees half of it
        with open(fresh, "w", encoding="utf-8") as bundle:
            bundle.write(roots.rstrip() + "\n" + ca_pem if roots.strip() else ca_pem)
        os.chmod(fresh, 0o644)
        os.replace(fresh, path)
        return path

    def _accept(self) -> None:
        assert self._server is not None
        while True:
            try:
                sock, _ = self._server.accept()
            except OSError:
                return  # closed
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if len(self._connections) >= MAX_CONNECTIONS:
                    sock.close()
                    continue
                self._numbers += 1
                connection = Connection(self, self._numbers, sock)
                self._connections[connection.number] = connection
            self.send({"ev": TUNNEL_EVENT, "c": connection.number, "o": "open"})
            connection.start()

    def forget(self, number: int) -> None:
        with self._lock:
            self._connections.pop(number, None)

    def from_host(self, frame: dict[str, Any]) -> None:
        with self._lock:
            connection = self._connections.get(int(frame.get("c", 0)))
        if connection is not None:  # one that ended meanwhile: nothing to do
            connection.from_host(frame)

    def from_host_line(self, line: bytes) -> bool:
        """A data frame, queued undecoded for its connection's writer thread (the loop thread
        only finds its number); False for any other line."""
        found = tunnel_number(line, TO_AGENT)
        if found is None or not found[1]:
            return False
        with self._lock:
            connection = self._connections.get(found[0])
        if connection is not None and not connection.ended:
            connection.outbox.put(line)
        return True

    def close(self) -> None:
        """Stop listening and end every connection (the session is closing)."""
        server, self._server = self._server, None
        if server is not None:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)
            server.close()
        with self._lock:
            connections = list(self._connections.values())
        for connection in connections:
            connection.end(tell_host=False)
        ca_dir, self.ca_dir = self.ca_dir, None
        if ca_dir is not None:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(ca_dir, "ca-bundle.pem"))
                os.rmdir(ca_dir)
