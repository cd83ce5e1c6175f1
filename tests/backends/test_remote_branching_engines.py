"""Branching and resource usage through the remote backend hosting a container backend (issue
47, decision 445): a bind-mode podman sandbox and a copy-mode one on the engine in a mount
namespace of its own. The snapshot lands in the client's store, a restore pushed to the
server's store puts it back inside the container, a fork's child is a copy-mode sandbox of the
server's, and the container's cgroup figures cross. The server has a snapshot store of its own,
as a server on another machine has."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from toolseam import Snapshot, Toolkit
from toolseam.backends.snapshots import SnapshotStore

from ..support.engines import IMAGE, endpoint, remote_image, shared_dir
from ..support.remote_server import ServerProcess, remote_server
from ..support.sandbox_trees import run
from ..support.snapshot_stores import own_store

pytestmark = pytest.mark.engines


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


def _hosted(engine: str) -> dict[str, object]:
    if engine == "podman-remote":
        return {"image": remote_image(), "endpoint": endpoint(engine)}
    return {"image": IMAGE, "endpoint": endpoint(engine)}


@pytest.mark.parametrize("engine", ["podman", "podman-remote"])
async def test_snapshot_restore_fork_and_usage_of_a_hosted_container(
        engine: str, server: ServerProcess, server_store: Path) -> None:
    backend = server.backend(shared_dir(), kind="podman", **_hosted(engine))
    async with Toolkit(backend) as tk:
        await run(tk, "mkdir -p src && echo 'x = 1' > src/mod.py && ln -s src/mod.py link")
        snap = await tk.snapshot("hosted")
        assert Snapshot.load(snap.id).files == snap.files  # in this user's store
        assert SnapshotStore(server_store).has_snapshot(snap.id)
        await run(tk, "rm -r src && echo junk > junk")
        SnapshotStore(server_store).remove([snap.id])  # so the restore carries it back
        result = await tk.restore(snap)
        assert result.removed >= 1
        assert await run(tk, "cat link; ls") == "x = 1\nlink\nsrc\n"
        (child,) = await tk.fork(1)
        assert isinstance(child, Toolkit), child
        try:
            assert await run(child, "cat src/mod.py; echo child > mine; ls") == (
                "x = 1\nlink\nmine\nsrc\n")
            assert await run(tk, "ls") == "link\nsrc\n"  # the parent never sees the child's
        finally:
            await child.close()
        usage = await tk.backend.resource_usage()  # type: ignore[attr-defined]
        assert usage.pids is not None and usage.pids >= 1, usage
