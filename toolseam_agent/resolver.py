"""Captured connections (egress mode): a resolver inside the sandbox that answers every name
with a synthetic loopback address of its own, and a listener on that address for each port the
host's allow-list grants the name — so a program that ignores ``HTTP_PROXY`` (a Go binary, ssh,
a database client, a raw socket) still reaches the proxy, under the name it resolved.

Why addresses of 127/8 and a listener per (address, port), not interception: the sandbox has
only ``lo`` and no netfilter (no iptables binary in images, no CAP_NET_ADMIN in containers), so
there is no ``REDIRECT``/``TPROXY`` and no ``SO_ORIGINAL_DST``. The whole of 127.0.0.0/8 is
local on ``lo`` without adding anything, so the address itself says the name (one address per
name) and the listener's port says the port. A port the rules do not grant has no listener: the
connection is refused by the sandbox's own kernel, and the name's lookup was audited already.

The resolver is a UDP DNS server on 127.0.0.53:53 (``/etc/resolv.conf`` names it: the host
backend mounts its own over the host's, container backends mount one at creation). It answers
A queries; AAAA and the rest get an empty answer (clients fall back to IPv4); a name the host
grants no port is NXDOMAIN. Decisions are the host's: ``ask(name)`` returns the ports.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
from collections.abc import Callable

RESOLVER = ("127.0.0.53", 53)
RESOLV_CONF = "nameserver 127.0.0.53\noptions ndots:0\n"
_NET = (127, 100)  # synthetic addresses: 127.100.0.1 … 127.100.255.254, one per name
_TTL = 3600
_A, _AAAA, _IN = 1, 28, 1
_NOERROR, _SERVFAIL, _NXDOMAIN, _NOTIMP = 0, 2, 3, 4

RESOLV_CONF_PATH = "/etc/resolv.conf"
Ask = Callable[[str], list[int]]  # name → the ports it may reach (empty: refused)
Adopt = Callable[[socket.socket, str, int], None]  # an accepted connection, its name and port


def parse_query(packet: bytes) -> tuple[int, int, str, int, bytes] | None:
    """(id, flags, name, qtype, question section) of a one-question query; None if malformed."""
    if len(packet) < 12:
        return None
    ident, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if qdcount != 1 or flags & 0x8000:  # not one question, or an answer
        return None
    labels, at = [], 12
    while True:
        if at >= len(packet):
            return None
        size = packet[at]
        if size == 0:
            at += 1
            break
        if size > 63 or at + 1 + size > len(packet):  # no compression in a question
            return None
        labels.append(packet[at + 1:at + 1 + size])
        at += 1 + size
    if at + 4 > len(packet):
        return None
    qtype, _qclass = struct.unpack("!HH", packet[at:at + 4])
    try:
        name = b".".join(labels).decode("ascii").lower()
    except UnicodeDecodeError:
        return None
    return ident, flags, name, qtype, packet[12:at + 4]


def answer(ident: int, flags: int, question: bytes, rcode: int, address: str | None) -> bytes:
    """A response: the question echoed, and one A record when ``address`` is given."""
    out_flags = 0x8000 | (flags & 0x0100) | 0x0080 | 0x0400 | rcode  # QR, RD as asked, RA, AA
    records = b""
    if address is not None:
        records = struct.pack("!HHHIH", 0xC00C, _A, _IN, _TTL, 4) + socket.inet_aton(address)
    return struct.pack("!HHHHHH", ident, out_flags, 1, 1 if records else 0, 0, 0) + question + records


class Capture:
    """The resolver, the synthetic addresses and their listeners."""

    def __init__(self, ask: Ask, adopt: Adopt) -> None:
        self._ask, self._adopt = ask, adopt
        self._names: dict[str, str] = {}  # name → synthetic address
        self._targets: dict[tuple[str, int], str] = {}  # (address, port) → name
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._dns: socket.socket | None = None
        self._closed = False
        self.problems: list[str] = []  # what could not be set up (reported to the host)

    def start(self) -> None:
        dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        dns.bind(RESOLVER)
        self._dns = dns
        threading.Thread(target=self._serve_dns, daemon=True, name="dns").start()
        threading.Thread(target=self._serve_listeners, daemon=True, name="capture").start()

    # -- the resolver ----------------------------------------------------------------------
    def _serve_dns(self) -> None:
        assert self._dns is not None
        while not self._closed:
            try:
                packet, client = self._dns.recvfrom(4096)
            except OSError:
                return
            query = parse_query(packet)
            if query is None:
                continue
            # A lookup may wait for the host: each in its own thread, so one slow name does not
            # hold up the others (a client sends A and AAAA at once).
            threading.Thread(target=self._reply, args=(query, client), daemon=True).start()

    def _reply(self, query: tuple[int, int, str, int, bytes], client: tuple[str, int]) -> None:
        ident, flags, name, qtype, question = query
        name = name.rstrip(".")
        try:
            address = self.resolve(name)
            rcode = _NOERROR if address is not None else _NXDOMAIN
        except OSError:
            address, rcode = None, _SERVFAIL
        if qtype != _A:
            address = None  # AAAA and the rest: the name exists, with no record of that type
        with contextlib.suppress(OSError):
            assert self._dns is not None
            self._dns.sendto(answer(ident, flags, question, rcode, address), client)

    def resolve(self, name: str) -> str | None:
        """The name's synthetic address, its listeners made on first use; None if refused."""
        with self._lock:
            known = self._names.get(name)
        if known is not None:
            return known
        ports = self._ask(name) if name else []
        if not ports:
            return None
        with self._lock:
            known = self._names.get(name)
            if known is not None:
                return known
            index = len(self._names) + 1
            if index > 0xFFFE:
                raise OSError("out of synthetic addresses")
            address = f"{_NET[0]}.{_NET[1]}.{index >> 8}.{index & 0xFF}"
            self._names[name] = address
            for port in ports:
                self._listen(address, port, name)
        return address

    # -- the listeners ---------------------------------------------------------------------
    def _listen(self, address: str, port: int, name: str) -> None:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            server.bind((address, port))
            server.listen(64)
        except OSError as exc:  # a port below 1024 without the right to bind it
            server.close()
            self.problems.append(f"{name}:{port}: {exc.strerror}")
            return
        server.setblocking(False)
        self._targets[(address, port)] = name
        # epoll: a descriptor registered while the other thread waits is seen by that wait
        self._selector.register(server, selectors.EVENT_READ, (name, port))

    def _serve_listeners(self) -> None:
        while not self._closed:
            try:
                ready = self._selector.select(0.2)
            except (OSError, ValueError):
                return
            for key, _ in ready:
                name, port = key.data
                try:
                    sock, _ = key.fileobj.accept()  # type: ignore[union-attr]
                except OSError:
                    continue
                sock.setblocking(True)
                self._adopt(sock, name, port)

    def close(self) -> None:
        self._closed = True
        if self._dns is not None:
            with contextlib.suppress(OSError):
                self._dns.close()
        for key in list(self._selector.get_map().values()):
            with contextlib.suppress(OSError, KeyError, ValueError):
                self._selector.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]


def point_resolv_conf(path: str = RESOLV_CONF_PATH) -> str | None:
    """A container's ``/etc/resolv.conf`` names this resolver: rewritten in place (an engine
    bind-mounts the file, so it cannot be replaced), unless it says so already (bind mode
    mounts one read-only). Engines do not agree on ``--dns`` with no network: a remote podman
    writes its own nameserver whatever it is told. None, or why it could not be written."""
    try:
        with open(path, encoding="ascii", errors="replace") as conf:
            if conf.read() == RESOLV_CONF:
                return None
    except OSError:
        pass  # none yet: write one
    try:
        with open(path, "w", encoding="ascii") as conf:
            conf.write(RESOLV_CONF)
    except OSError as exc:
        return f"the agent cannot point {path} at its resolver: {exc.strerror}"
    return None
