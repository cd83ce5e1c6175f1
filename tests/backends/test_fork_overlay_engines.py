"""A local engine's fork children are overlays over one shared base (decision 507): the base is
restored once per fork whatever the number of children, each child's writes land in its own
upper dir — never in the base, a sibling or the parent — and nothing is left once the children
closed, or once the janitor passed after their process died. What a hostile command in a
child can try against the host's side of the overlay: links to host paths, locked
directories, the overlay's own attributes, deleting the whole tree."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from toolseam import CouldNotRunError, Toolkit
from toolseam.backends.containers.labels import SESSION_LABEL
from toolseam.backends.snapshots import SnapshotCorruptError, SnapshotStore
from toolseam.backends.snapshots.fork_base import (
    FORK_PREFIX,
    OTHER_USERS_PREFIX,
    fork_parent,
    sweep_fork_dirs,
)

from ..support.engines import ENGINES, REMOTE_ENGINES, backend
from ..support.sandbox_trees import run
from ..support.snapshot_stores import own_store


@pytest.fixture(autouse=True)
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return own_store(tmp_path / "store", monkeypatch)


def _tree(root: str) -> dict[str, tuple[int, str]]:
    """Every name below ``root`` (links as links): its mode and its bytes' or target's digest."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            seen = os.lstat(path)
            if os.path.islink(path):
                what = "->" + os.readlink(path)
            elif os.path.isdir(path):
                what = "dir"
            else:
                what = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            found[os.path.relpath(path, root)] = (seen.st_mode, what)
    return found


def _fork_dirs() -> set[str]:
    found = set()
    for owner in (None, 1):
        parent = fork_parent(owner)
        if os.path.isdir(parent):
            found |= {os.path.join(parent, n) for n in os.listdir(parent)
                      if n.startswith((FORK_PREFIX, OTHER_USERS_PREFIX))}
    return found


def _mounts_naming(path: str) -> list[str]:
    with open("/proc/self/mountinfo") as table:
        return [line for line in table if path in line]


def _engine_leftovers(tk: Toolkit, session: str) -> list[str]:
    engine = tk.backend.sandbox.engine  # type: ignore[attr-defined]
    return [name for name, labels in [*engine.labeled(SESSION_LABEL),
                                      *engine.labeled_volumes(SESSION_LABEL)]
            if labels.get(SESSION_LABEL, "").startswith(session)]


@pytest.mark.parametrize("engine", ENGINES)
async def test_the_base_is_restored_once_per_fork_and_each_child_writes_only_its_own(
        engine: str, workspace: Path) -> None:
    (workspace / "README").write_text("readme\n")
    (workspace / "README").chmod(0o666)
    async with Toolkit(backend(engine, str(workspace))) as tk:
        await run(tk, "mkdir -p src/deep && echo 'x = 1' > src/deep/mod.py && ln -s src link")
        kids = [k for k in await tk.fork(4) if isinstance(k, Toolkit)]
        assert len(kids) == 4
        overlays = [k.backend.sandbox.mode.overlay for k in kids]  # type: ignore[attr-defined]
        assert None not in overlays
        base = overlays[0].base
        # structural: one base, filled once, held by every child — not a copy per child
        assert all(o.base is base for o in overlays)
        assert base.restores == 1 and base.users == 4
        base_tree = _tree(base.base)
        assert set(base_tree) == {"README", "src", "src/deep", "src/deep/mod.py", "link"}
        mount = await run(kids[0], "grep ' /workspace ' /proc/self/mountinfo")
        assert " - overlay " in mount and f"lowerdir={base.base}" in mount, mount
        # the first child rewrites, deletes and renames everything it can
        await run(kids[0], "echo mine > README; rm -rf src; mv link moved; chmod 600 README;"
                           " mkdir new && echo n > new/file")
        assert await run(kids[0], "ls") == "README\nmoved\nnew\n"
        for kid in kids[1:]:  # siblings, the parent and the base see none of it
            assert await run(kid, "cat README src/deep/mod.py; ls") == (
                "readme\nx = 1\nREADME\nlink\nsrc\n")
        assert await run(tk, "cat README; ls") == "readme\nREADME\nlink\nsrc\n"
        assert _tree(base.base) == base_tree
        for kid in kids:
            await kid.close()
        assert _mounts_naming(base.root) == []
        assert os.path.exists(base.root) and base.kept  # for the session's next fork
        session = tk.session_id
    assert not os.path.exists(base.root)  # gone with the session that kept it
    assert _engine_leftovers(tk, session) == []


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_sessions_next_fork_brings_its_kept_base_up_to_date(
        engine: str, workspace: Path) -> None:
    """Decision 513: once a fork's children closed, the session's next fork restores into the
    same base only what changed (a file rewritten, one deleted, one added, a directory
    removed); a fork while children still hold it gets a new base, and the old one goes with
    its last child."""
    (workspace / "README").write_text("readme\n")
    (workspace / "README").chmod(0o666)
    async with Toolkit(backend(engine, str(workspace))) as tk:
        await run(tk, "mkdir -p src/deep old && echo 'x = 1' > src/deep/mod.py && "
                      "echo o > old/f && for i in $(seq 200); do echo $i > src/f$i; done")
        first = [k for k in await tk.fork(2) if isinstance(k, Toolkit)]
        base = first[0].backend.sandbox.mode.overlay.base  # type: ignore[attr-defined]
        for kid in first:
            await kid.close()
        await run(tk, "echo 'x = 2' > src/deep/mod.py && rm src/f7 && rm -r old && "
                      "echo new > new.txt")
        second = [k for k in await tk.fork(2) if isinstance(k, Toolkit)]
        assert second[0].backend.sandbox.mode.overlay.base is base  # type: ignore[attr-defined]
        assert base.restores == 2
        assert _tree(base.base) == _tree(str(workspace))  # exactly the parent's files now
        for kid in second:
            assert await run(kid, "cat src/deep/mod.py new.txt; ls src | wc -l; "
                                  "ls old 2>&1 | head -c 3") == "x = 2\nnew\n200\nls:"
        # a fork while the second fork's children hold the base: a base of its own
        (third,) = await tk.fork(1)
        assert isinstance(third, Toolkit)
        other = third.backend.sandbox.mode.overlay.base  # type: ignore[attr-defined]
        assert other is not base and other.restores == 1 and not base.kept
        for kid in second:
            await kid.close()
        assert not os.path.exists(base.root)  # no longer kept: gone with its last child
        await third.close()
        assert os.path.exists(other.root)
    assert not os.path.exists(other.root)


@pytest.mark.parametrize("engine", ENGINES)
async def test_what_a_hostile_child_makes_in_its_upper_dir_never_reaches_the_host(
        engine: str, workspace: Path, tmp_path: Path) -> None:
    """Links to host paths, a 0000 directory, a fifo, the overlay's own attributes: the
    upper dir is removed name by name at close (no link followed), the base is not written,
    and keep() brings home by the copy-back rule (links as links, no fifo)."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious\n")
    (workspace / "README").write_text("readme\n")
    async with Toolkit(backend(engine, str(workspace))) as tk:
        kids = [k for k in await tk.fork(2) if isinstance(k, Toolkit)]
        hostile, sibling = kids
        base = hostile.backend.sandbox.mode.overlay.base  # type: ignore[attr-defined]
        base_tree = _tree(base.base)
        await run(hostile, f"ln -s {victim} to-victim; ln -s {base.base} to-base; "
                           f"ln -s {victim}/keep.txt README.link; mkfifo pipe; "
                           "mkdir -p locked/in && echo x > locked/in/f && chmod 000 locked/in "
                           "locked; rm README")
        # the overlay's own attributes (redirects, opaque dirs) never reach the upper dir:
        # trusted.* is refused, user.overlay.* escaped where the overlay keeps its own there
        await hostile.call("bash", {"command": (
            "mkdir d && python3 -c \"import os\n"
            "for n in ('trusted.overlay.redirect', 'user.overlay.redirect', "
            "'trusted.overlay.opaque', 'user.overlay.opaque'):\n"
            "    try:\n"
            "        os.setxattr('d', n, b'/etc')\n"
            "    except OSError:\n"
            "        pass\"")})
        overlay = hostile.backend.sandbox.mode.overlay  # type: ignore[attr-defined]
        upper_d = os.path.join(base.root, overlay.dir, "upper", "d")
        own = ("trusted.overlay.", "user.overlay.") if base.userxattr else ("trusted.overlay.",)
        names = os.listxattr(upper_d, follow_symlinks=False)
        assert not [n for n in names if n.startswith(own) and n.count("overlay.") == 1], names
        assert await run(sibling, "cat README; ls") == "readme\nREADME\n"
        assert _tree(base.base) == base_tree
        report = await hostile.keep()
        assert "README" in report.deleted and "pipe" not in report.added, report
        assert os.path.islink(workspace / "to-victim")  # a link, as a link
        for kid in kids:
            await kid.close()
        assert _tree(base.base) == base_tree  # kept for a next fork: as the restore left it
    assert not os.path.exists(base.root)
    assert (victim / "keep.txt").read_text() == "precious\n"
    assert sorted(os.listdir(victim)) == ["keep.txt"]


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_hostile_tree_restored_into_the_base_keeps_the_restores_rules(
        engine: str, workspace: Path, tmp_path: Path) -> None:
    """Links that leave the tree, a set-id file, a link where a directory's name could be:
    the base is made by the same safe restore as any (decision 403): links stay links, the
    set-id bits go, nothing is written outside the base."""
    victim = tmp_path / "victim"
    victim.mkdir()
    async with Toolkit(backend(engine, str(workspace))) as tk:
        await run(tk, f"ln -s {victim} out; ln -s ../../.. up; ln -s / root; echo s > setid;"
                      " (chmod 4755 setid 2>/dev/null || true); mkdir -p a/b && echo deep > a/b/c")
        kids = [k for k in await tk.fork(2) if isinstance(k, Toolkit)]
        base = kids[0].backend.sandbox.mode.overlay.base  # type: ignore[attr-defined]
        assert os.readlink(os.path.join(base.base, "out")) == str(victim)
        assert os.path.islink(os.path.join(base.base, "root"))
        assert os.stat(os.path.join(base.base, "setid")).st_mode & 0o6000 == 0
        shown = await run(kids[1], "cat a/b/c; stat -c %A setid")
        assert shown.startswith("deep\n") and "s" not in shown.split("\n")[1], shown
        for kid in kids:
            await kid.close()
    assert os.listdir(victim) == []


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_forked_child_can_fork_snapshot_restore_and_keep(
        engine: str, workspace: Path) -> None:
    (workspace / "a.txt").write_text("a\n")
    (workspace / "a.txt").chmod(0o666)
    async with Toolkit(backend(engine, str(workspace))) as tk:
        (child,) = await tk.fork(1)
        assert isinstance(child, Toolkit)
        snap = await child.snapshot()
        await run(child, "echo b > a.txt; echo new > b.txt")
        restored = await child.restore(snap)
        assert restored.removed >= 1
        assert await run(child, "cat a.txt; ls") == "a\na.txt\n"
        await run(child, "echo child > a.txt")
        (grandchild,) = await child.fork(1)
        assert isinstance(grandchild, Toolkit)
        assert grandchild.backend.sandbox.mode.overlay is not None  # type: ignore[attr-defined]
        assert await run(grandchild, "cat a.txt") == "child\n"
        await run(grandchild, "echo grand > g.txt")
        kept = await grandchild.keep()  # home: the child's private dir, filled at the fork
        assert kept.added == ["g.txt"] and not kept.conflicts, kept
        await grandchild.close()
        report = await child.keep()
        assert report.modified == ["a.txt"], report
        await child.close()
        assert (workspace / "a.txt").read_text() == "child\n"
    assert {p for p in _fork_dirs() if str(Path(p).parent) != tempfile.gettempdir()} == set()


@pytest.mark.parametrize("engine", REMOTE_ENGINES)
async def test_a_remote_engines_fork_is_still_a_copy(engine: str, workspace: Path) -> None:
    """An engine on another machine cannot see this one's directories: today's copy."""
    async with Toolkit(backend(engine, str(workspace))) as tk:
        (child,) = await tk.fork(1)
        assert isinstance(child, Toolkit)
        assert child.backend.sandbox.mode.overlay is None  # type: ignore[attr-defined]
        await child.close()


_CRASHING = textwrap.dedent("""
    import asyncio, os, sys
    sys.path.insert(0, sys.argv[2])
    from toolseam import CouldNotRunError, Toolkit
    from tests.support.engines import backend

    async def main() -> None:
        tk = Toolkit(backend(sys.argv[1], sys.argv[3]))
        await tk.open()
        kids = await tk.fork(2)
        root = kids[0].backend.sandbox.mode.overlay.base.root
        print(tk.session_id, root, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
""")


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_dead_process_fork_dirs_go_with_the_next_janitor(
        engine: str, workspace: Path) -> None:
    """The process that forked is killed: its children's containers, overlay volumes (and
    their mounts) and the fork's dir are taken by the janitor of the next session there."""
    (workspace / "f").write_text("f\n")
    repo = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen([sys.executable, "-c", _CRASHING, engine, repo, str(workspace)],
                            stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        assert proc.stdout is not None
        line: list[str] = []
        while len(line) != 2 or not line[1].startswith("/"):
            text = proc.stdout.readline()
            assert text, "the forking process ended before it forked"
            line = text.split()
        session, root = line
        assert os.path.isdir(os.path.join(root, "base"))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert os.path.isdir(root)  # the dead process's close never ran
    async with Toolkit(backend(engine, str(workspace))) as tk:  # its janitor passes at open
        await run(tk, "true")
        assert _engine_leftovers(tk, session) == []
    deadline = time.monotonic() + 10
    while os.path.exists(root) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not os.path.exists(root)
    assert _mounts_naming(root) == []


def test_the_sweep_removes_only_a_dead_processs_fork_dirs_and_follows_no_link(
        tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("k\n")
    dead = subprocess.Popen(["true"])
    dead.wait()
    SnapshotStore()  # makes the store's dirs
    parent = fork_parent(None)
    gone = os.path.join(parent, f"{FORK_PREFIX}{dead.pid}-1000-abcdef")
    os.makedirs(os.path.join(gone, "c-1", "upper", "locked"))
    os.symlink(str(victim), os.path.join(gone, "c-1", "upper", "out"))
    os.chmod(os.path.join(gone, "c-1", "upper", "locked"), 0)
    me = os.path.join(parent, f"{FORK_PREFIX}{os.getpid()}-"
                              f"{int(__import__('psutil').Process().create_time() * 1000)}-abcdef")
    os.makedirs(me)
    link = os.path.join(parent, f"{FORK_PREFIX}{dead.pid}-1000-fedcba")
    os.symlink(str(victim), link)
    try:
        removed = sweep_fork_dirs()
        assert gone in removed and not os.path.exists(gone)
        assert os.path.isdir(me)  # a live process's
        assert os.path.islink(link)  # a link is never taken for a fork dir
        assert sorted(os.listdir(victim)) == ["keep"]
    finally:
        os.rmdir(me)
        os.unlink(link)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_child_opens_with_its_parents_tmp_whether_or_not_it_changed(
        engine: str, workspace: Path) -> None:
    """A parent that wrote nothing outside its workspace gives its children nothing to
    restore there (a new container's /tmp is the snapshot's); one that did, its /tmp."""
    async with Toolkit(backend(engine, str(workspace))) as tk:
        (pristine,) = await tk.fork(1)
        assert isinstance(pristine, Toolkit)
        assert await run(pristine, "stat -c %a /tmp; ls -A /tmp") == "1777\n"
        await pristine.close()
        await run(tk, "echo t > /tmp/t && chmod 700 /tmp")
        (changed,) = await tk.fork(1)
        assert isinstance(changed, Toolkit)
        assert await run(changed, "stat -c %a /tmp; cat /tmp/t") == "700\nt\n"
        await changed.close()


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_tampered_store_entry_fails_every_child_and_leaves_nothing(
        engine: str, workspace: Path, store: Path) -> None:
    """The base is restored by the safe restore, each object checked against its digest: a
    tampered one makes every child a CouldNotRunError in its place, and nothing of the fork
    is left (no base, no container, no volume)."""
    (workspace / "keep.txt").write_text("precious\n")
    async with Toolkit(backend(engine, str(workspace))) as tk:
        await tk.snapshot()  # the fork's snapshot finds the file stored already
        (target,) = [p for p in (store / "objects").rglob("*") if p.is_file()]
        target.chmod(0o600)
        target.write_bytes(b"evil\n")
        children = await tk.fork(2)
        assert all(isinstance(c, CouldNotRunError) for c in children), children
        assert all(isinstance(c, SnapshotCorruptError) for c in children), children
        assert list((store / "branches").iterdir()) == []
        assert await run(tk, "cat keep.txt") == "precious\n"
        session = tk.session_id
    assert _engine_leftovers(tk, session) == []
    assert [d for d in _fork_dirs() if f"fork-{os.getpid()}-" in d] == []
