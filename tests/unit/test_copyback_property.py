"""Property (issue 18): for any tree the sandbox makes — names (multibyte, 255 bytes), modes
(set-id, sticky, world-writable), symlinks, hard links, fifos — and any step of the copy-back
failing, the host ends either as the sandbox's tree under the copy-back policy or exactly as
it was; never in between, and never with a staging dir left.

The sandbox is a real directory changed by real syscalls and archived the way the engines
archive a workspace (a hard link's second name as LNKTYPE, a fifo as FIFOTYPE)."""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from toolseam.backends.containers.workspace_sync.policy import CopyBackError, policy_mode
from toolseam.backends.containers.workspace_sync.tar_sync import WorkspaceCopy

from ..support.copyback import FailingOps, archive_of, started, tree

_NAMES = ["a", "b", "é", "日本", "é" * 127 + "x", "z" * 255]
_paths = st.lists(st.sampled_from(_NAMES), min_size=1, max_size=3).map("/".join)
_modes = st.sampled_from([0o644, 0o600, 0o755, 0o4755, 0o2755, 0o6777, 0o666, 0o777, 0o1777])
_ops = st.one_of(
    st.tuples(st.just("file"), _paths, st.binary(max_size=64), _modes),
    st.tuples(st.just("dir"), _paths, st.just(b""), _modes),
    st.tuples(st.just("link"), _paths, st.sampled_from([b"a", b"../..", b"/etc"]), st.just(0)),
    st.tuples(st.just("hardlink"), _paths, st.sampled_from([n.encode() for n in _NAMES]), st.just(0)),
    st.tuples(st.just("fifo"), _paths, st.just(b""), st.just(0)),
    st.tuples(st.just("delete"), _paths, st.just(b""), st.just(0)),
)
_host_ops = st.lists(st.tuples(st.sampled_from(["file", "dir"]), _paths, st.binary(max_size=16),
                               st.just(0o644)), max_size=6)


def _do(root: Path, op: str, rel: str, data: bytes, mode: int) -> None:
    """One change below root, when the path allows it (parents are real directories)."""
    path = root / rel
    parent = path.parent
    if not (parent.is_dir() and not parent.is_symlink()):
        return
    # A link further up (`b` -> /etc, then `b/a/...`) would be followed: the suite runs as root,
    # and this once left /etc/a with files in it. Changes stay below root, whatever the links.
    if not parent.resolve().is_relative_to(root.resolve()):
        return
    if op == "delete":
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            path.unlink()
        elif path.is_dir() and not os.listdir(path):
            path.rmdir()
        return
    if path.is_symlink() or path.exists():
        if path.is_dir() and not path.is_symlink():
            if op == "dir":
                path.chmod(mode)
            return
        path.unlink()
    if op == "file":
        path.write_bytes(data)
        path.chmod(mode)
    elif op == "dir":
        path.mkdir()
        path.chmod(mode | 0o700)
    elif op == "link":
        path.symlink_to(data.decode())
    elif op == "fifo":
        os.mkfifo(path)
    elif op == "hardlink":
        source = parent / data.decode()
        if source.is_file() and not source.is_symlink():
            os.link(source, path)


def policy_tree(sandbox: Path, before: dict[str, tuple[str, int, str]]
                ) -> dict[str, tuple[str, int, str]]:
    """What the host must be after a successful copy-back of ``sandbox``: its tree with modes
    masked; where it has a special file, the host's entry there (and below) kept."""
    now = tree(sandbox)
    special = {rel for rel, (kind, _, _) in now.items() if kind == "special"}
    expected = {}
    for rel, (kind, mode, content) in now.items():
        if rel in special:
            continue
        expected[rel] = (kind, policy_mode(mode) if kind != "link" else 0, content)
    for rel, value in before.items():
        if any(rel == s or rel.startswith(s + "/") for s in special):
            expected[rel] = value
    return expected


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(host_ops=_host_ops, ops=st.lists(_ops, min_size=3, max_size=14),
       fail_at=st.one_of(st.none(), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)),
       code=st.sampled_from([errno.ENOSPC, errno.EIO, errno.ENAMETOOLONG, errno.EDQUOT]))
def test_the_host_ends_as_the_sandbox_under_the_policy_or_unchanged(
        tmp_path_factory: pytest.TempPathFactory, host_ops: list[tuple[str, str, bytes, int]],
        ops: list[tuple[str, str, bytes, int]], fail_at: float | None, code: int) -> None:
    root = tmp_path_factory.mktemp("p")
    host, sandbox = root / "host", root / "sandbox"
    host.mkdir()
    sandbox.mkdir()
    for op in host_ops:
        _do(host, *op)
    copy = started(host, sandbox)
    for op in ops:
        _do(sandbox, *op)
    before = tree(host)
    expected = policy_tree(sandbox, before)
    if fail_at is not None:
        # the number of changes this copy-back makes, counted on a copy of the host; then
        # the failure at one of them
        dry = root / "dry"
        shutil.copytree(host, dry, symlinks=True)
        trial = WorkspaceCopy(str(dry))
        trial.baseline = dict(copy.baseline)
        trial.host_ops = counter = FailingOps(0, code)
        trial.apply(archive_of(sandbox))
        copy.host_ops = FailingOps(1 + int(fail_at * counter.calls), code)
    try:
        report = copy.apply(archive_of(sandbox))
    except CopyBackError as exc:
        assert fail_at is not None, exc
        assert tree(host) == before
        assert "left exactly as it was" in exc.reason
        event(f"failed, put back, in {copy.host_ops.failed_in}")  # type: ignore[attr-defined]
        return
    event("applied" + (f" (the failure in {copy.host_ops.failed_in or 'nothing'})" if fail_at else ""))  # type: ignore[attr-defined]
    event(f"refused: {bool(report.refused)}; hard links: {any(o[0] == 'hardlink' for o in ops)}")
    assert tree(host) == expected
    assert report.conflicts == []
    specials = {rel for rel, (kind, _, _) in tree(sandbox).items() if kind == "special"}
    assert specials <= set(report.refused)
    assert all(stat.S_IMODE(os.lstat(host / rel).st_mode) & 0o7022 == 0
               for rel, (kind, _, _) in expected.items() if kind != "link")
