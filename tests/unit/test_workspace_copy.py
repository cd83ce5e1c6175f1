"""The copy of the base dir for sandboxes without a shared filesystem, and its copy-back rule.

The sandbox side is played by a real directory: what ``pack`` sends is unpacked there, changed,
and archived the way an engine's archive API returns a workspace (under ``workspace/``).
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolseam.backends.containers.workspace_sync.policy import CONFLICT_SUFFIX, CopyLimitError
from toolseam.backends.containers.workspace_sync.tar_sync import WorkspaceCopy
from toolseam.seam.errors import CouldNotRunError


def unpack(copy: WorkspaceCopy, sandbox: Path) -> None:
    buffer = io.BytesIO()
    copy.pack(buffer)
    buffer.seek(0)
    with tarfile.open(fileobj=buffer) as tar:
        tar.extractall(sandbox, filter="tar")


def archive_of(sandbox: Path) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(sandbox, arcname="workspace")
    buffer.seek(0)
    return buffer


def tree(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry below root: kind, permission bits, content or link target."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = str(path.relative_to(root))
            st_ = path.lstat()
            if path.is_symlink():
                found[rel] = ("link", 0, os.readlink(path))
            elif path.is_dir():
                found[rel] = ("dir", stat.S_IMODE(st_.st_mode), "")
            else:
                found[rel] = ("file", stat.S_IMODE(st_.st_mode), path.read_bytes().hex())
    return found


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    host, sandbox = tmp_path / "host", tmp_path / "sandbox"
    host.mkdir()
    sandbox.mkdir()
    return host, sandbox


def test_every_kind_of_change_comes_home(dirs: tuple[Path, Path]) -> None:
    host, sandbox = dirs
    (host / "keep.txt").write_text("same\n")
    (host / "edit.txt").write_text("old\n")
    (host / "gone.txt").write_text("bye\n")
    (host / "old-dir").mkdir()
    (host / "old-dir" / "f").write_text("f\n")
    (host / "link").symlink_to("keep.txt")
    copy = WorkspaceCopy(str(host))
    unpack(copy, sandbox)
    assert tree(sandbox) == tree(host)

    (sandbox / "edit.txt").write_text("new\n")
    (sandbox / "gone.txt").unlink()
    (sandbox / "old-dir" / "f").unlink()
    (sandbox / "old-dir").rmdir()
    (sandbox / "new" / "deep").mkdir(parents=True)
    (sandbox / "new" / "deep" / "x.sh").write_text("#!/bin/sh\n")
    (sandbox / "new" / "deep" / "x.sh").chmod(0o755)
    (sandbox / "link").unlink()
    (sandbox / "link").symlink_to("edit.txt")
    (sandbox / "keep.txt").chmod(0o600)

    report = copy.apply(archive_of(sandbox))
    assert tree(host) == tree(sandbox)
    assert sorted(report.added) == ["new", "new/deep", "new/deep/x.sh"]
    assert sorted(report.modified) == ["edit.txt", "keep.txt", "link"]
    assert sorted(report.deleted) == ["gone.txt", "old-dir", "old-dir/f"]
    assert report.conflicts == [] and report.refused == []
    # a second copy-back with nothing new changes nothing
    again = copy.apply(archive_of(sandbox))
    assert not again.changed and tree(host) == tree(sandbox)


def test_both_sides_changed_keeps_both_versions(dirs: tuple[Path, Path]) -> None:
    host, sandbox = dirs
    (host / "a.txt").write_text("base\n")
    (host / "b.txt").write_text("base\n")
    (host / "c.txt").write_text("base\n")
    copy = WorkspaceCopy(str(host))
    unpack(copy, sandbox)
    (sandbox / "a.txt").write_text("sandbox\n")
    (sandbox / "b.txt").unlink()
    (sandbox / "n.txt").write_text("sandbox\n")
    (sandbox / "c.txt").write_text("sandbox\n")
    # the host edits a and b, and creates n, while the sandbox runs; c it leaves alone
    (host / "a.txt").write_text("host edit\n")
    (host / "b.txt").write_text("host edit!\n")
    (host / "n.txt").write_text("host\n")

    report = copy.apply(archive_of(sandbox))
    assert sorted(report.conflicts) == ["a.txt", "b.txt", "n.txt"]
    assert (host / "a.txt").read_text() == "host edit\n"
    assert (host / ("a.txt" + CONFLICT_SUFFIX)).read_text() == "sandbox\n"
    assert (host / "b.txt").read_text() == "host edit!\n"  # the sandbox's deletion lost nothing
    assert (host / "n.txt").read_text() == "host\n"
    assert (host / ("n.txt" + CONFLICT_SUFFIX)).read_text() == "sandbox\n"
    assert report.modified == ["c.txt"] and (host / "c.txt").read_text() == "sandbox\n"


def test_a_hostile_archive_writes_nothing_outside(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    host, _ = dirs
    outside = tmp_path / "outside"
    outside.mkdir()
    copy = WorkspaceCopy(str(host))
    copy.pack(io.BytesIO())
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        def add(name: str, data: bytes = b"x", **fields: object) -> None:
            info = tarfile.TarInfo(name)
            for key, value in fields.items():
                setattr(info, key, value)
            info.size = len(data) if info.type == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)
        add("workspace", type=tarfile.DIRTYPE)
        add("workspace/../outside/a.txt")
        add("/etc/toolseam-test")
        add("workspace/esc", type=tarfile.SYMTYPE, linkname=str(outside))
        add("workspace/esc/through.txt")  # a file through the symlink just made
        add("workspace/hard", type=tarfile.LNKTYPE, linkname="/etc/passwd")
        add("workspace/dev", type=tarfile.CHRTYPE)
        add("workspace/ok.txt", b"fine")
    buffer.seek(0)
    report = copy.apply(buffer)
    assert list(outside.iterdir()) == []
    assert not os.path.exists("/etc/toolseam-test")
    assert (host / "ok.txt").read_bytes() == b"fine"
    assert os.readlink(host / "esc") == str(outside)  # a symlink comes home as a symlink
    assert set(report.refused) == {"../outside/a.txt", "/etc/toolseam-test", "esc/through.txt",
                                   "hard", "dev"}


def test_the_copy_limit_refuses_before_writing(dirs: tuple[Path, Path]) -> None:
    host, sandbox = dirs
    (host / "small.txt").write_text("x")
    copy = WorkspaceCopy(str(host), limit=1000)
    unpack(copy, sandbox)
    (sandbox / "big.bin").write_bytes(b"z" * 5000)
    (sandbox / "small.txt").write_text("changed")
    with pytest.raises(CopyLimitError, match="larger than the copy limit of 1000 bytes"):
        copy.apply(archive_of(sandbox))
    assert sorted(p.name for p in host.iterdir()) == ["small.txt"]
    assert (host / "small.txt").read_text() == "x"
    (host / "huge.bin").write_bytes(b"y" * 2000)
    with pytest.raises(CopyLimitError, match="the base dir"):
        WorkspaceCopy(str(host), limit=1000).pack(io.BytesIO())


def test_packing_follows_no_symlink_and_skips_special_files(dirs: tuple[Path, Path],
                                                            tmp_path: Path) -> None:
    host, sandbox = dirs
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("do not copy")
    (host / "to-dir").symlink_to(secret)
    (host / "to-file").symlink_to(secret / "key")
    os.mkfifo(host / "pipe")
    copy = WorkspaceCopy(str(host))
    unpack(copy, sandbox)
    assert tree(sandbox) == {"to-dir": ("link", 0, str(secret)),
                             "to-file": ("link", 0, str(secret / "key"))}


_names = st.sampled_from(["a", "b", "c.txt", "d d", "é", "x.sh"])
_paths = st.lists(_names, min_size=1, max_size=3).map("/".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(initial=st.dictionaries(_paths, st.binary(max_size=40), max_size=8),
       changes=st.lists(st.tuples(st.sampled_from(["write", "delete", "chmod", "link"]), _paths,
                                  st.binary(max_size=40)), max_size=8))
def test_copy_back_makes_the_host_what_the_sandbox_left(tmp_path_factory: pytest.TempPathFactory,
                                                        initial: dict[str, bytes],
                                                        changes: list[tuple[str, str, bytes]]
                                                        ) -> None:
    """Property: whatever the sandbox does to its copy, after copy-back the host dir is the
    same tree (kinds, modes, bytes, link targets), when the host changed nothing meanwhile."""
    root = tmp_path_factory.mktemp("prop")
    host, sandbox = root / "host", root / "sandbox"
    host.mkdir()
    sandbox.mkdir()
    for rel, data in initial.items():
        _put(host, rel, data)
    copy = WorkspaceCopy(str(host))
    unpack(copy, sandbox)
    assert tree(sandbox) == tree(host)
    for action, rel, data in changes:
        target = sandbox / rel
        if action == "write":
            _put(sandbox, rel, data)
        elif action == "delete" and (target.is_symlink() or target.is_file()):
            target.unlink()
        elif action == "chmod" and target.is_file() and not target.is_symlink():
            target.chmod(0o700)
        elif (action == "link" and not target.exists() and not target.is_symlink()
              and target.parent.is_dir() and not target.parent.is_symlink()):
            target.symlink_to("../" + rel)
    report = copy.apply(archive_of(sandbox))
    assert report.conflicts == [] and report.refused == []
    assert tree(host) == tree(sandbox)


def _put(root: Path, rel: str, data: bytes) -> None:
    """Write rel below root, when no file or symlink is in the way of its directories."""
    parts = rel.split("/")
    here = root
    for part in parts[:-1]:
        here = here / part
        if here.is_symlink() or here.is_file():
            return
        here.mkdir(exist_ok=True)
    target = here / parts[-1]
    if target.is_dir() and not target.is_symlink():
        return
    if target.is_symlink():
        target.unlink()
    target.write_bytes(data)


def test_a_stopped_podman_containers_layout_is_read_the_same(dirs: tuple[Path, Path]) -> None:
    """A stopped podman container archives /workspace as "" then "/a.txt" (a running one, and
    docker, as "workspace/a.txt"); read wrongly, every file would look deleted."""
    host, sandbox = dirs
    (host / "a.txt").write_text("a\n")
    (host / "b.txt").write_text("b\n")
    copy = WorkspaceCopy(str(host))
    unpack(copy, sandbox)
    (sandbox / "b.txt").write_text("changed\n")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(sandbox, arcname="", recursive=False)
        for path in sorted(sandbox.iterdir()):
            info = tar.gettarinfo(str(path))
            info.name = "/" + path.name  # gettarinfo would strip the slash
            with path.open("rb") as data:
                tar.addfile(info, data)
    buffer.seek(0)
    with tarfile.open(fileobj=io.BytesIO(buffer.getvalue())) as check:
        assert check.getnames()[:2] == ["", "/a.txt"]
    report = copy.apply(buffer)
    assert report.modified == ["b.txt"] and report.deleted == [] and report.refused == []
    assert tree(host) == tree(sandbox)


@pytest.mark.parametrize("members", [[], ["a.txt"]])
def test_an_archive_without_the_workspace_directory_changes_nothing(
        dirs: tuple[Path, Path], members: list[str]) -> None:
    host, _ = dirs
    (host / "a.txt").write_text("keep\n")
    copy = WorkspaceCopy(str(host))
    copy.pack(io.BytesIO())
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in members:
            info = tarfile.TarInfo(name)
            tar.addfile(info, io.BytesIO())
    buffer.seek(0)
    with pytest.raises(CouldNotRunError, match="does not start with the workspace directory"):
        copy.apply(buffer)
    assert (host / "a.txt").read_text() == "keep\n"
