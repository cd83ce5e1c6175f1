"""Branching on every container engine (issue 48): forks that are independent of each other
and of their parent, the winner brought home by keep(), nothing left once they close and the
snapshots are pruned — containers, volumes, private workspaces, store entries — and what a
hostile command can do to a restore: a link planted where the snapshot has a directory, a
tampered store entry, a rootless sandbox's own files."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolseam import Snapshot, Toolkit
from toolseam.backends.containers.labels import SESSION_LABEL
from toolseam.backends.snapshots import SnapshotCorruptError, SnapshotStore

from ..support.engines import ALL_ENGINES, ENGINES, IMAGE, backend
from ..support.sandbox_trees import describe_inside, run


@pytest.fixture(autouse=True)
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "store"
    monkeypatch.setenv("TOOLSEAM_SNAPSHOTS", str(root))
    return root


def _left_behind(tk: Toolkit, session: str) -> list[str]:
    """Containers and volumes of ``session`` or its children the parent's engine still has."""
    engine = tk.backend.sandbox.engine  # type: ignore[attr-defined]
    mine = [name for name, labels in [*engine.labeled(SESSION_LABEL),
                                      *engine.labeled_volumes(SESSION_LABEL)]
            if labels.get(SESSION_LABEL, "").startswith(session)]
    return mine


@pytest.mark.parametrize("engine", ALL_ENGINES)
async def test_forks_are_independent_keep_brings_one_home_and_nothing_is_left(
        engine: str, workspace: Path, store: Path) -> None:
    (workspace / "README").write_text("readme\n")
    async with Toolkit(backend(engine, str(workspace))) as tk:
        await run(tk, "mkdir -p src && echo 'x = 1' > src/mod.py && ln -s src/mod.py link")
        children = await tk.fork(3)
        kids = [k for k in children if isinstance(k, Toolkit)]
        assert len(kids) == 3, children
        for number, kid in enumerate(kids):
            assert kid.backend.name == tk.backend.name
            assert await run(kid, "cat README src/mod.py link") == "readme\nx = 1\nx = 1\n"
            await run(kid, f"echo {number} > README; echo only{number} > mine")
        for number, kid in enumerate(kids):  # each sees its own writes, none of the others'
            assert await run(kid, "cat README mine; ls") == (
                f"{number}\nonly{number}\nREADME\nlink\nmine\nsrc\n")
        assert await run(tk, "cat README; ls") == "readme\nREADME\nlink\nsrc\n"
        report = await kids[1].keep()
        assert report.added == ["mine"] and report.modified == ["README"], report
        for kid in kids:
            await kid.close()
        assert (workspace / "README").read_text() == "1\n"
        assert (workspace / "mine").read_text() == "only1\n"
        # a local engine's session keeps its fork's base for its next fork (decision 513)
        kept = tk.backend.fork_base  # type: ignore[attr-defined]
        assert [p for p in (store / "branches").iterdir()
                if kept is None or str(p) != kept.root] == []
        session = tk.session_id
    assert list((store / "branches").iterdir()) == []
    assert _left_behind(tk, session) == []
    SnapshotStore().prune(0)
    assert Snapshot.all() == []
    assert [p for p in (store / "objects").rglob("*") if p.is_file()] == []


@pytest.mark.parametrize("engine", ALL_ENGINES)
async def test_a_link_planted_where_a_directory_was_does_not_redirect_the_restore(
        engine: str, workspace: Path, tmp_path: Path) -> None:
    """A command swaps a directory of the snapshot for a link to /etc (the sandbox's, and in
    bind mode a host directory outside): the restore replaces the link, writing through
    neither; a fifo is left out of the snapshot and said."""
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o777)
    async with Toolkit(backend(engine, str(workspace))) as tk:
        await run(tk, "mkdir d e && echo inside > d/passwd && echo two > e/hosts && mkfifo p")
        snap = await tk.snapshot()
        assert snap.left_out == ["p"]
        expected = await describe_inside(tk)
        del expected[b"p"]
        await run(tk, f"rm -rf d e p && ln -s /etc d && ln -s {outside} e")
        await tk.restore(snap)
        assert await describe_inside(tk) == expected
        assert await run(tk, "grep -c root /etc/passwd; cat /etc/hosts | grep -c two || true"
                         ) == "1\n0\n"
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("engine", ["podman-rootless", "docker-remote"])
async def test_a_tampered_store_entry_is_refused_before_the_sandbox_changes(
        engine: str, workspace: Path, store: Path) -> None:
    async with Toolkit(backend(engine, str(workspace))) as tk:
        await run(tk, "echo precious > keep.txt")
        snap = await tk.snapshot()
        await run(tk, "echo later > keep.txt; echo new > added")
        (target,) = [p for p in (store / "objects").rglob("*") if p.is_file()]
        target.chmod(0o600)
        target.write_bytes(b"evil\n")
        with pytest.raises(SnapshotCorruptError):
            await tk.restore(snap)
        assert await run(tk, "cat keep.txt added") == "later\nnew\n"


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_restored_workspace_stays_writable_by_the_sandbox(engine: str,
                                                                  workspace: Path) -> None:
    """What a bind-mode restore makes belongs to the uid the sandbox's root is (a rootless
    engine's user, not the caller's root): its commands can change it afterwards."""
    async with Toolkit(backend(engine, str(workspace))) as tk:
        await run(tk, "mkdir -p d && echo one > d/f && chmod 755 d")
        snap = await tk.snapshot()
        await run(tk, "rm -rf d")
        await tk.restore(snap)
        assert await run(tk, "echo two > d/f && echo three > d/g && cat d/f d/g") == \
            "two\nthree\n"


@pytest.mark.parametrize(("taken_on", "opened_on"), [("podman-rootless", "docker-remote"),
                                                    ("podman-remote", "docker")])
async def test_a_snapshot_opens_a_session_on_another_engine(
        taken_on: str, opened_on: str, workspace: Path, tmp_path: Path) -> None:
    """``Toolkit(backend, snapshot=snap)``: the store is this user's, whatever engine took it —
    bind to copy mode and back."""
    async with Toolkit(backend(taken_on, str(workspace))) as tk:
        await run(tk, "mkdir -p a/b && echo deep > a/b/c && ln -s a/b/c top && chmod 640 a/b/c")
        snap = await tk.snapshot("portable")
        expected = await describe_inside(tk)
    other = tmp_path / "other"
    other.mkdir(mode=0o777)
    other.chmod(0o777)
    (other / "stale").write_text("gone after the open\n")
    async with Toolkit(backend(opened_on, str(other)), snapshot=snap) as fresh:
        assert await describe_inside(fresh) == expected


@pytest.mark.parametrize("engine", ["podman-remote", "docker-remote"])
async def test_a_tree_a_command_locked_is_still_restored(engine: str, workspace: Path) -> None:
    """Nested directories a command made unenterable or unwritable (the sandbox's root has no
    CAP_DAC_OVERRIDE) do not stop a copy-mode restore from emptying the workspace."""
    async with Toolkit(backend(engine, str(workspace))) as tk:
        await run(tk, "echo kept > kept")
        snap = await tk.snapshot()
        await run(tk, "mkdir -p a/b/c && echo x > a/b/c/f && chmod 500 a/b/c && chmod 600 a/b "
                      "&& chmod 500 a")
        await tk.restore(snap)
        assert await run(tk, "ls -A") == "kept\n"


@pytest.mark.parametrize(("engine", "name", "options"), [
    ("podman", "podman", {}), ("podman-rootless", "podman", {"rootless": True}),
    ("docker", "docker", {})])
async def test_a_named_engine_opened_from_a_snapshot_works_in_a_private_workspace(
        engine: str, name: str, options: dict[str, object], workspace: Path, store: Path
) -> None:
    """``Toolkit("docker", snapshot=snap)``: the sandbox's ``/workspace`` is a private
    directory holding the snapshot (the current directory is never restored over), removed at
    close — on a rootless engine too, whose user cannot pass this user's 0700 store."""
    async with Toolkit(backend(engine, str(workspace))) as tk:
        await run(tk, "echo hi > f")
        snap = await tk.snapshot()
    async with Toolkit(name, snapshot=snap, backend_options={"image": IMAGE, **options}
                       ) as fresh:
        assert fresh.base_dir == "/workspace"
        assert await run(fresh, "cat f") == "hi\n"
        assert len(list((store / "branches").iterdir())) == 1
    assert list((store / "branches").iterdir()) == []
