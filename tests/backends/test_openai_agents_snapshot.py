"""The OpenAI Agents SDK's snapshot served from toolseam's store (issue 48), through the SDK's own
API: ``client.create(snapshot=ToolseamSnapshotSpec())``, the session's ``aclose`` (which
persists), ``resume`` of a serialised state into a new sandbox (which restores); the SDK's own
``UnixLocalSandboxClient`` with the same spec (its tar goes into the store); a toolseam
snapshot as an SDK session's start; a hostile tar refused whole, nothing stored."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from agents.sandbox.errors import SnapshotPersistError, SnapshotRestoreError
from agents.sandbox.manifest import Manifest
from agents.sandbox.sandboxes.unix_local import UnixLocalSandboxClient
from agents.sandbox.session import SandboxSession

from toolseam import Snapshot, Toolkit
from toolseam.backends.snapshots import SnapshotStore
from toolseam.integrations.openai_agents import (
    ToolseamSandboxClient,
    ToolseamSnapshot,
    ToolseamSnapshotSpec,
)

from ..support import engines
from .test_openai_agents_sandbox import options_for

# What a command makes, and how a command reads it back (names, modes, bytes, link targets).
_MAKE = ("mkdir -p src empty && printf 'v1\\n' > src/app.py && printf '#!/bin/sh\\n' > run.sh"
         " && chmod 755 run.sh && chmod 700 src && ln -s src/app.py link"
         " && head -c 300000 /dev/zero > big.bin")
_LIST = ("find . -mindepth 1 ! -name big.bin -exec stat -c '%n %A' {} + | sort"
         " && cat src/app.py && readlink link && wc -c < big.bin")


@pytest.fixture(autouse=True)
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "store"
    monkeypatch.setenv("TOOLSEAM_SNAPSHOTS", str(root))
    return root


async def _run(session: SandboxSession, command: str) -> str:
    done = await session.exec(command)
    assert done.ok(), done.stderr
    return done.stdout.decode()


def _sdk_snapshots() -> list[Snapshot]:
    return [s for s in Snapshot.all() if (s.label or "").startswith("openai-agents ")]


@pytest.mark.parametrize("backend", engines.LOCAL_BACKENDS)
async def test_a_toolseam_session_persists_into_the_store_and_a_new_sandbox_restores_it(
        backend: str) -> None:
    """Persist is a toolseam snapshot of the session (no tar), resume into a new sandbox
    restores it exactly; a second persist after one change replaces the first and stores
    only the changed file's bytes."""
    client = ToolseamSandboxClient()
    session = await client.create(manifest=Manifest(), snapshot=ToolseamSnapshotSpec(),
                                  options=options_for(backend))
    await session.start()
    await _run(session, _MAKE)
    expected = await _run(session, _LIST)
    await session.aclose()  # the SDK persists here
    (first,) = _sdk_snapshots()
    assert first.label == f"openai-agents {session.state.session_id}"
    assert first.backend != "openai-agents"  # taken from the session, not from a tar
    payload = client.serialize_session_state(session.state)
    await client.delete(session)

    resumed = await client.resume(client.deserialize_session_state(payload))
    try:
        await resumed.start()  # a new sandbox: the SDK restores the snapshot
        assert await _run(resumed, _LIST) == expected
        await _run(resumed, "printf 'v2\\n' > src/app.py && rm run.sh")
    finally:
        await resumed.aclose()
        await client.delete(resumed)
    (second,) = _sdk_snapshots()  # the persist replaced the first
    assert second.id != first.id and second.label == first.label
    assert second.size_bytes == len("v2\n")  # big.bin and the rest were stored once


async def test_the_sdk_own_client_keeps_its_tar_in_the_store_and_starts_from_it() -> None:
    """``UnixLocalSandboxClient`` hands ``persist`` its tar: the files go into the store, and a
    new session named by the same id is hydrated from a tar made from the store. (That
    client's tar carries no directory's mode — with the SDK's own ``LocalSnapshotSpec`` too —
    so no directory here has one of its own.)"""
    client = UnixLocalSandboxClient()
    session = await client.create(manifest=Manifest(), snapshot=ToolseamSnapshotSpec())
    await session.start()
    await _run(session, _MAKE.replace(" && chmod 700 src", ""))
    expected = await _run(session, _LIST)
    await session.aclose()
    (kept,) = _sdk_snapshots()
    assert kept.backend == "openai-agents" and kept.size_bytes >= 300_000
    snapshot_id = str(session.state.session_id)
    await client.delete(session)
    again = await client.create(manifest=Manifest(), snapshot=ToolseamSnapshot(id=snapshot_id))
    try:
        await again.start()
        assert await _run(again, _LIST) == expected
    finally:
        await again.aclose()
        await client.delete(again)


@pytest.mark.parametrize("backend", ["host", "podman-rootless"])
async def test_a_toolseam_snapshot_starts_an_sdk_session_and_is_never_replaced(
        backend: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "task.txt").write_text("from toolseam\n")
    async with Toolkit("host", base_dir=home) as tk:
        snap = await tk.snapshot("set up")
    client = ToolseamSandboxClient()
    session = await client.create(manifest=Manifest(), snapshot=ToolseamSnapshot(id=snap.id),
                                  options=options_for(backend))
    try:
        await session.start()
        assert await _run(session, "ls; cat task.txt") == "task.txt\nfrom toolseam\n"
        await _run(session, "echo more >> task.txt")
    finally:
        await session.aclose()
        await client.delete(session)
    assert Snapshot.load(snap.id) == snap  # still there, untouched
    (persisted,) = _sdk_snapshots()
    assert persisted.label == f"openai-agents {snap.id}"


def _tar(*members: tuple[str, bytes]) -> io.BytesIO:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out.seek(0)
    return out


@pytest.mark.parametrize("hostile", ["../escape.txt", "/etc/evil", "ok/../../x"])
async def test_a_hostile_tar_is_refused_whole_and_nothing_is_stored(
        hostile: str, store: Path) -> None:
    snapshot = ToolseamSnapshot(id="sdk-1")
    with pytest.raises(SnapshotPersistError):
        await snapshot.persist(_tar(("./fine.txt", b"fine\n"), (hostile, b"owned\n")))
    assert Snapshot.all() == []
    assert [p for p in (store / "objects").rglob("*") if p.is_file()] == []
    assert not await snapshot.restorable()


async def test_a_tampered_object_stops_the_restore(store: Path) -> None:
    snapshot = ToolseamSnapshot(id="sdk-2")
    await snapshot.persist(_tar(("./a.txt", b"the bytes\n")))
    (obj,) = [p for p in (store / "objects").rglob("*") if p.is_file()]
    obj.write_bytes(b"other bytes\n")
    with pytest.raises(SnapshotRestoreError):
        await snapshot.restore()
    assert len(SnapshotStore().all()) == 1


async def test_of_two_persists_under_one_id_the_later_stays(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """Two sessions persist under one id at once: each removes only what came before its own,
    so the first one's late clean-up never removes the second's snapshot."""
    snapshot = ToolseamSnapshot(id="sdk-3")
    await snapshot.persist(_tar(("./a.txt", b"first\n")))
    first = snapshot.stored()
    assert first is not None
    with monkeypatch.context() as patch:  # the second persist lands before the first's clean-up
        patch.setattr(ToolseamSnapshot, "_replace_older", lambda self, kept: None)
        await snapshot.persist(_tar(("./a.txt", b"second\n")))
    second = snapshot.stored()
    assert second is not None and second.id != first.id
    snapshot._replace_older(first.id)  # the first session's clean-up, late
    assert {m.id for m in SnapshotStore().all()} == {first.id, second.id}
    snapshot._replace_older(second.id)
    assert [m.id for m in SnapshotStore().all()] == [second.id]
    restored = await snapshot.restore()
    with restored, tarfile.open(fileobj=restored) as tar:
        member = tar.extractfile("a.txt")
        assert member is not None and member.read() == b"second\n"
