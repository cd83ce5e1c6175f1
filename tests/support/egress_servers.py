"""Real upstream servers on 127.0.0.1 for the egress tests (and benchmarks/egress.py).

Every server binds 127.0.0.1 only; names such as ``web.test`` reach them through the policy's
``egress_resolve`` pins, so no test ever resolves or connects anywhere else.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import http.server
import io
import ipaddress
import json
import shutil
import socket
import socketserver
import ssl
import subprocess
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class UpstreamCA:
    """A CA and one server certificate for ``names``, as PEM files under a directory."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def make_test_ca(directory: Path, names: list[str]) -> UpstreamCA:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False),
                         critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    sans.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    result = UpstreamCA(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    result.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    result.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    result.key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                  serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return result


@dataclass
class Seen:
    """What an upstream received: one dict of headers per request, and the paths."""

    requests: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Quiet(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass


def _web_handler(seen: Seen, secret_header: str | None, secret: str | None,
                 blob: bytes) -> type[http.server.BaseHTTPRequestHandler]:
    class Web(_Quiet):
        def _record(self) -> None:
            with seen.lock:
                seen.requests.append({k.lower(): v for k, v in self.headers.items()})
                seen.paths.append(self.path)

        def do_GET(self) -> None:
            self._record()
            if self.path.startswith("/blob"):
                self._send(200, blob, "application/octet-stream")
            elif self.path.startswith("/private"):
                # Says only WHETHER the credential arrived: never its value.
                ok = secret_header is not None and self.headers.get(secret_header) == secret
                self._send(200 if ok else 401, b"authorized\n" if ok else b"no credential\n")
            elif self.path.startswith("/reflect"):
                # An upstream that shows a request's headers, values and all (as httpbin's
                # /headers does, or an error page quoting the request): what it answers is
                # what the sandbox reads.
                self._send(200, json.dumps(dict(self.headers.items())).encode())
            else:
                names = sorted(k.lower() for k in self.headers)
                self._send(200, json.dumps({"path": self.path, "headers": names}).encode())

        def do_TRACE(self) -> None:
            """TRACE as RFC 9110 has it: the request as received, as the body."""
            self._record()
            head = f"{self.requestline}\r\n{self.headers}".encode("latin-1")
            self._send(200, head, "message/http")

        def do_POST(self) -> None:
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                body = b""
                while size := int(self.rfile.readline().split(b";")[0], 16):
                    body += self.rfile.read(size)
                    self.rfile.readline()
                while self.rfile.readline() not in (b"\r\n", b""):
                    pass  # trailers
            else:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
            self._record()
            self._send(200, f"got {len(body)} bytes".encode())

        def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Web


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


@contextmanager
def serve(handler: type[http.server.BaseHTTPRequestHandler],
          tls: UpstreamCA | None = None) -> Iterator[int]:
    """Run ``handler`` on 127.0.0.1 (TLS with ``tls``'s certificate); yields the port."""
    server = _Server(("127.0.0.1", 0), handler)
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls.cert_file, tls.key_file)
        server.socket = context.wrap_socket(server.socket, server_side=True,
                                            do_handshake_on_connect=False)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextmanager
def web_server(seen: Seen, *, tls: UpstreamCA | None = None, secret_header: str | None = None,
               secret: str | None = None, blob: bytes = b"") -> Iterator[int]:
    with serve(_web_handler(seen, secret_header, secret, blob), tls) as port:
        yield port


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- git smart HTTP ---------------------------------------------------------------------------
def make_bare_repo(root: Path) -> Path:
    """``root/repo.git`` with one commit whose README says "hello egress"."""
    work = root / "work"
    work.mkdir(parents=True)
    env = {"GIT_CONFIG_NOSYSTEM": "1", "HOME": str(root), "PATH": "/usr/bin:/bin"}
    def git(*args: str, cwd: Path = work) -> None:
        subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)
    git("init", "-q", "-b", "main")
    (work / "README").write_text("hello egress\n")
    git("add", "README")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    git("clone", "-q", "--bare", str(work), str(root / "repo.git"), cwd=root)
    shutil.rmtree(work)
    return root / "repo.git"


def git_handler(project_root: Path, header: str,
                expected: str) -> type[http.server.BaseHTTPRequestHandler]:
    """``git http-backend`` as CGI, answering 401 unless ``header`` carries ``expected``."""
    backend = Path(subprocess.run(["git", "--exec-path"], capture_output=True, text=True,
                                  check=True).stdout.strip()) / "git-http-backend"

    class Git(_Quiet):
        def do_GET(self) -> None:
            self._cgi()

        def do_POST(self) -> None:
            self._cgi()

        def _cgi(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(length) if length else b""
            if self.headers.get(header) != expected:
                message = b"credential required\n"
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="egress test"')
                self.send_header("Content-Length", str(len(message)))
                self.end_headers()
                self.wfile.write(message)
                return
            path, _, query = self.path.partition("?")
            env = {"GIT_PROJECT_ROOT": str(project_root), "GIT_HTTP_EXPORT_ALL": "1",
                   "PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": self.command,
                   "CONTENT_TYPE": self.headers.get("content-type", ""),
                   "CONTENT_LENGTH": str(len(body)), "REMOTE_ADDR": "127.0.0.1",
                   "HTTP_CONTENT_ENCODING": self.headers.get("content-encoding", ""),
                   "GIT_PROTOCOL": self.headers.get("git-protocol", ""), "PATH": "/usr/bin:/bin"}
            out = subprocess.run([str(backend)], input=body, env=env, capture_output=True,
                                 check=False).stdout
            raw_head, _, payload = out.partition(b"\r\n\r\n")
            if not _:
                raw_head, _, payload = out.partition(b"\n\n")
            status, headers = 200, []
            for line in raw_head.decode("latin-1").splitlines():
                name, _, value = line.partition(":")
                if name.lower() == "status":
                    status = int(value.split()[0])
                else:
                    headers.append((name, value.strip()))
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Git


# -- a simple package index -------------------------------------------------------------------
def make_index(root: Path) -> Path:
    """``root/simple/tiny-egress/`` listing one hand-made wheel under ``root/files/``."""
    files = root / "files"
    files.mkdir(parents=True)
    wheel = files / "tiny_egress-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("tiny_egress/__init__.py", "VALUE = 1\n")
        archive.writestr("tiny_egress-1.0.dist-info/METADATA",
                         "Metadata-Version: 2.1\nName: tiny-egress\nVersion: 1.0\n")
        archive.writestr("tiny_egress-1.0.dist-info/WHEEL",
                         "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr("tiny_egress-1.0.dist-info/RECORD", "")
    project = root / "simple" / "tiny-egress"
    project.mkdir(parents=True)
    (root / "simple" / "index.html").write_text(
        '<!DOCTYPE html><html><body><a href="tiny-egress/">tiny-egress</a></body></html>\n')
    (project / "index.html").write_text(
        '<!DOCTYPE html><html><body><a href="../../files/tiny_egress-1.0-py3-none-any.whl">'
        "tiny_egress-1.0-py3-none-any.whl</a></body></html>\n")
    return root


def static_handler(directory: Path, seen: Seen | None = None) -> type[http.server.BaseHTTPRequestHandler]:
    """``python -m http.server``'s handler, serving ``directory``, quiet; with ``seen``, every
    request's headers and path recorded."""
    class Static(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(directory), **kwargs)  # type: ignore[arg-type]

        def send_head(self) -> io.BytesIO | BinaryIO | None:
            if seen is not None:
                with seen.lock:
                    seen.requests.append({k.lower(): v for k, v in self.headers.items()})
                    seen.paths.append(self.path)
            return super().send_head()

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Static


def make_npm_registry(root: Path, tarball_base: str) -> Path:
    """``root/tiny-egress``: the packument of one package, as a registry answers
    ``GET /tiny-egress`` (enough for ``npm view``)."""
    root.mkdir(parents=True)
    (root / "tiny-egress").write_text(json.dumps({
        "name": "tiny-egress", "dist-tags": {"latest": "1.0.0"},
        "versions": {"1.0.0": {"name": "tiny-egress", "version": "1.0.0", "dist": {
            "tarball": f"{tarball_base}/tiny-egress-1.0.0.tgz", "shasum": "0" * 40}}}}))
    return root


# -- raw TCP upstreams for the in-sandbox tests (tests/backends/test_egress_sandbox.py) ----------------
class _Threaded(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


@contextmanager
def _run_tcp(handler: type[socketserver.BaseRequestHandler],
             server: type[socketserver.TCPServer] = _Threaded) -> Iterator[socketserver.TCPServer]:
    made = server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=made.serve_forever, daemon=True)
    thread.start()
    try:
        yield made
    finally:
        made.shutdown()
        made.server_close()
        thread.join(5)


def pattern(size: int) -> bytes:
    """``size`` bytes that are not all alike (a cut or a reorder shows in a digest)."""
    block = bytes(range(256)) * 256  # 64 KiB
    return (block * (size // len(block) + 1))[:size]


class _Sized(socketserver.BaseRequestHandler):
    """``UP DOWN\\n`` then UP bytes in; the SHA-256 of those (64 hex bytes) and DOWN bytes of
    ``pattern`` out; then the server closes its end (the answer is cut there, not framed)."""

    def handle(self) -> None:
        sock: socket.socket = self.request
        head = b""
        while not head.endswith(b"\n"):
            byte = sock.recv(1)
            if not byte:
                return
            head += byte
        up, down = (int(part) for part in head.split())
        digest = hashlib.sha256()
        left = up
        while left:
            data = sock.recv(min(left, 1 << 16))
            if not data:
                return
            digest.update(data)
            left -= len(data)
        with contextlib.suppress(OSError):  # a client may cut its read short on purpose
            sock.sendall(digest.hexdigest().encode() + pattern(down))
            sock.shutdown(socket.SHUT_WR)


@contextmanager
def sized_server() -> Iterator[int]:
    """The ``UP DOWN`` protocol of ``_Sized`` on 127.0.0.1; yields the port."""
    with _run_tcp(_Sized) as server:
        yield server.server_address[1]


@dataclass
class Streams:
    """What the streaming upstream saw: per connection, bytes sent and whether it ended."""

    started: list[threading.Event] = field(default_factory=list)
    ended: list[threading.Event] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _stream_handler(streams: Streams) -> type[socketserver.BaseRequestHandler]:
    class Stream(socketserver.BaseRequestHandler):
        """An HTTP GET answered with an endless body (``/stream``: 64 KiB every 20 ms) or
        ``/stall``: 1 MiB, then nothing, until the connection ends."""

        def handle(self) -> None:
            sock: socket.socket = self.request
            head = b""
            while b"\r\n\r\n" not in head:
                data = sock.recv(4096)
                if not data:
                    return
                head += data
            stall = b" /stall" in head.split(b"\r\n", 1)[0]
            with streams.lock:
                index = len(streams.ended)
                streams.started.append(threading.Event())
                streams.ended.append(threading.Event())
                streams.sent.append(0)
            try:
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                             b"Connection: close\r\n\r\n")
                streams.started[index].set()
                if stall:
                    sock.sendall(pattern(1 << 20))
                    streams.sent[index] += 1 << 20
                    sock.settimeout(None)
                    while sock.recv(4096):  # until the proxy ends the connection
                        pass
                    return
                chunk = pattern(1 << 16)
                while True:
                    sock.sendall(chunk)
                    streams.sent[index] += len(chunk)
                    time.sleep(0.02)
            except OSError:
                return
            finally:
                streams.ended[index].set()

    return Stream


@contextmanager
def stream_server(streams: Streams) -> Iterator[int]:
    with _run_tcp(_stream_handler(streams)) as server:
        yield server.server_address[1]


@dataclass
class Trap:
    """A listener that must never be reached from inside a sandbox: it counts what arrives."""

    port: int
    hits: list[str] = field(default_factory=list)


@contextmanager
def tcp_trap() -> Iterator[Trap]:
    """A TCP listener on the host's 127.0.0.1 recording every connection it accepts."""
    trap = Trap(0)

    class Count(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            trap.hits.append(f"tcp from {self.client_address}")

    with _run_tcp(Count) as server:
        trap.port = server.server_address[1]
        yield trap


@contextmanager
def udp_trap() -> Iterator[Trap]:
    """A UDP socket on the host's 127.0.0.1 recording every datagram (a DNS server would
    answer; this one only counts)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    trap = Trap(sock.getsockname()[1])
    stop = threading.Event()

    def receive() -> None:
        while not stop.is_set():
            try:
                data, peer = sock.recvfrom(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            trap.hits.append(f"udp {len(data)} bytes from {peer}")

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    try:
        yield trap
    finally:
        stop.set()
        thread.join(5)
        sock.close()
