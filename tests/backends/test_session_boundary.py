"""No command drives, reads or forges a durable session (issue 32; docs/security.md, "The
session's control path"). Each attack is tried as a command would, on every backend and mode it
applies to: host, podman rootful and rootless, docker (bind mode), and copy mode on the local
engines and on both remote engines (where the relay carries the connection)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolseam import AttachError, CouldNotRunError, Toolkit
from toolseam.backends import backend_for_handle
from toolseam.backends.agentlink.durable import seal_state
from toolseam.seam.lifetime import Durable
from toolseam.session.durable import session_state
from toolseam_agent.attach_auth import KEY_VAR, agent_key
from toolseam_agent.session_socket import STATE_PUT

from ..support.engines import ENGINES, REMOTE_ENGINES, backend
from ..support.sessions import attach_options
from ..support.timing import patience

PROBE = (Path(__file__).parents[1] / "support" / "boundary_probe.py").read_text()
BIND = ENGINES
COPY = (*(f"{engine}:copy" for engine in ENGINES), *REMOTE_ENGINES)


def _toolkit(engine: str, workspace: Path, **settings: object) -> Toolkit:
    if engine == "host":
        return Toolkit("host", base_dir=str(workspace),
                       settings={"orphan_timeout_s": 30, **settings})
    name, _, mode = engine.partition(":")
    options = {"workspace_mode": "copy"} if mode else {}
    return Toolkit(backend(name, str(workspace), lifetime=Durable(orphan_timeout_s=30),
                           **options),
                   settings={"orphan_timeout_s": 30, **settings})


async def _probe(tk: Toolkit, control_dir: str = "") -> dict[str, object]:
    await tk.call("write", {"path": "probe.py", "content": PROBE})
    done = await tk.call("bash", {"command": f"python3 probe.py {control_dir}"})
    assert done.metadata.get("exitCode") == 0, done.output
    result: dict[str, object] = json.loads(done.output.strip().splitlines()[-1])
    return result


def _allowed(found: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in found.items() if v == "allowed"}


@pytest.mark.parametrize("engine", BIND)
async def test_bind_mode_commands_cannot_touch_the_socket_dir_or_the_agent(
        engine: str, workspace: Path) -> None:
    """Attack 1 (bind mode): rename the agent's socket and listen in its place; and the agent
    itself — its memory, descriptors, signals, ptrace."""
    tk = _toolkit(engine, workspace)
    await tk.open()
    try:
        found = await _probe(tk, "/run/toolseam")
        assert found["found"] == {"agent": True, "relay": False}
        assert found["control listed"] == ["agent.sock"]
        assert _allowed(found) == {}, found
        assert (await tk.call("bash", {"command": "echo still"})).output == "still\n"
        handle = await tk.detach()
        again = await Toolkit.attach(handle, **attach_options(engine))  # type: ignore[arg-type]
        await again.close()
    finally:
        await tk.close()


@pytest.mark.parametrize("engine", COPY)
async def test_copy_mode_commands_cannot_reach_the_relay_or_the_agent(
        engine: str, workspace: Path) -> None:
    """Attack 2 (copy mode): the relay's memory and stdout, ptrace, the agent's abstract
    socket (a second attacher), signals."""
    tk = _toolkit(engine, workspace)
    await tk.open()
    try:
        found = await _probe(tk)
        assert found["found"] == {"agent": True, "relay": True}
        assert "abstract connect" in found
        assert _allowed(found) == {}, found
        handle = await tk.detach()
        again = await Toolkit.attach(handle, **attach_options(engine))  # type: ignore[arg-type]
        assert (await again.call("bash", {"command": "echo after"})).output == "after\n"
        await again.close()
    finally:
        await tk.close()


def _cmdline(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().split(b"\0")
    except OSError:
        return []


def _environ_of(word: bytes, address: str) -> list[dict[bytes, bytes]]:
    """The environments of this machine's processes whose command line has ``word`` followed
    by the session's agent address (the engines here share this host's pid namespace; the
    tests run as root)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            argv = _cmdline(int(name))
            if word in argv and argv[argv.index(word) + 1:][:1] == [address.encode()]:
                with open(f"/proc/{name}/environ", "rb") as environ:
                    pairs = [e.partition(b"=") for e in environ.read().split(b"\0") if e]
                found.append({k: v for k, _, v in pairs})
    return found


@pytest.mark.parametrize("engine", ("podman:copy", "docker-remote"))
async def test_the_key_is_in_no_environment_block(engine: str, workspace: Path) -> None:
    """The agent scrubs its key from its environment block at start; the relay's exec has the
    variable blanked: neither holds anything that attaches."""
    tk = _toolkit(engine, workspace)
    await tk.open()
    try:
        key = agent_key(tk.handle.secret).hex().encode()
        agents = _environ_of(b"--durable", tk.handle.socket)
        relays = _environ_of(b"--relay", tk.handle.socket)
        assert agents and relays
        assert all(env[KEY_VAR.encode()] == b"0" * 64 for env in agents)
        assert all(env.get(KEY_VAR.encode(), b"") == b"" for env in relays)
        assert not any(key in b"".join(env.values()) for env in agents + relays)
    finally:
        await tk.close()


async def test_host_commands_see_no_session_socket(workspace: Path) -> None:
    """Attack 1 (host backend): the sessions root is an empty tmpfs in the commands' mount
    namespace, so there is nothing to rename, and no place to listen instead."""
    tk = _toolkit("host", workspace)
    await tk.open()
    try:
        socket_path = tk.handle.socket
        root = os.path.dirname(os.path.dirname(socket_path))
        found = await _probe(tk, os.path.dirname(socket_path))
        assert found["control listed"] == "absent"
        listing = await tk.call("bash", {"command": f"ls -A {root} | wc -l"})
        assert listing.output.strip() == "0"
        moved = await tk.call("bash", {"command": f"mv {socket_path} {socket_path}.x"})
        assert moved.metadata["exitCode"] != 0
        assert os.path.exists(socket_path)  # the host still sees it where the handle says
    finally:
        await tk.close()


class _Relay:
    """A process in the middle: listens at ``path``, relays to ``target``, records what the
    client sent, and (``tamper``) changes a byte string in what the agent answers."""

    def __init__(self, path: str, target: str, tamper: tuple[bytes, bytes] | None) -> None:
        self.sent = bytearray()
        self._tamper = tamper
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen(4)
        self._target = target
        self._ends: list[socket.socket] = []  # closed by close(): none left for the next test
        self._threads = [threading.Thread(target=self._serve, daemon=True)]
        self._threads[0].start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            agent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._ends += [client, agent]
            agent.connect(self._target)
            for args in ((client, agent, True), (agent, client, False)):
                pump = threading.Thread(target=self._pump, args=args, daemon=True)
                self._threads.append(pump)
                pump.start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        while True:
            try:
                data = source.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            if from_client:
                self.sent += data
            elif self._tamper is not None:
                data = data.replace(*self._tamper)
            try:
                sink.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        """Both ends of every relayed connection closed (the agent reads the end of its
        client's), and the relay's threads ended."""
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self._server.close()
        for end in self._ends:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=patience(10))
        for end in self._ends:
            end.close()


@pytest.fixture(params=["host", *BIND])
def detached_host(request: pytest.FixtureRequest, workspace: Path,
                  tmp_path: Path) -> Iterator[tuple[object, Path]]:
    """A detached durable session whose socket this machine reaches (host, bind mode)."""
    tk = _toolkit(str(request.param), workspace)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(tk.open())
    handle = loop.run_until_complete(tk.detach())
    try:
        yield handle, tmp_path
        again = loop.run_until_complete(_attach_once_free(handle))
        loop.run_until_complete(again.close())
    finally:
        loop.close()


async def _attach_once_free(handle: object) -> Toolkit:
    """Attach once the test's own client has gone: the agent learns a client left when it
    reads the end of that connection, which under load can come after the test's last step
    (rehearsal 19: "another client is attached" at this fixture's teardown)."""
    deadline = time.monotonic() + patience(30)
    while True:
        try:
            return await Toolkit.attach(handle)  # type: ignore[arg-type]
        except AttachError as busy:
            if busy.reason != "in_use" or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


async def test_a_fake_agent_learns_nothing(detached_host: tuple[object, Path]) -> None:
    """A process listening where the agent should be (a swapped socket) gets a nonce, no
    secret and no key, and the client refuses it."""
    handle, tmp = detached_host
    fake = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = str(tmp / "fake.sock")
    fake.bind(path)
    fake.listen(1)
    heard = bytearray()

    def answer() -> None:
        conn, _ = fake.accept()
        heard.extend(conn.recv(1 << 16))
        request = json.loads(heard.split(b"\n")[0])
        conn.sendall(json.dumps({"id": request["id"], "ok": True, "result": {
            "nonce": "ab" * 32, "proof": "00" * 32}}).encode() + b"\n")
        conn.recv(1 << 16)
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    forged = handle.model_copy(update={"socket": path})  # type: ignore[attr-defined]
    with pytest.raises(AttachError) as refused:
        await Toolkit.attach(forged)
    assert refused.value.reason == "wrong_secret"
    secret = handle.secret.encode()  # type: ignore[attr-defined]
    assert heard and secret not in heard and agent_key(secret.decode()).hex().encode() not in heard
    fake.close()


async def test_a_relay_in_the_middle_cannot_change_an_answer(
        detached_host: tuple[object, Path]) -> None:
    handle, tmp = detached_host
    relay = _Relay(str(tmp / "mitm.sock"), handle.socket,  # type: ignore[attr-defined]
                   tamper=(b"REAL-RESULT", b"FAKE-RESULT"))
    try:
        via = handle.model_copy(update={"socket": str(tmp / "mitm.sock")})  # type: ignore[attr-defined]
        tk = await Toolkit.attach(via, raise_could_not_run=True)
        with pytest.raises(CouldNotRunError, match="seal"):
            await tk.call("bash", {"command": "echo REAL-RESULT"})
        assert handle.secret.encode() not in relay.sent  # type: ignore[attr-defined]
        assert b"REAL-RESULT" in relay.sent  # the relay did pass the call on
    finally:
        relay.close()


@pytest.mark.parametrize("engine", ("host", *BIND, *COPY))
async def test_state_rewritten_inside_is_refused_at_attach(engine: str, workspace: Path) -> None:
    """Attack 3: whoever holds the agent's key (never a command: the tests above) still cannot
    make the next client restore settings of its choosing — an egress rule, a credential read
    from the client's environment — because the state's seal needs the secret."""
    tk = _toolkit(engine, workspace)
    await tk.open()
    forged = session_state(tk)
    handle = await tk.detach()
    forged["settings"]["egress_allow"] = ["leak.test"]
    forged["settings"]["egress_credentials"] = [
        {"host": "leak.test", "header": "X-Leak", "value_env": "SOME_SECRET"}]
    options = attach_options(engine)
    middle = await Toolkit.attach(handle, **options)  # type: ignore[arg-type]
    channel = middle.backend.durable_channel()  # type: ignore[attr-defined]
    await channel.call(STATE_PUT, key="toolkit",  # sealed, but not with this session's secret
                       state=seal_state("x" * 43, "toolkit", forged))
    await middle.detach()
    with pytest.raises(AttachError) as refused:
        await Toolkit.attach(handle, **options)  # type: ignore[arg-type]
    assert refused.value.reason == "tampered"
    assert "changed it" in str(refused.value)
    # nothing was stopped, and the session is still its owner's to end
    # built to attach to the handle's session (its lifetime: Durable.attaching(handle))
    owner = backend_for_handle(handle, dict(options.get("backend_options") or {}))  # type: ignore[arg-type]
    await owner.open()
    await owner.close()
