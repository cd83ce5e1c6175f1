"""A directory the sandbox's packer finds unchanged is one header (``toolseam_agent/pack.py``
``dirs``, ``snapshots/unchanged_dirs.py``; issue 48, decision 488): the packer itself, run here
on a directory of this machine, and the host's reading of what it sends.

* after any writes, deletes, renames, chmods, links (hard and symbolic) and fifos between two
  packs, the second (with the first's sums) gives the very tree a pack without them gives,
  entry for entry and in the same order (hypothesis);
* after one changed file, the pack of 300 files in 10 directories is a few headers;
* a directory said unchanged that the host never read with that sum, or read for a snapshot
  no longer in the store, refuses the whole tree.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolseam.backends.containers.workspace_restore import DigestOnly
from toolseam.backends.snapshots.archive import capture_archive
from toolseam.backends.snapshots.capture import Captured, DirSeen, Known
from toolseam.backends.snapshots.manifest import SnapshotCorruptError
from toolseam_agent import pack

LIMIT = 1 << 30


class _Kept(DigestOnly):
    """Digests only; the snapshot ``prev`` is in the store (its objects too)."""

    def has_snapshot(self, snapshot_id: str) -> bool:
        return snapshot_id == "prev"


def _pack(root: Path, known: Known | None, scratch: Path) -> bytes:
    plan = {"base": str(root).lstrip("/"), "prefix": "workspace", "changed": [],
            "whole": [""], "limit": LIMIT,
            "known": {n: list(k) for n, (k, _) in known.files.items()} if known else {},
            "dirs": {n: seen.summary for n, seen in known.dirs.items()} if known else {}}
    (scratch / "plan.json").write_text(json.dumps(plan))
    out = scratch / "out.tar"
    out.unlink(missing_ok=True)
    assert pack.pack(str(scratch / "plan.json"), str(out)) == 0
    return out.read_bytes()


def _read(data: bytes, known: Known | None) -> Captured:
    taken = capture_archive([data], _Kept(), LIMIT, known)
    taken.known.source = "prev"
    return taken


def _tree(taken: Captured) -> tuple[object, object]:
    return taken.entries, taken.left_out


NAMES = st.sampled_from(["a", "b", "d/x", "d/y", "d/e/z", "n\udcff"])
OPS = st.one_of(
    st.tuples(st.just("write"), NAMES, st.binary(max_size=8)),
    st.tuples(st.just("rm"), NAMES, st.none()),
    st.tuples(st.just("rename"), NAMES, NAMES),
    st.tuples(st.just("chmod"), NAMES, st.sampled_from([0o600, 0o755])),
    st.tuples(st.just("hardlink"), NAMES, NAMES),
    st.tuples(st.just("symlink"), NAMES, st.sampled_from(["/etc", "../a"])),
    st.tuples(st.just("fifo"), NAMES, st.none()),
    st.tuples(st.just("mkdir"), st.sampled_from(["d", "d/e", "f"]), st.none()))


def _apply(root: Path, op: tuple[str, str, object]) -> None:
    kind, name, arg = op
    path = root / name
    # The suite runs as root: an op that would follow a link out of the tree (to /etc) is
    # skipped, never done there (this test once left /etc mode 600).
    inside = root.resolve()
    if not path.parent.resolve().is_relative_to(inside) or (
            kind in ("write", "chmod", "hardlink") and not path.resolve().is_relative_to(inside)):
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "write":
            assert isinstance(arg, bytes)
            if path.exists() and not path.is_file():  # a fifo's open would wait for a reader
                return
            with open(path, "ab") as out:  # the same inode, a new size
                out.write(arg)
        elif kind == "rm" and not path.is_dir():
            path.unlink()
        elif kind == "rename":
            os.rename(path, root / str(arg))
        elif kind == "chmod":
            assert isinstance(arg, int)
            path.chmod(arg)
        elif kind == "hardlink":
            os.link(path, root / str(arg))
        elif kind == "symlink":
            os.symlink(str(arg), path)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "mkdir":
            path.mkdir()
    except OSError:
        pass  # the op does not apply to this tree: the next one will


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.lists(OPS, max_size=10), between=st.lists(OPS, max_size=10))
def test_any_changes_between_two_packs_give_the_whole_packs_tree(
        tmp_path_factory: pytest.TempPathFactory, before: list[tuple[str, str, object]],
        between: list[tuple[str, str, object]]) -> None:
    scratch = tmp_path_factory.mktemp("pack")
    root = scratch / "ws"
    (root / "d" / "e").mkdir(parents=True)
    for op in before:
        _apply(root, op)
    first = _read(_pack(root, None, scratch), None)
    again = _read(_pack(root, first.known, scratch), first.known)
    assert _tree(again) == _tree(first)
    for op in between:
        _apply(root, op)
    whole = _read(_pack(root, None, scratch), None)
    second = _read(_pack(root, again.known, scratch), again.known)
    assert _tree(second) == _tree(whole)
    assert {p: k for p, (k, _) in second.known.files.items()} == {
        p: k for p, (k, _) in whole.known.files.items()}


def test_one_changed_file_sends_its_directory_only(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    for folder in range(10):
        (root / f"d{folder}").mkdir(parents=True)
        for number in range(30):
            (root / f"d{folder}" / f"f{number}").write_bytes(os.urandom(100))
    first_pack = _pack(root, None, tmp_path)
    first = _read(first_pack, None)
    (root / "d3" / "f7").write_bytes(b"changed")
    second_pack = _pack(root, first.known, tmp_path)
    with tarfile.open(fileobj=io.BytesIO(second_pack)) as tar:
        names = [m.name for m in tar]
    assert names == ["workspace", *(f"workspace/d{n}" for n in range(3)), "workspace/d3",
                     *sorted((f"workspace/d3/f{n}" for n in range(30)), key=os.fsencode),
                     *(f"workspace/d{n}" for n in range(4, 10))]
    assert _tree(_read(second_pack, first.known)) == _tree(_read(_pack(root, None, tmp_path),
                                                                 None))


def test_a_directory_said_unchanged_that_the_host_did_not_see_is_refused(
        tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_text("one")
    first = _read(_pack(root, None, tmp_path), None)
    forged = Known(first.known.files, "prev", {
        **first.known.dirs, "d": DirSeen("0" * 64, first.known.dirs["d"].children)})
    data = _pack(root, first.known, tmp_path)  # "d" is said unchanged: its sum is the first's
    with pytest.raises(SnapshotCorruptError, match="said unchanged"):
        capture_archive([data], _Kept(), LIMIT, forged)  # the host saw another sum
    gone = Known(first.known.files, "deleted-since", first.known.dirs)
    with pytest.raises(SnapshotCorruptError, match="said unchanged"):
        capture_archive([data], _Kept(), LIMIT, gone)  # its snapshot left the store
    with pytest.raises(SnapshotCorruptError, match="said unchanged"):
        capture_archive([data], _Kept(), LIMIT, None)  # the host knows nothing
