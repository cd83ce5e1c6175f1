"""The sandbox's end of egress: a listener on 127.0.0.1 whose connections go to the toolseam
process, which decides, resolves and connects. Nothing here decides anything or holds a secret.
Where the host sent a lane (``fd_passing.py``: the agent shares its kernel) each connection is
handed over whole; otherwise it travels over the session's channel as frames
(``toolseam/backends/agentlink/tunnel.py``), as follows.

Each accepted connection is a numbered stream of ``tun`` frames on the channel:

* agent → host (events): ``{"ev": "tun", "c": N, "o": "open"}`` (with, for a captured
  connection, ``"h": NAME, "p": PORT`` — what it was resolved from and dialled — and, where the
  agent can see it, ``"pid"``, ``"argv"`` and ``"job"`` of the process that opened it), data
  as a binary frame (``frames.py``: raw bytes, no JSON), ``"o": "eof"`` (the client half-closed), ``"o":
  "end"`` (the socket failed or was closed), and ``"a": COUNT`` — bytes the host sent that reached the client.
* host → agent (``op: "tun"``, no answer): the same ``eof``, ``end`` and ``a``; data as
  binary frames.
* the resolver (``resolver.py``) asks ``{"ev": "tun", "o": "dns", "q": N, "h": NAME}``; the
  host answers ``{"op": "tun", "o": "dns", "q": N, "p": [PORTS]}`` (empty: refused).

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

from . import fd_passing, sockowner
from .resolver import Capture, point_resolv_conf
from .wire import TUNNEL_EVENT

WINDOW = 1 << 20  # unacknowledged bytes per connection and direction
CHUNK = 128 * 1024  # a data frame's most: what a call's answer may wait behind at the agent
_LINGER_S = 2.0  # after the last byte, how long a client may take to close its end
MAX_CONNECTIONS = 512  # beyond it the agent closes at once; the host's limit (503) comes first
# Where images keep their trusted roots (Debian/Ubuntu/Alpine, Fedora/RHEL, others).
SYSTEM_ROOTS = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                "/etc/ssl/cert.pem", "/etc/ssl/ca-bundle.pem")

Send = Callable[[dict[str, Any]], None]
SendData = Callable[[int, bytes], None]  # a data frame: connection number, bytes
JobOf = Callable[[int], str | None]  # a pid → the job it belongs to
_ASK_TIMEOUT_S = 10.0
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

    def send(self, message: dict[str, Any]) -> None: ...
    def send_data(self, number: int, data: bytes) -> None: ...
    def forget(self, number: int) -> None: ...


class Connection:
    """One connection inside the sandbox, carried as a numbered stream: a reader and a writer
    thread, each direction within ``WINDOW``. ``target``: a captured connection's name and
    port."""

    def __init__(self, tunnels: StreamOwner, number: int, sock: socket.socket,
                 target: tuple[str, int] | None = None) -> None:
        self.tunnels, self.number, self.sock, self.target = tunnels, number, sock, target
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

    def _opened(self) -> None:
        """Tell the host, with where a captured connection goes and who opened it."""
        fields: dict[str, Any] = {"o": "open"}
        if self.target is not None:
            fields.update(h=self.target[0], p=self.target[1])
        found = sockowner.owner(self.sock)
        if found is not None:
            fields.update(pid=found[0], argv=found[1])
            job = self.tunnels.job_of(found[0]) if isinstance(self.tunnels, Tunnels) else None
            if job is not None:
                fields["job"] = job
        self._event(**fields)

    def _read(self) -> None:
        """Client → host, within the credit the host grants."""
        _yield_to_calls()
        if self.tunnels.event == TUNNEL_EVENT:  # egress: the agent opened it, the host learns
            self._opened()
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
            self.tunnels.send_data(self.number, data)

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
                data = item
                self.sock.sendall(data)
            except OSError:  # the socket failed
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
        self.reader.join(_LINGER_S)  # bounded: a reader stuck writing to the host is a daemon
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

    event = TUNNEL_EVENT

    def __init__(self, send: Send, send_data: SendData,
                 job_of: JobOf = lambda _pid: None) -> None:
        self.send, self.send_data, self.job_of = send, send_data, job_of
        self.capture: Capture | None = None
        self._asked: dict[int, tuple[threading.Event, list[int]]] = {}
        self._server: socket.socket | None = None
        self._connections: dict[int, Connection] = {}
        self._lock = threading.Lock()
        self._numbers = 0
        self._listened = False
        self.ca_dir: str | None = None
        # where the host and the agent share a kernel, connections go to the host whole
        # (``fd_passing.py``); None: as frames on the channel
        self.lane: socket.socket | None = None

    def listen(self, ca_pem: str | None, capture: bool = False,
               resolv_conf: bool = False, lane: socket.socket | None = None) -> dict[str, Any]:
        """Listen on 127.0.0.1 (a port the kernel picks); write the CA bundle when given; with
        ``capture``, start the resolver (``resolver.py``), and with ``resolv_conf`` (a
        container's agent) point /etc/resolv.conf at it. With a ``lane``, connections are
        handed to the host whole. Returns what the host puts in the commands' environment,
        ``capture`` (None, or why names cannot be captured) and ``lane`` (whether it is used)."""
        self._set_lane(lane)
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
        problem = self._start_capture() if capture else "not asked"
        if problem is None and resolv_conf:
            problem = point_resolv_conf()
        return {"port": server.getsockname()[1], "ca_file": ca_file, "capture": problem,
                "lane": self.lane is not None}

    def _set_lane(self, lane: socket.socket | None) -> None:
        """A new client's lane replaces the last one's (a durable session attached again)."""
        with self._lock:
            old, self.lane = self.lane, lane
        if old is not None:
            old.close()

    def _start_capture(self) -> str | None:
        capture = Capture(self._ask, lambda sock, name, port: self._adopt(sock, (name, port)))
        try:
            capture.start()
        except OSError as exc:
            return f"the resolver cannot listen on 127.0.0.53:53: {exc.strerror}"
        self.capture = capture
        return None

    def _ask(self, name: str) -> list[int]:
        """The ports the host grants ``name`` (the resolver's thread waits for the answer)."""
        waiter: tuple[threading.Event, list[int]] = (threading.Event(), [])
        with self._lock:
            self._numbers += 1
            question = self._numbers
            self._asked[question] = waiter
        try:
            self.send({"ev": TUNNEL_EVENT, "o": "dns", "q": question, "h": name})
            waiter[0].wait(_ASK_TIMEOUT_S)
            return list(waiter[1])
        finally:
            with self._lock:
                self._asked.pop(question, None)

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
        return {"port": self._server.getsockname()[1], "ca_file": ca_file,
                "capture": None if self.capture is not None else "not started",
                "lane": self.lane is not None}

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
            self._adopt(sock, None)

    def _adopt(self, sock: socket.socket, target: tuple[str, int] | None) -> None:
        """A connection to the proxy's listener, or (``target``) a captured one."""
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.lane is not None and self._hand_over(sock, target):
            return
        with self._lock:
            if len(self._connections) >= MAX_CONNECTIONS:
                sock.close()
                return
            self._numbers += 1
            connection = Connection(self, self._numbers, sock, target)
            self._connections[connection.number] = connection
        connection.start()  # its reader tells the host first ("open")

    def _hand_over(self, sock: socket.socket, target: tuple[str, int] | None) -> bool:
        """The connection to the host whole, with what the frames' ``open`` would say; our
        copy closed. False when the lane is gone (the frames carry it, and the rest)."""
        with self._lock:
            lane = self.lane
            self._numbers += 1
            number = self._numbers
        if lane is None:
            return False
        header: dict[str, Any] = {"c": number}
        if target is not None:
            header.update(h=target[0], p=target[1])
        found = sockowner.owner(sock)
        if found is not None:
            header.update(pid=found[0], argv=found[1])
            job = self.job_of(found[0])
            if job is not None:
                header["job"] = job
        try:
            fd_passing.hand_over(lane, sock, header)
        except OSError:
            if self.lane is lane:
                self._set_lane(None)
            return False
        sock.close()
        return True

    def forget(self, number: int) -> None:
        with self._lock:
            self._connections.pop(number, None)

    def from_host(self, frame: dict[str, Any]) -> None:
        if frame.get("o") == "dns":  # the host's answer to the resolver's question
            with self._lock:
                waiter = self._asked.get(int(frame.get("q", 0)))
            if waiter is not None:
                waiter[1].extend(int(port) for port in frame.get("p") or [])
                waiter[0].set()
            return
        with self._lock:
            connection = self._connections.get(int(frame.get("c", 0)))
        if connection is not None:  # one that ended meanwhile: nothing to do
            connection.from_host(frame)

    def from_host_data(self, number: int, data: bytes) -> None:
        """A data frame's bytes, queued for its connection's writer thread."""
        with self._lock:
            connection = self._connections.get(number)
        if connection is not None and not connection.ended:
            connection.outbox.put(data)

    def close(self) -> None:
        """Stop listening and end every connection (the session is closing)."""
        server, self._server = self._server, None
        capture, self.capture = self.capture, None
        self._set_lane(None)
        if capture is not None:
            capture.close()
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
