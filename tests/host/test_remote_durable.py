"""Durable sessions through the remote backend (issue 47, decision 476): a session a remote
server hosts outlives its client's process — the server detaches the hosted session and keeps
it — and ``Toolkit.attach(handle)`` in another process finds its files and running jobs. And an
attacker's view: a wrong secret, a forged address or a forged hosted handle is refused by name
(or changes nothing), and the server never holds the handle's own secret. Real server and
client processes on a unix socket of this machine, hosting the host backend."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolseam import AttachError, SessionHandle, Toolkit
from toolseam.backends.remote import HostedSpec, RemoteBackend, UnixTransport
from toolseam.backends.remote.durable import hosted_secret
from toolseam.seam.errors import ConfigurationError
from toolseam.seam.lifetime import Durable

from ..support.processes import host_survivors
from ..support.remote_server import ServerProcess, remote_server
from ..support.timing import patience

REPO = Path(__file__).resolve().parents[2]
EVERY_LINE = "".join(f"line-{i}\n" for i in range(1, 16)) + "done\n"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with remote_server() as running:
        yield running


def _durable(server: ServerProcess, workspace: Path, **settings: object) -> Toolkit:
    backend = RemoteBackend(transport=UnixTransport(server.directory),
                            hosted=HostedSpec(kind="host", options={"workspace": str(workspace)}),
                            lifetime=Durable(orphan_timeout_s=60))
    return Toolkit(backend, settings={"timeout_policy": "detach", "default_timeout_ms": 60_000,
                                      **settings})


def _killed_client(server: ServerProcess, workspace: Path, orphan_s: float, tag: str
                   ) -> SessionHandle:
    """A client process with a call in flight, killed (SIGKILL); its handle."""
    client = subprocess.Popen([sys.executable, str(REPO / "tests/support/remote_durable_client.py"),
                               str(server.directory), str(workspace), str(orphan_s), tag],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert client.stdout is not None
        handle = SessionHandle.from_json(client.stdout.readline())
        assert client.stdout.readline().strip() == "started"
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()
        if client.stdout is not None:
            client.stdout.close()
    return handle


async def test_a_killed_client_leaves_a_session_another_process_continues(
        server: ServerProcess, tmp_path: Path) -> None:
    tag = f"remote-durable-{uuid.uuid4().hex}"
    handle = _killed_client(server, tmp_path, 60, tag)
    assert handle.backend == "remote" and handle.endpoint == f"unix:{server.directory.resolve()}"
    assert handle.hosted is not None and handle.hosted.backend == "host"
    tk = await Toolkit.attach(handle.to_json())
    try:
        assert tk.adopted_jobs == [1]  # the call in flight when the client died, now a job
        done = await tk.call("bash", {"wait": 1, "timeout": 20_000})
        assert done.output == EVERY_LINE, done.output
        assert "made before the kill" in (await tk.call("read", {"path": "before.txt"})).output
        assert tk.settings.orphan_timeout_s == 60 and tk.settings.timeout_policy == "detach"
        assert tk.handle.sandbox == handle.sandbox  # the same session on its server
    finally:
        await tk.close()
    assert not os.path.exists(handle.hosted.socket)  # a close ends it at once
    assert host_survivors(tag) == []
    with pytest.raises(AttachError) as ended:
        await Toolkit.attach(handle)
    assert ended.value.reason == "ended"


async def test_detach_then_attach_keeps_jobs_and_files(server: ServerProcess,
                                                      tmp_path: Path) -> None:
    tk = _durable(server, tmp_path, default_timeout_ms=300)
    await tk.open()
    started = await tk.call("bash", {"command": "echo one; sleep 1; echo two", "keep": True})
    assert started.metadata["detached"] is True
    await tk.call("write", {"path": "kept.txt", "content": "kept\n"})
    handle = await tk.detach()
    again = await Toolkit.attach(handle)
    try:
        assert (await again.call("bash", {"wait": 1, "timeout": 10_000})).output == "one\ntwo\n"
        assert "| kept" in (await again.call("read", {"path": "kept.txt"})).output
        assert again.settings == tk.settings
    finally:
        await again.close()


async def test_an_orphan_past_its_timeout_is_ended(server: ServerProcess,
                                                  tmp_path: Path) -> None:
    tag = f"remote-orphan-{uuid.uuid4().hex}"
    handle = _killed_client(server, tmp_path, 1.5, tag)
    assert handle.hosted is not None
    deadline = time.monotonic() + patience(20)
    while os.path.exists(handle.hosted.socket):  # the hosted agent ends itself
        assert time.monotonic() < deadline, "the orphaned session outlived its timeout"
        await asyncio.sleep(0.1)
    assert host_survivors(tag) == []
    with pytest.raises(AttachError) as ended:
        await Toolkit.attach(handle)
    assert ended.value.reason == "ended"


async def test_what_an_attacker_holds_is_refused_by_name(server: ServerProcess,
                                                         tmp_path: Path) -> None:
    tk = _durable(server, tmp_path)
    await tk.open()
    try:
        handle = tk.handle
        assert handle.hosted is not None
        # the server is given one-way derivations of the secret, never the secret itself
        assert handle.hosted.secret == hosted_secret(handle.secret) != handle.secret
        assert handle.secret not in repr(handle)
        with pytest.raises(AttachError) as busy:  # held by a live client
            await Toolkit.attach(handle)
        assert busy.value.reason == "in_use"
        wrong = handle.model_copy(update={"secret": "x" * 43})
        with pytest.raises(AttachError) as refused:
            await Toolkit.attach(wrong)
        assert refused.value.reason == "wrong_secret"
        elsewhere = handle.model_copy(update={"endpoint": f"unix:{tmp_path / 'no-server'}"})
        with pytest.raises(AttachError, match="no-server") as gone:
            await Toolkit.attach(elsewhere)
        assert gone.value.reason == "gone"
        with pytest.raises(AttachError) as unknown:
            await Toolkit.attach(handle.model_copy(update={"endpoint": "tcp:127.0.0.1:1"}))
        assert unknown.value.reason == "unsupported"
        assert (await tk.call("bash", {"command": "echo alive"})).output == "alive\n"
        detached = await tk.detach()
        # a handle whose hosted part names another workspace and agent: the server attaches to
        # the session it kept, never to what a client says it hosts
        assert detached.hosted is not None
        forged = detached.model_copy(update={"hosted": detached.hosted.model_copy(
            update={"workspace": "/etc", "socket": str(tmp_path / "agent.sock")})})
        with pytest.raises(AttachError) as still_wrong:
            await Toolkit.attach(forged.model_copy(update={"secret": "y" * 43}))
        assert still_wrong.value.reason == "wrong_secret"  # and the record stays for the owner
        again = await Toolkit.attach(forged)
        tk = again
        assert again.base_dir == str(tmp_path)
    finally:
        await tk.close()


async def test_a_backend_built_to_end_with_its_client_has_no_handle(
        server: ServerProcess, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="lifetime=Durable"):
        Toolkit(RemoteBackend(transport=UnixTransport(server.directory),
                              hosted=HostedSpec(kind="host", options={"workspace": str(tmp_path)})),
                settings={"orphan_timeout_s": 30})
    smuggled = RemoteBackend(transport=UnixTransport(server.directory),
                             hosted=HostedSpec(kind="host", options={"lifetime": "durable"}))
    try:
        with pytest.raises(ConfigurationError, match="is not a hosted backend's option"):
            await smuggled.open()
    finally:
        await smuggled.close()
