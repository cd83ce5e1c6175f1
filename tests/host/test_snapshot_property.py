"""The restore property (issue 48): whatever sequence of writes, deletes, renames, chmods,
symlinks and directories happens between a snapshot and its restore — including a rewrite that
keeps a file's size and sets its mtime back — the directory holds exactly the snapshot's tree
afterwards. Runs the real capture and apply code on real directories (no agent is needed for
either: they run in this process on the host backend too)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from toolseam.backends.snapshots import LocalSnapshots

from ..support.trees import describe

NAMES = [b"a", b"b", b"c\xff", b"d e"]
PATHS = st.lists(st.sampled_from(NAMES), min_size=1, max_size=2).map(b"/".join)
OPS = st.one_of(
    st.tuples(st.just("write"), PATHS, st.binary(max_size=64)),
    st.tuples(st.just("same-size"), PATHS, st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), PATHS),
    st.tuples(st.just("rename"), PATHS, PATHS),
    st.tuples(st.just("chmod"), PATHS, st.sampled_from([0o600, 0o644, 0o755, 0o400, 0o1777])),
    st.tuples(st.just("symlink"), PATHS, st.sampled_from([b"a", b"../x", b"/etc", b"b/c\xff"])),
    st.tuples(st.just("mkdir"), PATHS),
)


class _Session(LocalSnapshots):
    name = "host"


def _apply(root: bytes, op: tuple[object, ...]) -> None:
    """One change to the tree; one that cannot happen (a missing parent…) changes nothing."""
    kind, path = op[0], root + b"/" + op[1]  # type: ignore[operator]
    try:
        if kind == "write":
            with open(path, "wb") as out:
                out.write(op[2])  # type: ignore[arg-type]
        elif kind == "same-size" and os.path.isfile(path) and not os.path.islink(path):
            before = os.stat(path)
            data = op[2] * (before.st_size // len(op[2]) + 1)  # type: ignore[operator]
            with open(path, "r+b") as out:
                out.write(data[:before.st_size])
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime set back
        elif kind == "delete":
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        elif kind == "rename":
            os.rename(path, root + b"/" + op[2])  # type: ignore[operator]
        elif kind == "chmod" and not os.path.islink(path):
            os.chmod(path, op[2])  # type: ignore[arg-type]
        elif kind == "symlink":
            os.symlink(op[2], path)  # type: ignore[arg-type]
        elif kind == "mkdir":
            os.mkdir(path)
    except OSError:
        pass


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="snapshot-property-"))
    old = os.environ.get("TOOLSEAM_SNAPSHOTS")
    os.environ["TOOLSEAM_SNAPSHOTS"] = str(path / "store")
    yield path
    if old is None:
        del os.environ["TOOLSEAM_SNAPSHOTS"]
    else:
        os.environ["TOOLSEAM_SNAPSHOTS"] = old
    shutil.rmtree(path, ignore_errors=True)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.lists(OPS, max_size=12), between=st.lists(OPS, max_size=12),
       again=st.booleans())
@example(before=[("write", b"a", b"xyz")], between=[("same-size", b"a", b"q")], again=False)
@example(before=[("mkdir", b"a"), ("write", b"a/b", b"1")],
         between=[("delete", b"a"), ("symlink", b"a", b"/etc")], again=True)
def test_restore_leaves_exactly_the_snapshots_tree(
        scratch: Path, before: list[tuple[object, ...]], between: list[tuple[object, ...]],
        again: bool) -> None:
    root = tempfile.mkdtemp(dir=scratch)
    session = _Session()
    for op in before:
        _apply(os.fsencode(root), op)
    snap = session._take(root, None, "prop", 1 << 30)
    expected = describe(root)
    for op in between:
        _apply(os.fsencode(root), op)
    if again:  # a later snapshot of the same session: what it knows must not mislead a restore
        session._take(root, None, "prop", 1 << 30)
    session._restore(root, snap.id)
    assert describe(root) == expected
    # the same state restored again changes nothing
    assert session._restore(root, snap.id).written == 0
    shutil.rmtree(root)
