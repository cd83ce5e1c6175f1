"""Upstreams that are not HTTP, on the host's 127.0.0.1, for captured connections: an sshd of
the test's own (its config, host key and one authorized key; a bare git repository to clone
over ssh), a redis-server, and a TCP echo server."""

from __future__ import annotations

import os
import shutil
import socket
import socketserver
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_listening(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    for _ in range(200):
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited: {process.stderr.read() if process.stderr else b''!r}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port}")


@contextmanager
def _running(argv: list[str], port: int, what: str) -> Iterator[None]:
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    try:
        _wait_listening(port, process, what)
        yield
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


@dataclass
class Sshd:
    port: int
    key: Path  # the client's private key (it goes into the sandbox: a test key)
    repo: Path  # a bare repository with one commit


@contextmanager
def sshd(root: Path, repo: Path) -> Iterator[Sshd]:
    """``/usr/sbin/sshd`` on 127.0.0.1 with a config of its own: this user's login by the test
    key only, nothing else of the machine's ssh setup used."""
    root.mkdir(parents=True, exist_ok=True)
    host_key, client_key = root / "host_ed25519", root / "client_ed25519"
    for key in (host_key, client_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    authorized = root / "authorized_keys"
    shutil.copy(client_key.with_suffix(".pub"), authorized)
    authorized.chmod(0o600)
    port = free_port()
    config = root / "sshd_config"
    config.write_text(
        f"ListenAddress 127.0.0.1:{port}\nHostKey {host_key}\nAuthorizedKeysFile {authorized}\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        "PermitRootLogin prohibit-password\nStrictModes no\nPidFile none\n"
        f"AllowUsers {os.environ.get('USER') or 'root'} root\nLogLevel ERROR\n")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    with _running(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], port, "sshd"):
        yield Sshd(port, client_key, repo)


@contextmanager
def redis(root: Path) -> Iterator[int]:
    """A redis-server on 127.0.0.1 that keeps nothing on disk."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with _running(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--dir", str(root), "--protected-mode", "no"],
                  port, "redis-server"):
        yield port


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(b"echo:" + data)


class _Threaded(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextmanager
def echo_server() -> Iterator[int]:
    server = _Threaded(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
