"""Where ``toolseam mcp --http`` listens, and the secret that guards it (issue 44).

Loopback is no boundary on a shared machine: every local user reaches ``127.0.0.1``, and the
server's bash is a shell as the server's user. So a TCP listener always wants a bearer token —
the operator's (``--auth-token-file``, ``TOOLSEAM_MCP_TOKEN``) or, when none is given, one made
here: 256 random bits written to a file only this user can read, in a 0700 directory of this
user's staging root, whose *path* the start-up line names (the token itself is never printed),
and removed when the server stops. ``unix:PATH`` listens on a unix socket made with mode 0600
instead: the kernel lets only this user (and root) connect, so no token is needed there.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from ...backends.staging import UnsafePath, check_owned, staging_root
from ...seam.errors import ConfigurationError

UNIX_PREFIX = "unix:"
_PRIVATE_DIR = "mcp-tokens"


@dataclass(frozen=True)
class TcpAddress:
    host: str
    port: int


@dataclass(frozen=True)
class UnixAddress:
    path: str


def parse_address(text: str) -> TcpAddress | UnixAddress:
    """``--http``'s value: ``HOST:PORT`` (``[::1]:PORT`` for IPv6) or ``unix:PATH``."""
    if text.startswith(UNIX_PREFIX):
        path = text[len(UNIX_PREFIX):]
        if not path or "\0" in path:
            raise ConfigurationError(f"--http unix:PATH needs a path, got {text!r}")
        return UnixAddress(os.path.abspath(path))
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigurationError(f"--http takes HOST:PORT or unix:PATH, got {text!r}")
    host = host.removeprefix("[").removesuffix("]")
    if not 0 <= int(port) <= 65535:  # getaddrinfo would take 99999 as 34463
        raise ConfigurationError(f"--http {host}:{port}: a port is 0-65535")
    return TcpAddress(host, int(port))


def listen_tcp(host: str, port: int) -> socket.socket:
    """Bind and listen now, so a taken port is a one-line error and the line we print is true."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise ConfigurationError(f"--http {host}:{port}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def _remove_stale(path: str) -> None:
    """A socket of this user's that nobody serves any more (a server killed before it could
    remove it) is removed; anything else at ``path`` is left alone and refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
        raise ConfigurationError(f"--http unix:{path}: something else is there; remove it or "
                                 "choose another path")
    with socket.socket(socket.AF_UNIX) as probe:
        if probe.connect_ex(path) != errno.ECONNREFUSED:
            raise ConfigurationError(f"cannot listen on unix:{path}: a server is listening there")
    os.unlink(path)


def listen_unix(path: str) -> socket.socket:
    """A unix socket at ``path`` with mode 0600 from its first moment (made under umask 0177:
    a chmod after bind would leave a moment where others could connect)."""
    _remove_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"cannot listen on unix:{path}: {exc.strerror or exc}") from None
    finally:
        os.umask(old_umask)
    return sock


def remove_socket(path: str) -> None:
    with contextlib.suppress(OSError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)


def private_dir() -> Path:
    """``mcp-tokens`` in this user's staging root: 0700, this user's alone (checked now)."""
    path = staging_root() / _PRIVATE_DIR
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        check_owned(path, os.geteuid(), exact_owner=True)
    except UnsafePath as exc:
        raise ConfigurationError(f"cannot keep a generated token: {exc}") from None
    os.chmod(path, 0o700)
    return path


def _remove_dead_servers_tokens(directory: Path) -> None:
    """Token files of servers that were killed before they could remove their own."""
    for entry in directory.glob("mcp-*-*.token"):
        pid = entry.name.split("-")[1]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(OSError):
                entry.unlink()


def generate_token_file() -> tuple[str, Path]:
    """A new random token and the owner-only file (mode 0600, made with ``O_EXCL``) holding it."""
    token = secrets.token_hex(32)
    directory = private_dir()
    _remove_dead_servers_tokens(directory)
    path = directory / f"mcp-{os.getpid()}-{secrets.token_hex(4)}.token"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w", encoding="ascii") as out:
        out.write(token + "\n")
    return token, path
