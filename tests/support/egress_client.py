"""The client the egress tests run INSIDE a sandbox (copied into its workspace; the test image
has python3 and nothing else, so: the standard library alone, Python 3.11).

    python3 egress_client.py COMMAND JSON-ARGS

prints one JSON object. The proxy comes from the environment toolseam gives every command in
egress mode (``HTTP_PROXY`` …, ``SSL_CERT_FILE``), as any client there would find it.
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import json
import os
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any


def pattern(size: int) -> bytes:
    block = bytes(range(256)) * 256
    return (block * (size // len(block) + 1))[:size]


def _proxy() -> tuple[str, int]:
    url = os.environ["HTTP_PROXY"].removeprefix("http://")
    host, port = url.rstrip("/").rsplit(":", 1)
    return host, int(port)


def get(url: str, cafile: str | None = None, timeout: float = 30,
        method: str = "GET") -> dict[str, Any]:
    """A request (GET unless told) through the proxy the environment names; the status and the
    start of the body."""
    context = ssl.create_default_context(cafile=cafile) if cafile else None
    try:
        request = urllib.request.Request(url, method=method)
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            body = response.read()
            return {"status": response.status, "body": body[:4000].decode("latin-1"),
                    "size": len(body)}
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return {"status": exc.code, "body": body[:4000].decode("latin-1"), "size": len(body)}
    except (OSError, ValueError) as exc:
        return {"status": None, "error": f"{type(exc).__name__}: {exc}"}


def raw(request: str, timeout: float = 30) -> dict[str, Any]:
    """``request`` as it is to the proxy (a client that ignores ``NO_PROXY``); its answer."""
    with socket.create_connection(_proxy(), timeout=timeout) as sock:
        sock.sendall(request.encode())
        answer = b""
        while data := sock.recv(1 << 16):
            answer += data
    return {"answer": answer.decode("latin-1")}


def many(url: str, count: int) -> dict[str, Any]:
    """``count`` GETs at once (one thread each, all started before any is answered)."""
    barrier = threading.Barrier(count)

    def one(_: int) -> Any:
        barrier.wait(30)
        return get(url)["status"]

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return {"statuses": list(pool.map(one, range(count)))}


def connect(host: str, port: int, timeout: float = 30) -> socket.socket:
    """A CONNECT tunnel through the proxy; raises with the proxy's answer if refused."""
    sock = socket.create_connection(_proxy(), timeout=timeout)
    sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(1)
        if not data:
            raise ConnectionError(f"the proxy closed during CONNECT: {head!r}")
        head += data
    if not head.startswith(b"HTTP/1.1 200"):
        sock.close()
        raise ConnectionError(head.decode("latin-1"))
    return sock


def sized(host: str, port: int, up: int, down: int, cut: int | None = None) -> dict[str, Any]:
    """The ``UP DOWN`` exchange (tests/support/egress_servers.py ``_Sized``) in a tunnel: what
    arrived, and whether it is what the server sent; ``cut``: stop reading after that many bytes
    of the answer and close."""
    sock = connect(host, port)
    sent = pattern(up)
    sender = threading.Thread(target=lambda: sock.sendall(f"{up} {down}\n".encode() + sent))
    sender.start()
    received = bytearray()
    while cut is None or len(received) < cut:
        data = sock.recv(1 << 16)
        if not data:
            break
        received += data
    sender.join()
    sock.close()
    if cut is not None:
        return {"received": len(received)}
    digest_ok = bytes(received[:64]) == hashlib.sha256(sent).hexdigest().encode()
    return {"digest_ok": digest_ok, "received": len(received) - 64,
            "intact": bytes(received[64:]) == pattern(down)}


def over_the_limit(host: str, port: int, hold: int) -> dict[str, Any]:
    """Hold ``hold`` tunnels open, then ask for one more: the proxy's answer to it."""
    held = [connect(host, port) for _ in range(hold)]
    answer = raw(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n", timeout=10)
    for sock in held:
        sock.close()
    return answer


def _errno_of(action: Any) -> str:
    try:
        action()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def probe(tcp_port: int, udp_port: int, addresses: list[str],
          unix_paths: list[str] | None = None) -> dict[str, Any]:
    """Every way around the proxy: raw TCP and UDP to the host's 127.0.0.1 listeners, a route
    to each address (a UDP connect only looks the route up: it sends nothing), DNS, and the
    host's engine API sockets (one request there starts a container on any network)."""
    found: dict[str, Any] = {}
    sockets = {}
    for path in unix_paths or []:
        def unix(path: str = path) -> None:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(3)
                sock.connect(path)

        sockets[path] = _errno_of(unix)
    found["unix"] = sockets
    with open("/proc/net/dev", encoding="ascii") as table:
        found["interfaces"] = [line.split(":", 1)[0].strip() for line in table.readlines()[2:]]

    def tcp() -> None:
        with socket.create_connection(("127.0.0.1", tcp_port), timeout=3) as sock:
            sock.sendall(b"hello from inside\n")

    found["tcp"] = _errno_of(tcp)

    def udp() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x04pypi\x03org\x00\x00\x01\x00\x01"
            for _ in range(3):
                sock.sendto(query, ("127.0.0.1", udp_port))

    found["udp_sent"] = _errno_of(udp)  # sendto on loopback succeeds; nothing may receive it
    nameservers = []
    try:
        with open("/etc/resolv.conf", encoding="ascii") as conf:
            nameservers = [line.split()[1] for line in conf if line.startswith("nameserver")]
    except OSError:
        pass
    routes = {}
    for address in [*addresses, *nameservers]:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET

        def route(address: str = address, family: int = family) -> None:
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect((address, 53))

        routes[address] = _errno_of(route)
    found["routes"] = routes
    found["nameservers"] = nameservers
    # Only once no route out is proven: then a lookup cannot send anything anywhere.
    # (the sandbox's own resolver on loopback, 127.0.0.53, is the one way a name is answered)
    if all(result != "ok" for where, result in routes.items() if not where.startswith("127.")):
        found["dns"] = _errno_of(lambda: socket.getaddrinfo("pypi.org", 443))
    return found


def loop(seconds: float, marker: str, allowed: str, refused: str) -> dict[str, Any]:
    """Open connections to the proxy as fast as possible: allowed and refused CONNECTs,
    garbage, requests cut mid-head, sockets dropped at once. Writes ``marker`` once going; stops
    when ``marker.stop`` exists (the test's own calls are done), or after ``seconds``."""
    end = time.monotonic() + seconds
    stop = marker + ".stop"
    counts = {"opened": 0, "errors": 0}
    lock = threading.Lock()

    def worker(kind: int) -> None:
        while time.monotonic() < end and not os.path.exists(stop):
            try:
                sock = socket.create_connection(_proxy(), timeout=10)
                with sock:
                    if kind == 0:
                        sock.sendall(f"CONNECT {allowed} HTTP/1.1\r\n\r\n".encode())
                        sock.recv(100)
                    elif kind == 1:
                        sock.sendall(f"CONNECT {refused} HTTP/1.1\r\n\r\n".encode())
                        sock.recv(4096)
                    elif kind == 2:
                        sock.sendall(os.urandom(300) + b"\r\n\r\n")
                        sock.recv(4096)
                    elif kind == 3:
                        sock.sendall(b"GET http://" + allowed.encode() + b"/ HTTP/1.1\r\nHo")
                    # kind 4: connect and drop
                with lock:
                    counts["opened"] += 1
            except OSError:
                with lock:
                    counts["errors"] += 1

    threads = [threading.Thread(target=worker, args=(i % 5,)) for i in range(10)]
    for thread in threads:
        thread.start()
    with open(marker, "w", encoding="ascii") as going:
        going.write("going\n")
    for thread in threads:
        thread.join()
    return counts


def stream(url: str, progress: str) -> dict[str, Any]:
    """Read an endless body; ``progress`` says how far, and at the end how it ended."""
    received = 0
    how = "eof"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            while data := response.read(1 << 16):
                received += len(data)
                with open(progress, "w", encoding="ascii") as out:
                    out.write(f"reading {received}\n")
    except (OSError, ValueError) as exc:
        how = f"{type(exc).__name__}: {exc}"
    with open(progress, "w", encoding="ascii") as out:
        out.write(f"ended ({how}) after {received}\n")
    return {"received": received, "how": how}


def download(url: str) -> dict[str, Any]:
    """The benchmark's client: a whole body in 1 MiB reads, timed from the request."""
    started = time.perf_counter()
    size = 0
    with urllib.request.urlopen(url, timeout=300) as response:
        while data := response.read(1 << 20):
            size += len(data)
    return {"bytes": size, "seconds": time.perf_counter() - started}


def scan(secret_reversed_b64: str, roots: list[str]) -> dict[str, Any]:
    """Where the secret is: every process's environment and command line, every file under
    ``roots``. The secret arrives reversed, so no command line here carries it."""
    secret = base64.b64decode(secret_reversed_b64)[::-1]
    hits: list[str] = []
    processes = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        processes += 1
        for name in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as source:
                    if secret in source.read():
                        hits.append(f"/proc/{pid}/{name}")
            except OSError:
                pass
    files = 0
    skip = {"/proc", "/sys", "/dev"}
    for root in roots:
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if os.path.join(folder, d) not in skip]
            for name in names:
                path = os.path.join(folder, name)
                try:
                    if not os.path.isfile(path) or os.path.islink(path):
                        continue
                    with open(path, "rb") as source:
                        files += 1
                        if secret in source.read():
                            hits.append(path)
                except OSError:
                    pass
    return {"hits": hits, "processes": processes, "files": files}


def main() -> None:
    command, args = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    print(json.dumps(globals()[command](**args)))


if __name__ == "__main__":
    main()
