"""Packing a directory a sandbox can change (decision 510): the server's copy of a caller's
workspace (``remote/copied.py``), packed while a command may still run in it, never reads
through a link swapped in between the walk's look at a name and its use of it; its size guard
counts what is packed and stops before the file that passes it is read. For a quiet tree the
pack is what ``tarfile.add`` made (hypothesis)."""

from __future__ import annotations

import io
import os
import resource
import stat
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolseam.backends.remote import copied
from toolseam.backends.remote.workspace import pack
from toolseam.backends.snapshots.capture import TreeChangedError
from toolseam.seam.errors import CouldNotRunError

SECRET = b"the server's own secret 7f3a"
SECRET_PART = SECRET[:12]  # a file's header says its size: a swapped-in file is read cut


def _members(archive: bytes) -> dict[str, tuple[str, int, str, bytes]]:
    """Each member's kind, mode, link target and content, by name."""
    found = {}
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        for member in tar:
            data = tar.extractfile(member) if member.isreg() else None
            kind = {tarfile.REGTYPE: "file", tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "link",
                    tarfile.FIFOTYPE: "fifo"}.get(member.type, repr(member.type))
            found[member.name] = (kind, member.mode, member.linkname,
                                  data.read() if data is not None else b"")
    return found


def _copied_root(tmp_path: Path) -> tuple[Path, Path]:
    """A server's copied directory (``root/workspace/sub/a.txt``) and a directory outside it
    holding the secret."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "workspace" / "sub").mkdir(parents=True)
    (root / "workspace" / "sub" / "a.txt").write_text("the sandbox's own\n")
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SECRET)
    return root, outside


def _swap_after_first_look(monkeypatch: pytest.MonkeyPatch, name: str,
                           swap: Callable[[], None]) -> None:
    """The first time the packer looks at ``name`` (``lstat`` by path, as tarfile does, or
    ``stat`` below a directory's descriptor), ``swap`` runs right after the look: a command
    changing the tree between a reader's check and its use, made deterministic. Looks by
    ``os.path`` (``os.walk``'s) and by the old size pre-walk in ``copied`` are not the
    packer's: the swap would come before the packer read the name at all."""
    done = []

    def looking(real: Callable[..., os.stat_result], no_follow: bool
                ) -> Callable[..., os.stat_result]:
        def look(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
            seen = real(path, *args, **kwargs)
            caller = sys._getframe(1).f_globals.get("__name__")
            if not done and os.path.basename(os.fsdecode(path)) == name and (
                    no_follow or kwargs.get("follow_symlinks") is False) and (
                    caller not in ("posixpath", copied.__name__)):
                done.append(True)
                swap()
            return seen
        return look

    monkeypatch.setattr(os, "lstat", looking(os.lstat, True))
    monkeypatch.setattr(os, "stat", looking(os.stat, False))


def test_a_directory_swapped_for_a_link_mid_walk_is_packed_as_the_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, outside = _copied_root(tmp_path)
    sub = root / "workspace" / "sub"

    def swap() -> None:
        os.rename(sub, root / "workspace" / "sub.d")
        os.symlink(outside, sub)

    _swap_after_first_look(monkeypatch, "sub", swap)
    archive = copied._pack_dir(str(root))
    monkeypatch.undo()
    assert SECRET_PART not in archive
    members = _members(archive)
    assert not any(name.endswith("secret.txt") for name in members)
    assert members["workspace/sub"][0::2] == ("link", str(outside))
    assert members["workspace/sub.d/a.txt"][3] == b"the sandbox's own\n"
    assert (outside / "secret.txt").read_bytes() == SECRET and os.listdir(outside) == [
        "secret.txt"]


@pytest.mark.parametrize("becomes", ["link", "fifo", "gone"])
def test_a_file_swapped_mid_walk_is_packed_as_what_it_became(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, becomes: str) -> None:
    """A link to a secret file, or a fifo (never opened: a fifo nobody writes to would
    block a reader for good), in a file's place between the look and the read; a file
    removed meanwhile is left out, as if the listing came a moment later."""
    root, outside = _copied_root(tmp_path)
    target = root / "workspace" / "sub" / "a.txt"

    def swap() -> None:
        os.unlink(target)
        if becomes == "link":
            os.symlink(outside / "secret.txt", target)
        elif becomes == "fifo":
            os.mkfifo(target)

    _swap_after_first_look(monkeypatch, "a.txt", swap)
    archive = copied._pack_dir(str(root))
    monkeypatch.undo()
    assert SECRET_PART not in archive
    members = _members(archive)
    assert members.get("workspace/sub/a.txt", ("gone",))[0] == becomes
    assert members["workspace/sub"][0] == "dir"


def test_a_tree_that_keeps_changing_is_refused_not_packed_half(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pack of the tree sees a swap (a command looping ``mv``/``ln``): after its tries,
    a retryable error naming the name — never an archive with the directory read as emptied
    or followed."""
    root, _outside = _copied_root(tmp_path)
    sub = root / "workspace" / "sub"
    real_open, swaps = os.open, []

    def swapping_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if path == "sub" and flags & os.O_DIRECTORY:  # between the walk's stat and its open
            swaps.append(True)
            os.rename(sub, root / "workspace" / f"sub.{len(swaps)}")
            os.mkdir(sub)  # another directory in its place: another inode
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", swapping_open)
    with pytest.raises(TreeChangedError, match="'sub' changed while") as raised:
        copied._pack_dir(str(root))
    assert raised.value.retryable and len(swaps) == 3  # packed three times, then refused


def test_the_size_guard_counts_what_is_packed_and_reads_nothing_past_it(
        tmp_path: Path) -> None:
    """A sparse terabyte after a few real files: refused by name within moments (reading it
    would take hours), the message naming the size reached and the limit."""
    root, _outside = _copied_root(tmp_path)
    with open(root / "workspace" / "sub" / "huge.bin", "wb") as huge:
        huge.truncate(1 << 40)
    started = time.monotonic()
    with pytest.raises(CouldNotRunError, match=r"takes \d+ bytes or more \(at 'sub/huge.bin'\)"
                       r", more than a copy home carries \(\d+\)") as refused:
        copied._pack_dir(str(root))
    assert refused.value.cause == "copy_back_failed" and not refused.value.retryable
    assert time.monotonic() - started < 5


# --- a quiet tree: what tarfile.add made -------------------------------------------------
_NAMES = ["a", "b", "é", "sub", ".hidden", "z" * 200]
_paths = st.lists(st.sampled_from(_NAMES), min_size=1, max_size=3).map("/".join)
_ops = st.one_of(
    st.tuples(st.just("file"), _paths, st.binary(max_size=300),
              st.sampled_from([0o644, 0o600, 0o755, 0o4755, 0o444])),
    st.tuples(st.just("dir"), _paths, st.just(b""), st.sampled_from([0o755, 0o700, 0o1777])),
    st.tuples(st.just("link"), _paths, st.sampled_from([b"a", b"../..", b"/etc", b"b/\xff"]),
              st.just(0)),
    st.tuples(st.just("fifo"), _paths, st.just(b""), st.just(0o644)),
)


def _make(root: Path, op: str, rel: str, data: bytes, mode: int) -> None:
    path = root / rel
    if not (path.parent.is_dir() and not path.parent.is_symlink()) or os.path.lexists(path):
        return
    if op == "file":
        path.write_bytes(data)
    elif op == "dir":
        path.mkdir()
    elif op == "link":
        os.symlink(data, os.fsencode(path))
        return
    else:
        os.mkfifo(path)
    path.chmod(mode)


def _tarfile_pack(path: Path) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(path, arcname="workspace", recursive=True)
    return out.getvalue()


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(_ops, max_size=12), top_mode=st.sampled_from([0o755, 0o700]))
def test_a_quiet_tree_packs_as_tarfile_packed_it(tmp_path_factory: pytest.TempPathFactory,
                                                 ops: list[tuple[str, str, bytes, int]],
                                                 top_mode: int) -> None:
    root = tmp_path_factory.mktemp("quiet") / "workspace"
    root.mkdir()
    for op in ops:
        _make(root, *op)
    root.chmod(top_mode)
    assert _members(pack(str(root), "workspace")) == _members(_tarfile_pack(root))
    assert stat.S_IMODE(root.stat().st_mode) == top_mode  # packing changed nothing


def test_a_directory_with_more_sub_directories_than_open_files_is_walked_whole(
        tmp_path: Path) -> None:
    """The walk holds one descriptor per level: 300 sub-directories under a limit of a few
    dozen open files are all packed (they were opened all at once, and those past the limit
    silently left out — read by a copy-back as deleted)."""
    root = tmp_path / "workspace"
    for n in range(300):
        (root / f"d{n:03}").mkdir(parents=True)
        (root / f"d{n:03}" / "f").write_bytes(b"%d" % n)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 40, hard))
    try:
        members = _members(pack(str(root), "workspace"))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert [members[f"workspace/d{n:03}/f"][3] for n in range(300)] == [
        b"%d" % n for n in range(300)]
