"""Who reaches a remote server and what it takes (issue 47): another local user cannot connect
(mode 0700/0600; with those opened up, the kernel's peer uid still closes them out unread); a
peer without the server key is refused before anything it sends is decoded; a frame too large
or not of seam values is refused with a clear error and decoded into nothing; a session answers
only its own secret; and a server that dies under a call ends the session honestly
(``CouldNotRunError(cause="sandbox_lost")``), leaving no command running. Real server
processes on a unix socket of this machine; the other user is an account the test makes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.server
import os
import pickle
import signal
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolseam import Toolkit
from toolseam.backends import BACKENDS, backend_kind
from toolseam.backends.remote import HostedSpec, LoopbackTransport, RemoteBackend, RemoteServer
from toolseam.backends.remote.codec import MAX_ANSWER, MAX_REQUEST, dumps, loads
from toolseam.backends.remote.frames import (
    HELLO,
    client_handshake,
    frame,
    read_frame,
    server_handshake,
)
from toolseam.backends.remote.handshake import nonce
from toolseam.backends.remote.unix import CONTEXT, KEY, SOCKET, UnixTransport, read_key
from toolseam.frontends.mcp.server import describe
from toolseam.seam.errors import BackendUnavailable, ConfigurationError, CouldNotRunError
from toolseam.seam.models import PathRef, SpawnRequest

from ..support.local_user import run_as_other_user
from ..support.processes import host_survivors
from ..support.remote_server import ServerProcess, remote_server
from ..support.timing import patience

OTHER_CONNECT = r'''
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print(type(exc).__name__); sys.exit()
s.settimeout(10)
try:
    s.sendall(b"\0\0\0\x52toolseam-remote-1\0" + b"a" * 64)
    print("answered" if s.recv(4096) else "closed unread")
except (BrokenPipeError, ConnectionResetError):
    print("closed unread")
'''


class Exploit:
    """Whatever unpickles this runs ``touch PATH``: it must never be unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with remote_server() as running:
        yield running


async def _raw(server: ServerProcess, key: bytes | None
               ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the server, proven with ``key`` (None: no handshake yet)."""
    reader, writer = await asyncio.open_unix_connection(str(server.directory / SOCKET))
    if key is not None:
        await client_handshake(reader, writer, key, CONTEXT)
    return reader, writer


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def _refusal(reader: asyncio.StreamReader) -> str:
    """The server's one answer to a connection it ends: the error's message."""
    req, kind, (outcome, error) = loads(await read_frame(reader, MAX_ANSWER))
    assert (req, kind, outcome) == (0, "answer", "err")
    assert await reader.read() == b""  # and it hung up
    return str(error["message"])


@pytest.mark.skipif(os.geteuid() != 0, reason="another user is made and played through runuser")
def test_another_user_cannot_connect(server: ServerProcess, tmp_path: Path) -> None:
    where = server.directory / SOCKET
    assert stat.S_IMODE(server.directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(where.stat().st_mode) == 0o600
    assert stat.S_IMODE((server.directory / KEY).stat().st_mode) == 0o600
    assert run_as_other_user(OTHER_CONNECT, str(where)).stdout.strip() == "PermissionError"
    # a mistake opens the path to everyone: the kernel's peer uid still closes them out unread
    opened = (server.directory.parent, server.directory)
    try:
        for directory in opened:
            directory.chmod(0o711)
        where.chmod(0o666)
        done = run_as_other_user(OTHER_CONNECT, str(where))
        assert done.stdout.strip() == "closed unread", (done.stdout, done.stderr)
    finally:
        where.chmod(0o600)
        for directory in opened:
            directory.chmod(0o700)


async def test_without_the_key_nothing_is_decoded(server: ServerProcess, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    hostile = frame(pickle.dumps(Exploit(marker)))
    # a pickle as the hello: refused as bytes
    reader, writer = await _raw(server, None)
    writer.write(hostile)
    assert await read_frame(reader, 4096) == b"refused: not a toolseam remote hello"
    await _close(writer)
    # a good hello, a wrong proof: the server proved its key first, refused ours, read no more
    reader, writer = await _raw(server, None)
    writer.write(frame(HELLO + b"\0" + nonce().encode()))
    server_nonce, _, server_proof = (await read_frame(reader, 4096)).partition(b"\0")
    assert len(server_nonce) == len(server_proof) == 64
    writer.write(frame(os.urandom(32).hex().encode()) + hostile)
    assert await read_frame(reader, 4096) == b"refused: the client did not prove the server key"
    assert await reader.read() == b""
    await _close(writer)
    assert not marker.exists()


async def test_hostile_and_oversized_frames_are_refused_clearly(server: ServerProcess,
                                                                tmp_path: Path) -> None:
    key, marker = read_key(server.directory), tmp_path / "ran"
    reader, writer = await _raw(server, key)
    writer.write(frame(pickle.dumps((1, Exploit(marker)))))
    assert "posix.system is not a seam model" in await _refusal(reader)
    assert not marker.exists()
    await _close(writer)
    reader, writer = await _raw(server, key)
    writer.write((MAX_REQUEST + 1).to_bytes(4, "big"))  # its body is never read
    assert await _refusal(reader) == (f"a frame of {MAX_REQUEST + 1} bytes was refused "
                                      f"(at most {MAX_REQUEST})")
    await _close(writer)
    reader, writer = await _raw(server, key)
    writer.write(frame(dumps((1, ("sid", "secret")))))  # seam values, not a request
    answer = loads(await read_frame(reader, MAX_ANSWER))
    assert answer[2][1]["message"].startswith("not a remote call")
    await _close(writer)


async def test_an_oversized_answer_is_refused_by_the_client(tmp_path: Path) -> None:
    """A server (here: one that proves the key, then announces 4 GiB) cannot make the client
    read without bound: the session ends, saying why."""
    directory = tmp_path / "fake"
    directory.mkdir(mode=0o700)
    key = os.urandom(32)
    (directory / KEY).write_text(key.hex())
    (directory / KEY).chmod(0o600)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server_handshake(reader, writer, key, CONTEXT)
        await read_frame(reader, MAX_REQUEST)
        writer.write(b"\xff\xff\xff\xff")
        await reader.read()  # until the client hangs up
        await _close(writer)

    listening = await asyncio.start_unix_server(serve, str(directory / SOCKET))
    transport = UnixTransport(directory)
    try:
        backend = RemoteBackend(transport=transport, hosted=HostedSpec(kind="host"))
        with pytest.raises(CouldNotRunError) as caught:
            await backend.open()
        assert caught.value.cause == "sandbox_lost"
        assert f"a frame of {0xFFFFFFFF} bytes was refused (at most {MAX_ANSWER})" \
            in caught.value.reason
    finally:
        await transport.close()
        listening.close()
        await listening.wait_closed()


async def test_a_session_answers_only_its_secret(server: ServerProcess, tmp_path: Path) -> None:
    backend = server.backend(tmp_path)
    await backend.open()
    other = UnixTransport(server.directory)  # the same user, the server key, not the secret
    try:
        answer = await other.call((backend.session_id, "not-the-secret", "stat",
                                   (), {"ref": PathRef(base=str(tmp_path), path=".")}))
        assert answer[0] == "err" and answer[1]["code"] == "HOST_ERROR"
        assert "answers this secret" in answer[1]["message"]
        assert (await backend.stat(PathRef(base=str(tmp_path), path="."))).kind == "dir"
    finally:
        await other.close()
        await backend.close()


async def test_a_server_crash_is_sandbox_lost(tmp_path: Path) -> None:
    marker = f"remote-crash-{os.getpid()}"
    with remote_server() as server:
        backend = server.backend(tmp_path)
        await backend.open()
        call = asyncio.ensure_future(backend.start(SpawnRequest(
            job="j", argv=["/bin/sh", "-c", f"sleep 60 # {marker}"], cwd=str(tmp_path),
            env={"PATH": "/usr/bin:/bin"})))
        for _ in range(int(patience(10) / 0.02)):
            if host_survivors(marker):
                break
            await asyncio.sleep(0.02)
        server.process.send_signal(signal.SIGKILL)
        with pytest.raises(CouldNotRunError) as caught:
            await asyncio.wait_for(call, patience(10))
        assert caught.value.cause == "sandbox_lost" and not caught.value.retryable
        assert "the call may have run there" in caught.value.reason
        with pytest.raises(CouldNotRunError) as again:  # every later call says the same
            await backend.stat(PathRef(base=str(tmp_path), path="."))
        assert again.value is caught.value
        await backend.close()
    for _ in range(int(patience(10) / 0.05)):  # its agent ended the job with its channel
        if not host_survivors(marker):
            break
        await asyncio.sleep(0.05)
    assert host_survivors(marker) == []


async def test_capabilities_forward_through_the_loopback(tmp_path: Path) -> None:
    """The hosted host backend's workspace transfer and interactive processes, through the
    in-process transport (both ends through the codec); a method of the hosted backend that is
    not a row of the table is refused by the server."""
    workspace, elsewhere = tmp_path / "ws", tmp_path / "here"
    workspace.mkdir()
    elsewhere.mkdir()
    (elsewhere / "tree" / "sub").mkdir(parents=True)
    (elsewhere / "tree" / "sub" / "f.txt").write_text("uploaded")
    server = RemoteServer(str(tmp_path))
    backend: Any = RemoteBackend(transport=LoopbackTransport(server.handle, server.drop),
                                 hosted=HostedSpec(kind="host",
                                                   options={"workspace": str(workspace)}))
    try:
        await backend.open()
        await backend.upload(str(elsewhere / "tree"), "copied")
        assert (workspace / "copied" / "sub" / "f.txt").read_text() == "uploaded"
        await backend.download("copied", str(elsewhere / "back"))
        assert (elsewhere / "back" / "sub" / "f.txt").read_text() == "uploaded"
        with pytest.raises(ConfigurationError, match="exists"):
            await backend.download("copied", str(elsewhere / "back"))
        assert not (await backend.sync()).changed
        pty = await backend.pty_start(["/bin/sh", "-c", "read x; echo got $x"], str(workspace),
                                      {"PATH": "/usr/bin:/bin"}, 24, 80, True)
        await backend.pty_write(pty, b"it\n")
        seen = b""
        while b"got it" not in seen:
            out = await backend.pty_read(pty, int(patience(5) * 1000), 4096)
            seen += out.data
            assert not out.exited or b"got it" in seen, seen
        answer = await backend.transport.call((backend.session_id, backend._secret,
                                               "durable_handle", (), {}))  # the host's, not a row
        assert answer[1]["message"] == "'durable_handle' is not a seam operation"
    finally:
        await backend.close()
    assert backend.copy_back_error is None


async def test_no_server_is_unreachable_not_lost(tmp_path: Path) -> None:
    backend = RemoteBackend(transport=UnixTransport(tmp_path / "nobody"),
                            hosted=HostedSpec(kind="host", options={"workspace": str(tmp_path)}))
    with pytest.raises(CouldNotRunError) as caught:
        await backend.open()
    assert (caught.value.cause, caught.value.retryable) == ("engine_unreachable", True)
    assert "cannot be reached" in caught.value.reason
    await backend.close()


CLIENT_THAT_DIES = r'''
import asyncio, os, signal, sys
from toolseam.backends.remote import HostedSpec, RemoteBackend, UnixTransport
from toolseam.seam.models import SpawnRequest
async def main():
    backend = RemoteBackend(transport=UnixTransport(sys.argv[1]),
                            hosted=HostedSpec(kind="host", options={"workspace": sys.argv[2]}))
    await backend.start(SpawnRequest(job="j", argv=["/bin/sh", "-c", "sleep 60 # " + sys.argv[3]],
                                     cwd=sys.argv[2], env={"PATH": "/usr/bin:/bin"}, wait_ms=0))
    os.kill(os.getpid(), signal.SIGKILL)
asyncio.run(main())
'''


async def test_a_client_that_dies_leaves_nothing(server: ServerProcess, tmp_path: Path) -> None:
    """The server closes the sessions of a connection that ended: a client killed with SIGKILL
    leaves no command running."""
    marker = f"remote-orphan-{os.getpid()}"
    done = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT_THAT_DIES, str(server.directory), str(tmp_path), marker)
    assert await done.wait() == -signal.SIGKILL
    for _ in range(int(patience(10) / 0.05)):
        if not host_survivors(marker):
            break
        await asyncio.sleep(0.05)
    assert host_survivors(marker) == []
    assert server.process.poll() is None  # the server itself goes on


BIG = bytes(range(256)) * (12 << 10)  # 3 MiB: three credit windows each way


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = BIG if self.path == "/big" else b"hello through the remote server\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # the sha256 of what was sent
        got = self.rfile.read(int(self.headers["Content-Length"]))
        body = hashlib.sha256(got).hexdigest().encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        return None


async def test_egress_is_served_by_the_clients_proxy(server: ServerProcess, tmp_path: Path
                                                     ) -> None:
    """The hosted host backend in egress mode: its commands see loopback alone, and their one
    way out is this process's proxy (its rules and audit), over the remote wire."""
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    port = web.server_address[1]
    settings = {"limits": {"network": "egress"}, "egress_allow": [f"web.test:{port}"],
                "egress_resolve": {"web.test": "127.0.0.1"}, "egress_private": True}
    fetch = ("python3 -c 'import urllib.request as u, sys; "
             "print(u.urlopen(sys.argv[1]).read().decode(), end=\"\")' ")
    try:
        async with Toolkit(server.backend(tmp_path, network="egress"), base_dir=str(tmp_path),
                           settings=settings) as tools:
            allowed = await tools.call("bash", {"command": fetch + f"http://web.test:{port}/"})
            refused = await tools.call("bash", {"command": fetch + f"http://other.test:{port}/"})
            (tmp_path / "big").write_bytes(BIG)
            both_ways = await tools.call("bash", {"command": (
                "python3 -c 'import urllib.request as u, hashlib, sys; "
                "down = u.urlopen(sys.argv[1] + \"big\").read(); "
                "up = u.urlopen(sys.argv[1], data=open(\"big\", \"rb\").read()).read(); "
                "print(hashlib.sha256(down).hexdigest(), up.decode())' ")
                + f"http://web.test:{port}/"})
            direct = await tools.call("bash", {"command": "python3 -c 'import socket; "
                                      f"socket.create_connection((\"127.0.0.1\", {port}), 2)'"})
            log = [(event.host, event.allowed) for event in tools.egress_log()]
    finally:
        web.shutdown()
        web.server_close()
    assert allowed.output == "hello through the remote server\n", allowed.output
    assert refused.is_error and "403" in refused.output
    digest = hashlib.sha256(BIG).hexdigest()
    assert both_ways.output == f"{digest} {digest}\n", both_ways.output
    assert direct.is_error and "Connection refused" in direct.output
    assert log == [("web.test", True), ("other.test", False), ("web.test", True),
                   ("web.test", True)], log


async def test_the_front_ends_know_the_remote_kind(server: ServerProcess, tmp_path: Path) -> None:
    """The one backend table has a ``remote`` row: the MCP server's description of a
    ``RemoteBackend`` (read by its name) says what it is, and a session's span names its kind;
    the CLI's ``--backend`` choices leave it out (it needs a transport, not a name alone)."""
    async with Toolkit(server.backend(tmp_path)) as tk:
        text = describe(tk)
        assert "a sandbox a toolseam remote server hosts" in text, text
        assert backend_kind(tk.backend.name).name == "remote"
    assert "remote" not in BACKENDS
    with pytest.raises(BackendUnavailable, match="needs a transport"):
        Toolkit("remote")


async def test_a_session_still_ending_is_counted(tmp_path: Path) -> None:
    """A node's ``sessions`` figure counts a session until its end has returned (stop 53's CI:
    the Ray test saw the figure fall while the podman container was still being removed)."""
    from toolseam.backends.remote.server import create_hosted

    ending, release = threading.Event(), threading.Event()

    async def hosting(spec: HostedSpec, workspace: str | None) -> tuple[Any, Any]:
        backend, _after = await create_hosted(spec, workspace)

        def after() -> None:  # the hosting's own end: held until the test has looked
            ending.set()
            release.wait(patience(10))
        return backend, after

    server = RemoteServer(str(tmp_path), hosting=hosting)
    backend = RemoteBackend(transport=LoopbackTransport(server.handle, server.drop),
                            hosted=HostedSpec(kind="host", options={"workspace": str(tmp_path)}))
    await backend.open()
    assert server.sessions == 1
    closing = asyncio.create_task(backend.close())
    try:
        assert await asyncio.to_thread(ending.wait, patience(10))
        assert server.sessions == 1
    finally:
        release.set()
        await closing
    assert server.sessions == 0
