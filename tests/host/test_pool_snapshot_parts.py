"""A snapshot pool's parts that need no engine (issue 48): a wrong snapshot is refused when the
pool is made, naming it, before any engine is asked; the warm workspaces each hold exactly the
snapshot's tree, are independent, and none is left once the pool closes. The pool on the real
engines: tests/backends/test_pool_snapshot.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from toolseam import ConfigurationError, SandboxPool
from toolseam.backends.podman import PodmanBackend
from toolseam.backends.snapshots import filled_branch_workspace, remove_branch_workspace
from toolseam.session.pool_workspaces import WarmWorkspaces

from ..support.snapshot_stores import own_store, snapshot_of
from ..support.trees import describe


@pytest.fixture(autouse=True)
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return own_store(tmp_path / "store", monkeypatch)


@pytest.mark.parametrize("wrong", ["0123456789abcdef0123", "not-an-id"])
def test_a_wrong_snapshot_is_refused_when_the_pool_is_made_naming_it(wrong: str) -> None:
    # An endpoint no engine listens on: the refusal comes before any engine is asked.
    with pytest.raises(ConfigurationError, match=f"snapshot {wrong!r}"):
        SandboxPool(PodmanBackend, snapshot=wrong, endpoint="unix:///nonexistent.sock")


async def test_a_removed_snapshot_is_refused_when_the_pool_is_made(tmp_path: Path) -> None:
    snap, _ = await snapshot_of(tmp_path / "src")
    snap.delete()
    with pytest.raises(ConfigurationError, match=f"snapshot {snap.id!r}.*no snapshot"):
        SandboxPool(PodmanBackend, snapshot=snap, endpoint="unix:///nonexistent.sock")
    with pytest.raises(ConfigurationError, match=r"must be a toolseam\.Snapshot or its id"):
        SandboxPool(PodmanBackend, snapshot=42, endpoint="unix:///nonexistent.sock")  # type: ignore[arg-type]


async def test_warm_workspaces_hold_the_snapshot_are_independent_and_leave_nothing(
        tmp_path: Path, store: Path) -> None:
    snap, expected = await snapshot_of(tmp_path / "src")
    warm = WarmWorkspaces(snap, target=2, refill=True, owner=None)
    warm.start()
    first, second = await warm.take(), await warm.take()
    assert describe(Path(first)) == expected and describe(Path(second)) == expected
    (Path(first) / "src" / "app.py").write_text("changed\n")
    (Path(first) / "run.sh").unlink()
    assert describe(Path(second)) == expected  # one hand-out's changes are its own
    await WarmWorkspaces.remove(first)
    third = await warm.take()
    assert describe(Path(third)) == expected
    for path in (second, third):
        await WarmWorkspaces.remove(path)
    await warm.wait_full()  # the refill runs in the background
    assert warm.ready_count == 2
    await warm.close()
    assert list((store / "branches").iterdir()) == []


async def test_a_snapshot_removed_after_the_pool_started_is_said_at_hand_out(
        tmp_path: Path, store: Path) -> None:
    snap, _ = await snapshot_of(tmp_path / "src")
    warm = WarmWorkspaces(snap, target=1, refill=False, owner=None)
    snap.delete()
    with pytest.raises(ConfigurationError, match=f"no snapshot {snap.id}"):
        await warm.wait_full()
    with pytest.raises(ConfigurationError, match=f"no snapshot {snap.id}"):
        await warm.take()
    await warm.close()
    assert list((store / "branches").iterdir()) == []


async def test_a_hand_out_base_dir_is_made_the_snapshot_tree(tmp_path: Path) -> None:
    snap, expected = await snapshot_of(tmp_path / "src")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "stale.txt").write_text("from before\n")
    warm = WarmWorkspaces(snap, target=1, refill=False, owner=None)
    await warm.restore_into(str(mine))
    assert describe(mine) == expected
    await warm.close()


async def test_another_users_workspace_is_theirs_and_its_removal_follows_no_link(
        tmp_path: Path) -> None:
    """Root filling a workspace for a rootless engine's user (here uid 65534): the directory
    and what is in it are that user's; that user renaming it for a link to elsewhere makes
    the removal remove nothing there; a path that is no branch workspace is refused."""
    snap, expected = await snapshot_of(tmp_path / "src")
    path = filled_branch_workspace(snap.id, owner=65534)
    assert describe(path) == expected
    assert {os.lstat(os.path.join(folder, name)).st_uid
            for folder, dirs, files in os.walk(path) for name in [path, *dirs, *files]} == {65534}
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine\n")
    os.rename(path, path + "-moved")
    os.symlink(victim, path)
    with pytest.raises(OSError):
        remove_branch_workspace(path)
    assert (victim / "keep.txt").read_text() == "mine\n"
    os.unlink(path)
    os.rename(path + "-moved", path)
    remove_branch_workspace(path)
    assert not os.path.exists(path)
    with pytest.raises(ValueError, match="is not a branch workspace"):
        remove_branch_workspace(str(victim))
