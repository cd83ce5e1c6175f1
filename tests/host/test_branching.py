"""Branching sessions on the host backend (issue 48): snapshot, restore, fork, keep, a session
opened from a snapshot, the sync API and the CLI — each against real files and processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolseam import (
    ConfigurationError,
    CouldNotRunError,
    HostBackend,
    Settings,
    Snapshot,
    SyncToolkit,
    Toolkit,
)
from toolseam.backends import host as host_module
from toolseam.backends import host_overlay
from toolseam.backends.host_overlay import overlays_possible
from toolseam.backends.snapshots.fork_base import sweep_fork_dirs
from toolseam.frontends.cli import main as cli_main

from ..support.trees import describe


@pytest.fixture(autouse=True)
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test has a store of its own (TOOLSEAM_SNAPSHOTS)."""
    root = tmp_path / "store"
    monkeypatch.setenv("TOOLSEAM_SNAPSHOTS", str(root))
    return root


@pytest.fixture(params=["overlay", "copy"])
def fork_way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How a host fork's child gets its files: an overlay over the fork's base where this
    process is root (decision 516), else a copy of its own (decisions 365, 514)."""
    if request.param == "copy":
        monkeypatch.setattr(host_module, "overlays_possible", lambda *paths: False)
    elif not overlays_possible("/"):
        pytest.skip("a host fork's overlays need root; this run's forks are copies")
    return str(request.param)


def _overlays_below(root: Path) -> list[str]:
    """The overlay mount points below ``root`` in this process's namespace."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        if rest.startswith("overlay ") and fields.split()[4].startswith(f"{root}/"):
            points.append(fields.split()[4])
    return points


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / "src" / "pkg").mkdir(parents=True)
    (home / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (home / "README").write_text("readme\n")
    (home / "empty").mkdir()
    (home / "run.sh").write_text("#!/bin/sh\n")
    (home / "run.sh").chmod(0o750)
    (home / "link").symlink_to("src/pkg/mod.py")
    return home


async def _bash(tk: Toolkit, command: str) -> str:
    result = await tk.call("bash", {"command": command})
    assert result.metadata.get("exitCode") == 0, result.output
    return result.output


async def test_restore_brings_back_exactly_the_snapshot(tmp_path: Path) -> None:
    home = _home(tmp_path)
    async with Toolkit("host", base_dir=home) as tk:
        before = describe(home)
        snap = await tk.snapshot("clean")
        assert (snap.label, snap.backend, snap.session) == ("clean", "host", tk.session_id)
        assert snap.processes == "not carried"
        await _bash(tk, "rm -rf src empty; echo changed > README; chmod 600 run.sh; "
                        "ln -sfn README link; mkdir -p new/deep; echo n > new/deep/f")
        result = await tk.restore(snap)
        assert describe(home) == before
        assert result.snapshot == snap.id and result.ended_jobs == []
        assert result.removed >= 1 and result.written >= 2


async def test_restore_ends_running_jobs_and_says_which(tmp_path: Path) -> None:
    home = _home(tmp_path)
    settings = Settings(timeout_policy="detach", default_timeout_ms=300)
    async with Toolkit("host", base_dir=home, settings=settings) as tk:
        snap = await tk.snapshot()
        started = await tk.call("bash", {"command": "echo running > marker; sleep 60"})
        job = started.metadata["jobId"]
        result = await tk.restore(snap)
        assert result.ended_jobs == [job]
        assert not (home / "marker").exists()
        listed = await tk.call("bash", {"jobs": True})
        assert "\tkilled\t" in listed.output


async def test_a_second_snapshot_and_a_restore_cost_what_changed(tmp_path: Path) -> None:
    home = _home(tmp_path)
    (home / "big").write_bytes(os.urandom(1 << 20))
    async with Toolkit("host", base_dir=home) as tk:
        first = await tk.snapshot()
        assert first.size_bytes >= 1 << 20
        (home / "README").write_text("one change\n")
        second = await tk.snapshot()
        assert second.size_bytes == len("one change\n")
        (home / "README").write_text("another\n")
        result = await tk.restore(first)
        assert (result.written, result.removed) == (1, 0)
        assert (home / "README").read_text() == "readme\n"


async def test_fork_children_are_independent_and_leave_nothing(tmp_path: Path, store: Path,
                                                               fork_way: str) -> None:
    home = _home(tmp_path)
    async with Toolkit("host", base_dir=home) as tk:
        children = await tk.fork(3)
        assert all(isinstance(c, Toolkit) for c in children)
        kids = [c for c in children if isinstance(c, Toolkit)]
        try:
            dirs = {k.base_dir for k in kids}
            assert len(dirs) == 3 and str(home) not in dirs
            for number, kid in enumerate(kids):
                assert describe(kid.base_dir) == describe(home)
                await _bash(kid, f"echo {number} > README; touch only-{number}")
            await _bash(tk, "echo parent > README")
            for number, kid in enumerate(kids):
                assert (Path(kid.base_dir) / "README").read_text() == f"{number}\n"
                assert sorted(p.name for p in Path(kid.base_dir).glob("only-*")) == [
                    f"only-{number}"]
            assert (home / "README").read_text() == "parent\n"
            assert not list(home.glob("only-*"))
        finally:
            for kid in kids:
                await kid.close()
        assert not any(os.path.exists(d) for d in dirs)
        assert _overlays_below(store) == []
        # kept for the session's next fork, never at the children's paths: the workspaces
        # (decision 514), or the fork's base (decision 516)
        kept = [p.name for p in (store / "branches").iterdir()]
        if fork_way == "copy":
            assert len(kept) == 3
        else:
            assert len(kept) == 1 and kept[0].startswith("fork-")
    assert list((store / "branches").iterdir()) == []


@pytest.mark.parametrize("fork_way", ["copy"], indirect=True)
async def test_the_next_fork_restores_into_the_last_branches_workspaces_what_differs(
        tmp_path: Path, store: Path, fork_way: str) -> None:
    """Decision 514: a closed branch's workspace is kept for the session's next fork, whose
    child is restored into it by what differs — whatever the last branch did there (files
    rewritten, added, removed, a locked directory, a link out, its root's mode) — and is
    exactly the parent's files."""
    home = _home(tmp_path)
    (home / "big").write_bytes(os.urandom(1 << 20))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("precious\n")
    async with Toolkit("host", base_dir=home) as tk:
        first = [c for c in await tk.fork(2) if isinstance(c, Toolkit)]
        inodes = {os.stat(Path(k.base_dir) / "big").st_ino for k in first}
        for kid in first:
            await _bash(kid, f"echo mine > README; rm -rf src; touch extra; ln -s {outside} out; "
                             "mkdir -p locked/in && chmod 000 locked; chmod 777 .")
        for kid in first:
            await kid.close()
        (home / "README").write_text("parent's step\n")
        second = [c for c in await tk.fork(2) if isinstance(c, Toolkit)]
        try:
            for kid in second:
                assert describe(kid.base_dir) == describe(home)
                assert os.stat(kid.base_dir).st_mode & 0o777 == 0o700
                # the 1 MiB file was left in place, not written again
                assert os.stat(Path(kid.base_dir) / "big").st_ino in inodes
            assert sorted(p.name for p in outside.iterdir()) == ["keep"]
        finally:
            for kid in second:
                await kid.close()
    assert list((store / "branches").iterdir()) == []


@pytest.mark.parametrize("fork_way", ["overlay"], indirect=True)
async def test_a_root_hosts_fork_children_are_overlays_over_one_base(
        tmp_path: Path, store: Path, fork_way: str) -> None:
    """Decision 516: as root, the snapshot is restored once, into the fork's base, and each
    child's workspace is an overlay over it: no child copies a file it does not write, no
    child's command changes the base, and the session's next fork brings the same base up to
    date by what changed."""
    home = _home(tmp_path)
    (home / "big").write_bytes(os.urandom(1 << 20))
    async with Toolkit("host", base_dir=home) as tk:
        kids = [c for c in await tk.fork(3) if isinstance(c, Toolkit)]
        base = tk.backend.fork_base  # type: ignore[attr-defined]
        assert base is not None and base.restores == 1
        try:
            assert sorted(_overlays_below(store)) == sorted(k.base_dir for k in kids)
            big = os.stat(Path(base.base) / "big").st_ino
            for kid in kids:
                assert describe(kid.base_dir) == describe(home)
                assert os.stat(kid.base_dir).st_mode & 0o777 == 0o700
                assert os.stat(Path(kid.base_dir) / "big").st_ino == big  # not copied
                await _bash(kid, "rm -rf ./* && echo mine > README && chmod 777 . && "
                                 "ln -s /etc shadowed")
            assert describe(base.base) == describe(home)  # what the kids did is theirs alone
            # a root command cannot take its overlay away: its agent's mounts are locked
            umount = await kids[2].call("bash", {"command": f"umount -l {kids[2].base_dir}"})
            assert umount.metadata.get("exitCode") != 0, umount.output
            assert await _bash(kids[2], "cat README") == "mine\n"  # its own view is whole
            assert describe(kids[1].base_dir) != describe(home)
            snap = await kids[0].snapshot()  # the overlay's files, as any session's
            restored = await kids[1].restore(snap)
            assert describe(kids[1].base_dir) == describe(kids[0].base_dir)
            assert restored.written <= 1
        finally:
            for kid in kids:
                await kid.close()
        assert _overlays_below(store) == []
        (home / "README").write_text("parent's step\n")
        again = [c for c in await tk.fork(2) if isinstance(c, Toolkit)]
        try:
            assert tk.backend.fork_base is base and base.restores == 2  # type: ignore[attr-defined]
            assert os.stat(Path(base.base) / "big").st_ino == big  # only README was written
            for kid in again:
                assert describe(kid.base_dir) == describe(home)
        finally:
            for kid in again:
                await kid.close()
    assert list((store / "branches").iterdir()) == []
    assert _overlays_below(store) == []


_DIES_WITH_ITS_FORK_OPEN = """
import asyncio, os, signal, sys
from toolseam import Toolkit
async def main():
    tk = await Toolkit("host", base_dir=sys.argv[1]).__aenter__()
    kids = await tk.fork(2)
    print(" ".join(k.base_dir for k in kids), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
asyncio.run(main())
"""


@pytest.mark.parametrize("fork_way", ["overlay"], indirect=True)
async def test_the_overlays_of_a_process_that_died_are_detached_by_the_next_fork(
        tmp_path: Path, store: Path, fork_way: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process killed with its fork's children open leaves their mounts in this namespace;
    the next fork of any toolseam process here detaches them and removes their dirs, and
    leaves a live process's alone."""
    home = _home(tmp_path)
    dying = subprocess.run([sys.executable, "-c", _DIES_WITH_ITS_FORK_OPEN, str(home)],
                           capture_output=True, text=True, timeout=120, check=False)
    assert dying.returncode == -9, dying.stderr
    left = dying.stdout.split()
    assert len(left) == 2 and sorted(_overlays_below(store)) == sorted(left)
    monkeypatch.setattr(host_overlay, "_swept", [0.0])  # the sweep's pace is once a minute
    async with Toolkit("host", base_dir=home) as tk:
        [kid] = await tk.fork(1)
        assert isinstance(kid, Toolkit)
        try:
            assert _overlays_below(store) == [kid.base_dir]  # the dead one's are gone, not its
            assert not any(os.path.exists(p) for p in left)
            forks = [p.name for p in (store / "branches").iterdir() if p.name.startswith("fork-")]
            assert forks == [Path(tk.backend.fork_base.root).name]  # type: ignore[attr-defined]
            assert describe(kid.base_dir) == describe(home)
        finally:
            await kid.close()
    assert list((store / "branches").iterdir()) == []


def test_the_janitors_sweep_detaches_a_dead_processs_overlays_before_removing_its_dirs(
        tmp_path: Path, store: Path) -> None:
    """The containers' janitor sweeps the fork dirs at every session's start (janitor.py): it
    detaches the dead process's overlays first, so no mount is left over a removed base."""
    if not overlays_possible("/"):
        pytest.skip("a host fork's overlays need root; this run's forks are copies")
    dying = subprocess.run([sys.executable, "-c", _DIES_WITH_ITS_FORK_OPEN, str(_home(tmp_path))],
                           capture_output=True, text=True, timeout=120, check=False)
    assert dying.returncode == -9, dying.stderr
    left = dying.stdout.split()
    assert sorted(_overlays_below(store)) == sorted(left)
    removed = sweep_fork_dirs()
    assert _overlays_below(store) == []
    assert not any(os.path.exists(p) for p in left)
    assert sorted(removed[:2]) == sorted(left) and len(removed) == 3  # the two, then the dir
    assert list((store / "branches").iterdir()) == []


async def test_fork_refuses_a_count_outside_1_to_64(tmp_path: Path) -> None:
    async with Toolkit("host", base_dir=_home(tmp_path)) as tk:
        for n in (0, 65, -1, True, 2.0):
            with pytest.raises(ConfigurationError, match="from 1 to 64"):
                await tk.fork(n)  # type: ignore[arg-type]


class _HalfBrokenHost(HostBackend):
    """Its even-numbered branches get an interpreter that does not exist: a real failed start."""

    made = 0

    def branch_backend(self, workspace: str, snapshot_id: str) -> tuple[HostBackend, str]:
        _HalfBrokenHost.made += 1
        python = "/nonexistent/python" if self.made % 2 == 0 else None
        child = HostBackend(workspace, python=python)
        child._restore(workspace, snapshot_id)
        return child, workspace


async def test_a_child_that_cannot_start_is_an_error_in_its_place(tmp_path: Path,
                                                                  store: Path) -> None:
    home = _home(tmp_path)
    async with Toolkit(_HalfBrokenHost(str(home)), base_dir=home) as tk:
        children = await tk.fork(4)
        failed = [c for c in children if isinstance(c, CouldNotRunError)]
        started = [c for c in children if isinstance(c, Toolkit)]
        assert len(failed) == 2 and len(started) == 2
        for kid in started:
            assert "readme" in await _bash(kid, "cat README")
            await kid.close()
    assert list((store / "branches").iterdir()) == []


async def test_keep_brings_the_winner_home_and_the_others_leave_it_alone(tmp_path: Path,
                                                                         fork_way: str) -> None:
    home = _home(tmp_path)
    async with Toolkit("host", base_dir=home) as tk:
        winner, loser = await tk.fork(2)
        assert isinstance(winner, Toolkit) and isinstance(loser, Toolkit)
        await _bash(winner, "echo won > README; rm run.sh; mkdir -p out; echo r > out/result")
        await _bash(loser, "echo lost > README; rm -rf src")
        report = await winner.keep()
        assert sorted(report.added) == ["out", "out/result"]
        assert report.modified == ["README"] and report.deleted == ["run.sh"]
        await loser.close()
        await winner.close()
        assert (home / "README").read_text() == "won\n"
        assert (home / "out" / "result").read_text() == "r\n"
        assert (home / "src" / "pkg" / "mod.py").exists() and not (home / "run.sh").exists()


async def test_keep_follows_the_conflict_rule(tmp_path: Path,
                                              fork_way: str) -> None:
    home = _home(tmp_path)
    async with Toolkit("host", base_dir=home) as tk:
        (child,) = await tk.fork(1)
        assert isinstance(child, Toolkit)
        await _bash(child, "echo branch > README")
        (home / "README").write_text("home changed it\n")
        report = await child.keep()
        await child.close()
    assert report.conflicts == ["README"]
    assert (home / "README").read_text() == "home changed it\n"
    assert (home / "README.toolseam-conflict").read_text() == "branch\n"


async def test_keep_is_only_for_a_fork(tmp_path: Path) -> None:
    async with Toolkit("host", base_dir=_home(tmp_path)) as tk:
        with pytest.raises(ConfigurationError, match="fork"):
            await tk.keep()


async def test_a_session_opened_from_a_snapshot_works_in_its_own_dir(tmp_path: Path,
                                                                      store: Path) -> None:
    home = _home(tmp_path)
    async with Toolkit("host", base_dir=home) as tk:
        snap = await tk.snapshot()
    async with Toolkit("host", snapshot=snap.id) as fresh:
        assert fresh.base_dir != str(home) and Path(fresh.base_dir).parent == store / "branches"
        assert describe(fresh.base_dir) == describe(home)
        private = fresh.base_dir
    assert not os.path.exists(private)
    # closing never deletes a snapshot; another process finds it by id
    code = ("import sys, toolseam; s = toolseam.Snapshot.load(sys.argv[1]); "
            "print(s.model_dump_json())")
    out = subprocess.run([sys.executable, "-c", code, snap.id], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert Snapshot.model_validate_json(out) == snap


async def test_a_snapshot_restored_into_a_given_base_dir(tmp_path: Path) -> None:
    home = _home(tmp_path)
    async with Toolkit("host", base_dir=home) as tk:
        snap = await tk.snapshot()
    other = tmp_path / "other"
    other.mkdir()
    (other / "stale").write_text("goes\n")
    async with Toolkit("host", base_dir=other, snapshot=snap):
        assert describe(other) == describe(home)


async def test_an_unknown_snapshot_is_a_configuration_error(tmp_path: Path) -> None:
    async with Toolkit("host", base_dir=_home(tmp_path)) as tk:
        for wrong in ("0" * 20, "../../etc/passwd", "x"):
            with pytest.raises(ConfigurationError):
                await tk.restore(wrong)
    with pytest.raises(ConfigurationError):
        Toolkit("host", snapshot="f" * 20)


def test_the_sync_toolkit_branches_too(tmp_path: Path) -> None:
    home = _home(tmp_path)
    with SyncToolkit("host", base_dir=home) as tk:
        snap = tk.snapshot("sync")
        (home / "README").write_text("changed\n")
        assert tk.restore(snap).written == 1
        (child,) = tk.fork(1)
        assert isinstance(child, SyncToolkit)
        child.call("write", {"file_path": "from-child.txt", "content": "c\n"})
        assert child.keep().added == ["from-child.txt"]
        child.close()
        assert tk.call("bash", {"command": "cat from-child.txt"}).output.strip() == "c"
    assert (home / "from-child.txt").read_text() == "c\n"


async def test_the_cli_lists_removes_and_prunes_and_leaves_nothing(
        tmp_path: Path, store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = _home(tmp_path)
    async with Toolkit("host", base_dir=home) as tk:
        first = await tk.snapshot("first")
        (home / "README").write_text("second\n")
        second = await tk.snapshot("second")
    assert await asyncio.to_thread(cli_main, ["snapshots", "list"]) == 0
    listed = capsys.readouterr().out
    assert first.id in listed and second.id in listed and "first" in listed
    assert cli_main(["snapshots", "rm", first.id]) == 0
    assert Snapshot.load(second.id) == second
    assert cli_main(["snapshots", "prune", "--older-than", "1h"]) == 0
    assert "removed 0" in capsys.readouterr().out.splitlines()[-1]
    assert cli_main(["snapshots", "prune", "--older-than", "0s"]) == 0
    assert list((store / "manifests").iterdir()) == []
    assert list((store / "objects").iterdir()) == []
    assert cli_main(["snapshots", "prune", "--older-than", "soon"]) == 2
    assert "not a duration" in capsys.readouterr().err


def test_the_snapshot_model_round_trips_as_json() -> None:
    snap = Snapshot(id="a" * 20, label=None, created="2026-12-06T00:00:00Z", size_bytes=0,
                    backend="host", session="s", files=0, left_out=[])
    assert Snapshot.model_validate(json.loads(snap.model_dump_json())) == snap


async def test_snapshots_are_listed_and_deleted_from_python(tmp_path: Path, store: Path) -> None:
    async with Toolkit("host", base_dir=_home(tmp_path)) as tk:
        snap = await tk.snapshot("py")
    assert [s.id for s in Snapshot.all()] == [snap.id]
    snap.delete()
    assert Snapshot.all() == []
    assert list((store / "objects").iterdir()) == []
    with pytest.raises(ConfigurationError, match="no snapshot"):
        Snapshot.load(snap.id)
