"""Exposed ports (``tools.sandbox.expose``, issue 35 part 5) on every backend: an HTTP server
inside reached from here (network ``none`` in a container), a WebSocket, 50 connections at
once, a refused port closing at once, the port closed by ``close()`` and at the session's end,
a durable session's sealed channel — and what a command inside cannot make this side do.

The servers inside are python3's (the reference image has python3 and no busybox httpd): the
standard library's ``http.server`` and a small WebSocket echo written here.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from websockets.asyncio.client import connect as ws_connect

from toolseam import ConfigurationError, Toolkit
from toolseam.backends.agentlink.peer_uid import connecting_uid
from toolseam.backends.agentlink.ports import PortMux
from toolseam.backends.host import HostBackend
from toolseam.seam.capabilities import ExposedPort, ExposedPorts, supports
from toolseam.seam.lifetime import Durable
from toolseam.session.raw import RawSandbox
from toolseam.testing.fake import FakeBackend

from ..support.engines import EVERY_BACKEND, endpoint
from ..support.engines import backend as engine_backend
from ..support.local_user import other_user, run_as_other_user

BIG = 256 * 1024  # a body bigger than the stream's credit window is not (512 KiB) — and one that is
HUGE = 3 * 1024 * 1024

WS_ECHO = r'''
import base64, hashlib, socket, struct, sys, threading
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

def read(f, n):
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return data

def serve(conn):
    f = conn.makefile("rb")
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = f.readline()
        if not line:
            return
        head += line
    key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n")
           if l.lower().startswith(b"sec-websocket-key:")][0]
    accept = base64.b64encode(hashlib.sha1(key + GUID.encode()).digest())
    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    try:
        while True:
            first, second = read(f, 2)
            opcode, size = first & 15, second & 127
            if size == 126:
                size = struct.unpack(">H", read(f, 2))[0]
            elif size == 127:
                size = struct.unpack(">Q", read(f, 8))[0]
            mask = read(f, 4) if second & 128 else b"\0\0\0\0"
            masked = read(f, size)
            key = (mask * (size // 4 + 1))[:size]
            payload = (int.from_bytes(masked, "big") ^ int.from_bytes(key, "big")).to_bytes(size, "big")
            if opcode == 9:
                opcode = 10
            if size < 126:
                header = bytes([0x80 | opcode, size])
            elif size < 65536:
                header = bytes([0x80 | opcode, 126]) + struct.pack(">H", size)
            else:
                header = bytes([0x80 | opcode, 127]) + struct.pack(">Q", size)
            conn.sendall(header + payload)
            if opcode == 8:
                return
    except EOFError:
        return
    finally:
        conn.close()

server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen(64)
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
'''

# bytes that look like the channel's own frames, sent by a server inside to the client here
LOOKALIKE = (b'{"ev":"xp","c":1,"o":"open","port":22}\n{"id":0,"op":"xp","c":1,"o":"end"}\n'
             b'{"ev":"tun","c":1,"o":"open"}\n{"ev":"xp","c":1,"d":"AAAA"}\n')
LOOKALIKE_SERVER = r'''
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen(8)
payload = sys.stdin.buffer.read()
while True:
    conn, _ = server.accept()
    conn.sendall(payload)
    conn.close()
'''


def _toolkit(engine: str, workspace: Path, **settings: Any) -> Toolkit:
    if engine == "host":
        return Toolkit("host", base_dir=str(workspace), settings=settings or None)
    endpoint(engine)  # a missing engine: a visible skip (a failure in CI)
    orphan_s = float(settings.get("orphan_timeout_s") or 0)  # type: ignore[arg-type]
    lifetime = {"lifetime": Durable(orphan_timeout_s=orphan_s)} if orphan_s else {}
    return Toolkit(engine_backend(engine, str(workspace), **lifetime), settings=settings or None)


@pytest.fixture(params=EVERY_BACKEND)  # the remote engines: copy mode, "another machine"
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def tools(engine: str, workspace: Path) -> AsyncIterator[Toolkit]:
    async with _toolkit(engine, workspace) as tk:
        yield tk


def free_port() -> int:
    """A port free on this machine: the host backend's sandbox shares its loopback; a
    container's is its own (any port would do there)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def start_server(sandbox: RawSandbox, argv: list[str], port: int,
                       stdin: bytes | None = None) -> None:
    """``argv`` left running in the sandbox; returns once 127.0.0.1:port accepts there. One
    exec starts and waits for it: a command started in the same clock tick as a process an
    earlier exec left running takes it for its own (the agent's orphan attribution) and ends
    it with itself."""
    probe = ("import socket, sys, time\nfor _ in range(300):\n    try:\n"
             f"        socket.create_connection(('127.0.0.1', {port}), 1).close(); sys.exit(0)\n"
             "    except OSError:\n        time.sleep(0.05)\nsys.exit(1)")
    feed = 'f=$(mktemp); cat >"$f"; ' if stdin is not None else 'f=/dev/null; '
    started = await sandbox.exec(
        ["sh", "-c", feed + '"$@" <"$f" >/dev/null 2>&1 & exec python3 -c "$0"', probe, *argv],
        stdin=stdin, keep_detached=True, timeout=60)
    assert started.success, f"the server on {port} did not start: {started}"


async def http_get(where: ExposedPort, path: str, timeout: float = 30) -> tuple[bytes, bytes]:
    """(status line and headers, body) of one HTTP/1.0 GET, read to the end."""
    reader, writer = await asyncio.open_connection(where.host, where.port)
    writer.write(f"GET {path} HTTP/1.0\r\nHost: sandbox\r\n\r\n".encode())
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), timeout)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


async def http_server(sandbox: RawSandbox) -> tuple[int, bytes, bytes]:
    """python3's http.server in the workspace with two files; (port, small, big)."""
    small, big = b"hello from the sandbox\n", bytes(range(256)) * (HUGE // 256)
    await sandbox.write_bytes("www/index.html", small)
    await sandbox.write_bytes("www/big.bin", big)
    port = free_port()
    await start_server(sandbox, ["python3", "-m", "http.server", str(port), "--bind",
                                 "127.0.0.1", "--directory", "www"], port)
    return port, small, big


def listening_ports() -> set[int]:
    """The TCP ports this process listens on."""
    return {c.laddr.port for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


# --- every backend -------------------------------------------------------------------------
async def test_an_http_server_inside_is_reached_from_here(engine: str, tools: Toolkit) -> None:
    if engine != "host":
        assert tools.backend.network == "none"  # type: ignore[attr-defined]
    port, small, big = await http_server(tools.sandbox)
    exposed = await tools.sandbox.expose(port)
    assert (exposed.host, exposed.sandbox_port) == ("127.0.0.1", port) and exposed.port > 0
    head, body = await http_get(exposed, "/index.html")
    assert head.startswith(b"HTTP/1.0 200") and body == small
    head, body = await http_get(exposed, "/big.bin")  # several credit windows, both ends
    assert hashlib.sha256(body).digest() == hashlib.sha256(big).digest()
    assert (await tools.call("bash", {"command": "echo still here"})).output == "still here\n"


async def test_a_websocket_through_the_port(tools: Toolkit) -> None:
    await tools.sandbox.write_bytes("ws_echo.py", WS_ECHO)
    port = free_port()
    await start_server(tools.sandbox, ["python3", "ws_echo.py", str(port)], port)
    exposed = await tools.sandbox.expose(port)
    async with ws_connect(f"ws://{exposed.host}:{exposed.port}/", max_size=None) as ws:
        await ws.send("hello")
        assert await asyncio.wait_for(ws.recv(), 30) == "hello"
        blob = bytes(range(256)) * 4096  # 1 MiB in one message
        await ws.send(blob)
        assert await asyncio.wait_for(ws.recv(), 60) == blob
        await asyncio.wait_for(ws.ping(), 30)


async def test_fifty_connections_at_once(tools: Toolkit) -> None:
    port, small, _ = await http_server(tools.sandbox)
    await tools.sandbox.write_bytes("www/mid.bin", b"m" * BIG)
    exposed = await tools.sandbox.expose(port)
    answers = await asyncio.gather(*(http_get(exposed, "/mid.bin" if n % 2 else "/index.html",
                                              timeout=120) for n in range(50)))
    assert [body for _, body in answers] == [b"m" * BIG if n % 2 else small for n in range(50)]


async def test_a_refused_port_closes_the_connection_at_once(tools: Toolkit) -> None:
    nothing = free_port()  # nobody listens there inside
    exposed = await tools.sandbox.expose(nothing)
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(exposed.host, exposed.port)
    writer.write(b"GET / HTTP/1.0\r\n\r\n")
    assert await asyncio.wait_for(reader.read(), 10) == b""  # a clean end, not a hang
    assert time.monotonic() - started < 10
    writer.close()
    port, small, _ = await http_server(tools.sandbox)  # the session goes on, and so do ports
    assert (await http_get(await tools.sandbox.expose(port), "/index.html"))[1] == small


async def test_close_and_the_session_end_close_the_port(engine: str, workspace: Path) -> None:
    async with _toolkit(engine, workspace) as tools:
        port, small, _ = await http_server(tools.sandbox)
        first, second = await tools.sandbox.expose(port), await tools.sandbox.expose(port)
        assert first.port != second.port
        idle_reader, idle_writer = await asyncio.open_connection(first.host, first.port)
        await first.close()
        assert await asyncio.wait_for(idle_reader.read(), 10) == b""  # its connection ended
        idle_writer.close()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(first.host, first.port)
        assert (await http_get(second, "/index.html"))[1] == small  # the other one lives
        idle_reader, idle_writer = await asyncio.open_connection(second.host, second.port)
        await asyncio.sleep(0.2)
    assert await asyncio.wait_for(idle_reader.read(), 10) == b""
    idle_writer.close()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection(second.host, second.port)


# --- who may connect: the session's owner only (issue 44) ------------------------------------
OTHER_USERS_FETCH = r'''
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20) as s:
        s.sendall(b"GET /index.html HTTP/1.0\r\nHost: sandbox\r\n\r\n")
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    print(repr(got))
except OSError as exc:
    print(type(exc).__name__)
'''


async def test_only_the_owner_gets_through(tools: Toolkit,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """Another local user (an account the test makes) connects to the exposed port and gets
    not one byte of the sandbox's answer — the connection is closed before anything is
    carried; the owner, this process's user, is served before and after."""
    port, small, _ = await http_server(tools.sandbox)
    exposed = await tools.sandbox.expose(port)
    assert (await http_get(exposed, "/index.html"))[1] == small
    done = await asyncio.to_thread(run_as_other_user, OTHER_USERS_FETCH, exposed.host,
                                   str(exposed.port))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in ("b''", "ConnectionResetError"), done.stdout
    assert f"uid {other_user().pw_uid}" in caplog.text and "refused a connection" in caplog.text
    assert (await http_get(exposed, "/index.html"))[1] == small


def test_a_peer_with_no_local_socket_is_nobody() -> None:
    """identd's question asked of the kernel: the owner's own socket answers its uid, an
    address no socket holds (a peer elsewhere) and a closed client answer nobody."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        with accepted:
            ours = accepted.getsockname()
            assert connecting_uid(accepted.getpeername(), ours) == os.geteuid()
            assert connecting_uid(("192.0.2.1", 40000), ours) is None
            client.close()
            for _ in range(100):  # the closed socket leaves the table (TIME_WAIT: no owner)
                if connecting_uid(accepted.getpeername(), ours) is None:
                    break
                time.sleep(0.01)
            assert connecting_uid(accepted.getpeername(), ours) is None


# --- what a command inside cannot do -------------------------------------------------------
async def test_a_command_inside_opens_no_listener_and_forges_no_frame(tools: Toolkit) -> None:
    """A server inside that answers with the channel's own frame text, and commands that
    listen and connect inside: this process listens only where the owner asked, and the
    bytes reach the client as bytes."""
    before = listening_ports()
    await tools.sandbox.write_bytes("lookalike.py", LOOKALIKE_SERVER)
    port = free_port()
    await start_server(tools.sandbox, ["python3", "lookalike.py", str(port)], port,
                       stdin=LOOKALIKE)
    exposed = await tools.sandbox.expose(port)
    plain_port, small, _ = await http_server(tools.sandbox)
    plain = await tools.sandbox.expose(plain_port)
    for _ in range(3):
        reader, writer = await asyncio.open_connection(exposed.host, exposed.port)
        assert await asyncio.wait_for(reader.read(), 10) == LOOKALIKE
        writer.close()
    # the frames' text on a command's output, and listeners and connections inside
    noise = await tools.sandbox.exec(["python3", "-c", (
        "import socket, sys\n"
        f"sys.stdout.write({LOOKALIKE.decode()!r}); sys.stdout.flush()\n"
        "kept = []\n"
        "for _ in range(2):\n"
        "    s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); kept.append(s)\n"
        f"for _ in range(5): socket.create_connection(('127.0.0.1', {port})).close()\n")])
    assert noise.success and noise.stdout == LOOKALIKE.decode()
    assert listening_ports() - before == {exposed.port, plain.port}
    assert (await http_get(plain, "/index.html"))[1] == small


async def test_frames_from_the_agent_cannot_open_or_redirect_a_stream() -> None:
    """The host's side of the streams, fed what a hostile agent could send: a claim to open
    a stream (egress's way), data for a stream never opened. Nothing opens, nothing listens."""
    sent: list[Any] = []
    mux = PortMux(sent.append)
    before = listening_ports()
    mux.event({"c": 7, "o": "open", "port": 22, "host": "192.0.2.1"})
    assert mux.open_connections == 0 and sent == []
    mux.data(8, b"GET / HTTP/1.0\r\n\r\n")  # for a stream that is not ours: told to end it
    assert sent == [{"id": 0, "op": "xp", "c": 8, "o": "end"}]
    assert listening_ports() == before and mux.listeners == set()


# --- durable sessions: the sealed channel ----------------------------------------------------
@pytest.mark.parametrize("engine", ("host", "docker", "podman-remote"))
async def test_a_durable_session_carries_the_port_until_detach(engine: str,
                                                                workspace: Path) -> None:
    tools = _toolkit(engine, workspace, orphan_timeout_s=60)
    await tools.open()
    port, small, _ = await http_server(tools.sandbox)
    exposed = await tools.sandbox.expose(port)
    assert (await http_get(exposed, "/index.html"))[1] == small
    handle = await tools.detach()  # the port is this client's: it closes, the server lives
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection(exposed.host, exposed.port)
    again = await Toolkit.attach(handle)
    try:
        exposed = await again.sandbox.expose(port)
        assert (await http_get(exposed, "/index.html"))[1] == small
    finally:
        await again.close()


# --- the capability and its arguments --------------------------------------------------------
async def test_the_capability_and_bad_arguments(workspace: Path) -> None:
    assert supports(HostBackend(str(workspace)), ExposedPorts)
    assert not supports(FakeBackend(), ExposedPorts)
    async with Toolkit(FakeBackend()) as fake:
        with pytest.raises(ConfigurationError, match="fake backend cannot carry a sandbox port"):
            await fake.sandbox.expose(80)
    async with _toolkit("host", workspace) as tools:
        for bad in (0, 65536, -1, True, "80", 8.0):
            with pytest.raises(ValueError, match="port must be a whole number"):
                await tools.sandbox.expose(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="host_port"):
            await tools.sandbox.expose(80, host_port=70000)
        with pytest.raises(ValueError, match="host must be"):
            await tools.sandbox.expose(80, host="")
        taken = await tools.sandbox.expose(80)
        with pytest.raises(OSError):  # the address is in use here: said, nothing left open
            await tools.sandbox.expose(80, host_port=taken.port)
        assert listening_ports() >= {taken.port}


@pytest.mark.parametrize("engine", ("host", "docker"))
async def test_a_client_that_resets_mid_download_ends_only_its_stream(
        engine: str, workspace: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A client that resets its connection while the sandbox still sends: nothing more is
    written to it (asyncio logs each write to a lost socket), and the port goes on."""
    import struct
    async with _toolkit(engine, workspace) as tools:
        port, small, _ = await http_server(tools.sandbox)
        exposed = await tools.sandbox.expose(port)
        def reset_mid_download() -> None:  # a blocking client: in a thread, off the loop
            with socket.create_connection((exposed.host, exposed.port), timeout=30) as client:
                client.sendall(b"GET /big.bin HTTP/1.0\r\n\r\n")
                client.recv(1 << 16)
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

        for _ in range(3):
            await asyncio.to_thread(reset_mid_download)
            await asyncio.sleep(0.5)  # the sandbox's frames keep coming meanwhile
        assert (await http_get(exposed, "/index.html"))[1] == small
    assert "socket.send() raised exception" not in caplog.text


def test_no_write_reaches_a_client_already_lost() -> None:
    """Frames the sandbox sent before it heard of a client's reset are dropped, not written
    to the lost socket (asyncio logs each such write)."""
    from toolseam.backends.agentlink.ports import _SandboxSide

    class LostClient(asyncio.Transport):
        written: list[bytes] = []

        def is_closing(self) -> bool:
            return True

        def write(self, data: Any) -> None:
            self.written.append(bytes(data))

    lost = LostClient()
    _SandboxSide(lost).data_received(b"x" * 100)
    assert lost.written == []
