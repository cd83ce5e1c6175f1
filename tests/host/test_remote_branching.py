"""Branching and resource usage through the remote backend (issue 47, decision 445): a remote
session's snapshot lands in the client user's store — carried from the server's store, only
the objects the client lacks, each checked against its digest — a restore or a session opened
from a snapshot pushes it to the server first, a fork's children are sessions of the server
opened from the snapshot in private workspaces of the server's, and a server hands out only
the objects of snapshots the asking session took. Real server processes on a unix socket, each
with a snapshot store of its own (as a server on another machine has)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolseam import CouldNotRunError, Snapshot, Toolkit
from toolseam.backends.host import HostBackend
from toolseam.backends.remote import RemoteBackend, snapshots
from toolseam.backends.snapshots import SnapshotStore
from toolseam.seam.capabilities import SandboxUsage
from toolseam.seam.errors import ConfigurationError, HostError

from ..support.remote_server import ServerProcess, remote_server
from ..support.snapshot_stores import own_store

BIG = snapshots.PIECE + 12345  # an object that crosses in two pieces


@pytest.fixture(scope="module")
def server_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server-store") / "snapshots"


@pytest.fixture(scope="module")
def server(server_store: Path) -> Iterator[ServerProcess]:
    with remote_server(snapshots=server_store) as running:
        yield running


@pytest.fixture(autouse=True)
def client_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return own_store(tmp_path / "client-store", monkeypatch)


def _tree(root: Path) -> dict[str, Any]:
    """Every name below ``root``: a file's digest and mode, a link's target, a directory."""
    found: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            found[rel] = ("dir", path.stat().st_mode & 0o7777)
        else:
            found[rel] = ("file", hashlib.sha256(path.read_bytes()).hexdigest(),
                          path.stat().st_mode & 0o7777)
    return found


def _fill(root: Path) -> None:
    (root / "src" / "deep").mkdir(parents=True)
    (root / "src" / "deep" / "app.py").write_text("print('v1')\n")
    (root / "empty").write_bytes(b"")
    (root / "big.bin").write_bytes(os.urandom(1024) * (BIG // 1024) + b"tail")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o750)
    (root / "link").symlink_to("src/deep/app.py")


async def test_a_snapshot_lands_in_the_clients_store_and_restores_there(
        server: ServerProcess, server_store: Path, client_store: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _fill(ws)
    before = _tree(ws)
    async with Toolkit(server.backend(ws)) as tk:
        snap = await tk.snapshot("through the wire")
        # the client's store holds it whole: manifest and every object, read back checked
        assert Snapshot.load(snap.id) == snap and snap.label == "through the wire"
        mine = SnapshotStore(client_store)
        assert all(mine.has(e.digest) for e in mine.load(snap.id).entries if e.kind == "file")
        assert SnapshotStore(server_store).has_snapshot(snap.id)  # the hosted backend's own
        await tk.call("bash", {"command": "rm -r src big.bin && echo new > added && "
                                          "chmod 600 run.sh"})
        result = await tk.restore(snap)
        assert _tree(ws) == before and result.removed == 1 and result.written >= 2
        # a snapshot the server's store lacks (taken elsewhere) is pushed first
        SnapshotStore(server_store).remove([snap.id])
        await tk.call("bash", {"command": "rm -r src"})
        await tk.restore(snap.id)
        assert _tree(ws) == before and SnapshotStore(server_store).has_snapshot(snap.id)


async def test_a_snapshot_opens_a_session_on_another_server(
        server: ServerProcess, tmp_path: Path) -> None:
    """Taken on one server, opened on a second whose store never saw it (one node to
    another): only the client's store carries it between them."""
    ws = tmp_path / "ws"
    ws.mkdir()
    _fill(ws)
    async with Toolkit(server.backend(ws)) as tk:
        snap = await tk.snapshot()
    other_ws = tmp_path / "other"
    other_ws.mkdir()
    (other_ws / "stale").write_text("goes\n")
    with remote_server(snapshots=tmp_path / "second-store") as second:
        async with Toolkit(second.backend(other_ws), snapshot=snap) as fresh:
            assert _tree(other_ws) == _tree(ws)
            out = await fresh.call("bash", {"command": "cat link"})
            assert out.output.strip() == "print('v1')"


async def test_a_fork_opens_children_on_the_server(server: ServerProcess, server_store: Path,
                                                   tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_text("print('v1')\n")
    async with Toolkit(server.backend(ws)) as parent:
        kids = await parent.fork(2)
        assert all(isinstance(kid, Toolkit) for kid in kids), kids
        try:
            bases = set()
            for number, kid in enumerate(kids):
                assert isinstance(kid, Toolkit) and isinstance(kid.backend, RemoteBackend)
                # a private workspace of the server's, made the snapshot's tree there
                assert Path(kid.base_dir).parent == server_store / "branches"
                read = await kid.call("read", {"file_path": "app.py"})
                assert "print('v1')" in read.output
                await kid.call("write", {"file_path": "app.py", "content": f"v{number}\n"})
                bases.add(kid.base_dir)
            assert len(bases) == 2 and (ws / "app.py").read_text() == "print('v1')\n"
            with pytest.raises(ConfigurationError, match="another machine"):
                await kids[0].keep()  # type: ignore[union-attr]
        finally:
            for kid in kids:
                if isinstance(kid, Toolkit):
                    await kid.close()
        assert not any(Path(base).exists() for base in bases)  # removed with their sessions


async def test_resource_usage_is_measured_only_while_open(server: ServerProcess,
                                                          tmp_path: Path) -> None:
    backend = server.backend(tmp_path)
    assert await backend.resource_usage() == SandboxUsage()  # never opens the session
    assert backend.info is None
    async with Toolkit(backend) as tk:
        await tk.call("bash", {"command": "sleep 30", "run_in_background": True})
        usage = await backend.resource_usage()
        assert usage.pids is not None and usage.pids >= 2  # the agent and the sleep
        assert usage.memory_bytes is not None and usage.memory_bytes > 0
        assert usage.cpu_seconds is not None and usage.cpu_seconds >= 0
    assert await backend.resource_usage() == SandboxUsage()


async def test_a_session_gets_only_its_own_snapshots_objects(server: ServerProcess,
                                                             tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "secret.txt").write_text("another session's\n")
    async with Toolkit(server.backend(ws)) as owner:
        snap = await owner.snapshot()
        digest = next(e.digest for e in SnapshotStore().load(snap.id).entries if e.kind == "file")
        async with Toolkit(server.backend(tmp_path)) as other:
            backend: Any = other.backend
            with pytest.raises(HostError, match="snapshot this session took"):
                await backend._send(snapshots.GET, {"digest": digest, "offset": 0,
                                                    "length": 100})


async def test_a_pushed_object_that_does_not_match_is_never_stored(
        server: ServerProcess, server_store: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_text("the real bytes\n")
    async with Toolkit(server.backend(ws)) as tk:
        snap = await tk.snapshot()
        manifest = SnapshotStore().load(snap.id)
        SnapshotStore(server_store).remove([snap.id])
        backend: Any = tk.backend
        lacking = await backend._send(snapshots.LACKS, {"manifest": manifest.dumps()})
        (digest,) = lacking
        forged = b"forged bytes!!\n"  # the same length, other bytes
        with pytest.raises(CouldNotRunError, match="does not match its digest"):
            await backend._send(snapshots.PUT, {"digest": digest, "offset": 0, "data": forged,
                                                "last": True})
        assert not SnapshotStore(server_store).has(digest)
        assert await backend._send(snapshots.LACKS, {"manifest": manifest.dumps()}) == lacking
        with pytest.raises(HostError, match="not an object"):
            await backend._send(snapshots.PUT, {"digest": "0" * 64, "offset": 0, "data": b"",
                                                "last": True})


@pytest.mark.parametrize("change", [
    lambda m: m.replace('"id":"', '"id":"../../x', 1),
    lambda m: m.replace('["src/deep/app.py"', '["../app.py"', 1),
    lambda m: m.replace('["src/deep/app.py"', '["nowhere/app.py"', 1),
])
def test_a_carried_manifest_is_checked_as_a_stored_one(change: Any, tmp_path: Path) -> None:
    _fill(tmp_path)
    taken = HostBackend(str(tmp_path))._take(str(tmp_path), None, "s", 1 << 40).id
    text = SnapshotStore().load(taken).dumps()
    assert snapshots.checked_manifest(text).id == taken
    with pytest.raises(CouldNotRunError):
        snapshots.checked_manifest(change(text))
