"""The caller's workspace copied to a remote server and back (``RemoteBackend(workspace=…)``,
``backends/remote/copied.py``): the base dir reaches the hosted backend at open, ``sync`` and
``close`` bring the sandbox's work home by the copy-back rule (a change made on both sides
kept as a conflict copy, never overwritten), and the server keeps nothing of it after the
session. A real server process on a unix socket; the host backend hosted there."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolseam.backends.remote import (
    HostedSpec,
    LoopbackTransport,
    RemoteBackend,
    RemoteServer,
    UnixTransport,
    copied,
)
from toolseam.seam.errors import ConfigurationError, CouldNotRunError
from toolseam.seam.lifetime import Durable
from toolseam.seam.models import PathRef, SpawnRequest

from ..support.remote_server import ServerProcess, remote_server


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with remote_server() as running:
        yield running


def _copied(server: ServerProcess, base: Path) -> RemoteBackend:
    return RemoteBackend(transport=UnixTransport(server.directory), hosted=HostedSpec(kind="host"),
                         workspace=str(base))


async def test_the_workspace_goes_there_and_comes_home(server: ServerProcess,
                                                       tmp_path: Path) -> None:
    base = tmp_path / "base"
    (base / "src").mkdir(parents=True)
    (base / "src" / "a.py").write_text("one\n")
    (base / "both.txt").write_text("original\n")
    (base / "gone.txt").write_text("to delete\n")
    backend = _copied(server, base)
    try:
        info = await backend.open()
        there = Path(info.workspace)
        assert there != base and (there / "src" / "a.py").read_text() == "one\n"
        assert "copied-" in str(there)  # a private directory of the server's spool
        await backend.write(PathRef(base=str(there), path="src/a.py"), b"two\n")
        await backend.write(PathRef(base=str(there), path="new.txt"), b"made there\n")
        report = await backend.sync()
        assert (base / "src" / "a.py").read_text() == "two\n"
        assert (base / "new.txt").read_text() == "made there\n"
        assert report.changed
        # changed on both sides since the last sync: the base dir's stays, theirs beside it
        (base / "both.txt").write_text("here\n")
        await backend.write(PathRef(base=str(there), path="both.txt"), b"there\n")
        os.remove(there / "gone.txt")
    finally:
        await backend.close()
    assert backend.copy_back_error is None
    assert (base / "both.txt").read_text() == "here\n"
    conflicts = [p for p in os.listdir(base) if p.startswith("both.txt.toolseam-conflict")]
    assert conflicts and (base / conflicts[0]).read_text() == "there\n"
    assert not (base / "gone.txt").exists()
    assert not there.exists()  # the server's copy went with the session


async def test_a_copied_workspace_is_refused_where_nobody_brings_it_home(
        server: ServerProcess, tmp_path: Path) -> None:
    transport = UnixTransport(server.directory)
    with pytest.raises(ConfigurationError, match="durable session"):
        RemoteBackend(transport=transport, hosted=HostedSpec(kind="host"),
                      workspace=str(tmp_path), lifetime=Durable(orphan_timeout_s=5))
    with pytest.raises(ConfigurationError, match="hosted options name none"):
        RemoteBackend(transport=transport, hosted=HostedSpec(
            kind="host", options={"workspace": str(tmp_path)}), workspace=str(tmp_path))
    await transport.close()


async def test_a_link_in_the_copy_is_not_followed_home(server: ServerProcess,
                                                       tmp_path: Path) -> None:
    """A symlink the sandbox makes crosses as a link: nothing it points to is read or
    written on either side."""
    base, outside = tmp_path / "base", tmp_path / "outside.txt"
    base.mkdir()
    outside.write_text("mine\n")
    backend = _copied(server, base)
    try:
        info = await backend.open()
        os.symlink(str(outside), Path(info.workspace) / "escape")
        await backend.sync()
    finally:
        await backend.close()
    assert (base / "escape").is_symlink() and outside.read_text() == "mine\n"


async def test_an_operator_lists_the_sessions_and_ends_one(
        tmp_path: Path) -> None:
    """``RemoteServer.rows`` (``toolseam ps --ray``'s rows of a node's remote sessions): each
    open session with its kind and calls, never its secret; one is ended from outside by its
    backend's ``kill_sandbox`` (its client's next call fails), and a session not there is
    False."""
    server = RemoteServer(str(tmp_path))
    backend = RemoteBackend(transport=LoopbackTransport(server.handle, server.drop),
                            hosted=HostedSpec(kind="host"), workspace=str(tmp_path))
    try:
        info = await backend.open()
        await backend.stat(PathRef(base=info.workspace, path="."))
        (row,) = await server.rows()
        assert (row["id"], row["backend"], row["calls"], row["durable"]) == (
            backend.session_id, "host", 1, False)
        assert backend._secret not in repr(row)
        assert await server.kill_from_outside(backend.session_id) is True
        assert (await server.rows())[0]["cpu_seconds"] is None  # killed: no figures
        assert await server.kill_from_outside("no-such-session") is False
    finally:
        await backend.close()
    assert await server.rows() == []


async def test_kill_sandbox_from_another_thread_ends_it_on_the_server(
        server: ServerProcess, tmp_path: Path) -> None:
    """``SandboxKill`` through the remote backend (``toolseam ps --kill`` calls it from its
    own thread): sent on a connection of its own, it ends the hosted sandbox — its command
    with it — while the session's loop is busy elsewhere."""
    backend = _copied(server, tmp_path)
    try:
        info = await backend.open()
        await backend.start(SpawnRequest(job="j", argv=["/bin/sleep", "60"], cwd=info.workspace,
                                         env={"PATH": "/usr/bin:/bin"}, wait_ms=0))
        await asyncio.to_thread(backend.kill_sandbox)
        with pytest.raises(CouldNotRunError) as ended:
            await backend.wait("j", 100)
        assert ended.value.cause == "sandbox_lost"
    finally:
        await backend.close()


async def test_a_copy_too_large_to_carry_home_is_refused_and_nothing_applied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server packs the copy in memory: past what an answer may carry it refuses by
    name (``copy_back_error``) before packing, and the base dir is left as it was."""
    monkeypatch.setattr(copied, "MAX_ANSWER", 1000)
    base = tmp_path / "base"
    base.mkdir()
    (base / "kept.txt").write_text("mine\n")
    server = RemoteServer(str(tmp_path))
    backend = RemoteBackend(transport=LoopbackTransport(server.handle, server.drop),
                            hosted=HostedSpec(kind="host"), workspace=str(base))
    info = await backend.open()
    with open(Path(info.workspace) / "big.bin", "wb") as big:
        big.truncate(1 << 30)  # sparse: a GiB that takes no disk
    (Path(info.workspace) / "kept.txt").write_text("changed there\n")
    await backend.close()
    assert backend.copy_back_error is not None
    assert "more than a copy home carries" in backend.copy_back_error.reason
    assert sorted(os.listdir(base)) == ["kept.txt"]
    assert (base / "kept.txt").read_text() == "mine\n"
