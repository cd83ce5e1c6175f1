"""A snapshot is data a hostile command wrote (issue 48, safety): restoring or forking never
writes outside the session's own directory, never carries a device or a set-id bit, refuses a
tampered store entry by its digest and a manifest that names anything outside, and never reads
a store that is not this user's. Each test is an attacker's move against the real code."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from toolseam import ConfigurationError, CouldNotRunError, Toolkit
from toolseam.backends.snapshots import SnapshotCorruptError

from ..support.snapshot_stores import own_store
from ..support.trees import describe

NOBODY = 65534
STORED = hashlib.sha256(b"inside\n").hexdigest()  # an object every snapshot here holds


@pytest.fixture(autouse=True)
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return own_store(tmp_path / "store", monkeypatch)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    (path / "d").mkdir(parents=True)
    (path / "d" / "f").write_text("inside\n")
    (path / "top").write_text("top\n")
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret").write_text("secret\n")
    (path / "secret").chmod(0o640)
    return path


def _fingerprint(path: Path) -> dict[bytes, tuple[str, int, bytes]]:
    return describe(path)


async def test_a_directory_swapped_for_a_link_is_never_written_through(
        ws: Path, outside: Path) -> None:
    async with Toolkit("host", base_dir=ws) as tk:
        snap = await tk.snapshot()
        before = _fingerprint(outside)
        await tk.call("bash", {"command": f"rm -rf d && ln -s {outside} d && ln -sf "
                                          f"{outside}/secret top"})
        await tk.restore(snap)
    assert (ws / "d").is_dir() and not (ws / "d").is_symlink()
    assert (ws / "d" / "f").read_text() == "inside\n"
    assert (ws / "top").read_text() == "top\n" and not (ws / "top").is_symlink()
    assert _fingerprint(outside) == before


async def test_links_in_a_snapshot_are_restored_as_links_never_followed(
        ws: Path, outside: Path) -> None:
    (ws / "to-secret").symlink_to(outside / "secret")
    (ws / "to-dir").symlink_to(outside)
    (ws / "dangling").symlink_to("../../nowhere")
    async with Toolkit("host", base_dir=ws) as tk:
        snap = await tk.snapshot()
        expected = describe(ws)
        for name in ("to-secret", "to-dir", "dangling"):
            (ws / name).unlink()
        before = _fingerprint(outside)
        await tk.restore(snap)
    assert describe(ws) == expected
    assert _fingerprint(outside) == before


async def test_a_hard_link_to_an_outside_file_is_never_changed_through(
        ws: Path, outside: Path) -> None:
    os.link(outside / "secret", ws / "hard")
    async with Toolkit("host", base_dir=ws) as tk:
        snap = await tk.snapshot()
        os.chmod(ws / "hard", 0o600)  # the command's own doing: the outside file changes too
        seen = os.stat(outside / "secret")
        await tk.restore(snap)
    after = os.stat(outside / "secret")
    assert (after.st_mode, after.st_mtime_ns, after.st_ino) == (
        seen.st_mode, seen.st_mtime_ns, seen.st_ino)  # the restore wrote a new file instead
    assert (outside / "secret").read_text() == "secret\n"
    assert stat.S_IMODE(os.stat(ws / "hard").st_mode) == 0o640
    assert os.stat(ws / "hard").st_ino != after.st_ino


async def test_devices_fifos_and_set_id_bits_are_never_carried(ws: Path) -> None:
    os.mknod(ws / "null-dev", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mkfifo(ws / "pipe")
    (ws / "suid").write_text("#!/bin/sh\n")
    (ws / "suid").chmod(0o6755)
    async with Toolkit("host", base_dir=ws) as tk:
        snap = await tk.snapshot()
        assert sorted(snap.left_out) == ["null-dev", "pipe"]
        await tk.restore(snap)
        (child,) = await tk.fork(1)
        assert isinstance(child, Toolkit)
        try:
            for root in (ws, Path(child.base_dir)):
                assert stat.S_IMODE(os.stat(root / "suid").st_mode) == 0o755
            assert not (Path(child.base_dir) / "null-dev").exists()
            assert not (Path(child.base_dir) / "pipe").exists()
        finally:
            await child.close()
    assert not (ws / "null-dev").exists() and not (ws / "pipe").exists()  # not in the snapshot


async def test_names_that_are_not_utf8_round_trip(ws: Path) -> None:
    raw = os.fsencode(str(ws)) + b"/caf\xe9"
    os.mkdir(raw)
    with open(raw + b"/\xff\xfe.bin", "wb") as out:
        out.write(b"bytes\n")
    async with Toolkit("host", base_dir=ws) as tk:
        snap = await tk.snapshot()
        expected = describe(ws)
        await tk.call("bash", {"command": "rm -rf caf*"})
        await tk.restore(snap)
    assert describe(ws) == expected
    assert os.path.exists(raw + b"/\xff\xfe.bin")


async def test_a_sparse_10_gb_file_is_refused_and_nothing_is_kept(ws: Path, store: Path) -> None:
    async with Toolkit("host", base_dir=ws) as tk:
        kept = await tk.snapshot()
        await tk.call("bash", {"command": "truncate -s 10G sparse"})
        with pytest.raises(CouldNotRunError, match=r"more than \d+ bytes"):
            await tk.snapshot()
        assert [p.stem for p in (store / "manifests").iterdir()] == [kept.id]
        assert list((store / "tmp").iterdir()) == []
        await tk.restore(kept)  # the session goes on, and the big file goes
    assert not (ws / "sparse").exists()


async def test_a_tampered_object_is_refused_by_its_digest_and_nothing_changes(
        ws: Path, store: Path) -> None:
    async with Toolkit("host", base_dir=ws) as tk:
        snap = await tk.snapshot()
        await tk.call("bash", {"command": "rm -rf d; echo new > top"})
        before = describe(ws)
        for obj in (store / "objects").rglob("*"):
            if obj.is_file():
                obj.chmod(0o600)
                obj.write_bytes(b"planted\n")
        with pytest.raises(SnapshotCorruptError, match="does not match its digest"):
            await tk.restore(snap)
        assert describe(ws) == before


@pytest.mark.parametrize("row", [
    ["../escape", "file", 0o644, STORED, 7, 0],
    ["/abs", "file", 0o644, STORED, 7, 0],
    ["a/../../x", "dir", 0o755, "", 0, 0],
    ["dev", "chr", 0o666, "", 0, 0],
    ["n\0ul", "file", 0o644, STORED, 7, 0],
    ["l/f", "file", 0o644, STORED, 7, 0],  # below a link (``l``, added below)
    ["top", "file", 0o644, STORED, 7, 0],  # a second ``top``
])
async def test_a_manifest_naming_anything_outside_is_refused_whole(
        ws: Path, store: Path, tmp_path: Path, row: list[object]) -> None:
    async with Toolkit("host", base_dir=ws) as tk:
        snap = await tk.snapshot()
        path = store / "manifests" / f"{snap.id}.json"
        data = json.loads(path.read_text())
        data["entries"] += [["l", "link", 0, str(tmp_path), 0, 0], row]
        path.write_text(json.dumps(data))
        (ws / "top").write_text("changed\n")
        before = describe(ws)
        with pytest.raises(SnapshotCorruptError):
            await tk.restore(snap)
        assert describe(ws) == before
    assert not (tmp_path / "escape").exists() and not (tmp_path / "f").exists()


async def test_a_manifest_changed_after_it_was_read_is_checked_again(
        ws: Path, store: Path, tmp_path: Path) -> None:
    """A read manifest is kept in memory for the next restore (``SnapshotStore.load``): one
    changed since, even to the same size and times, is read and refused again."""
    async with Toolkit("host", base_dir=ws) as tk:
        snap = await tk.snapshot()
        (ws / "top").write_text("changed\n")
        await tk.restore(snap)  # read and kept
        path = store / "manifests" / f"{snap.id}.json"
        before, times = path.read_bytes(), path.stat()
        outside = json.dumps(str(tmp_path)).encode()
        tampered = before.replace(b'["top","file"', b'["l","link",0,' + outside + b',0,0],'
                                  b'["l/top","file"', 1)
        assert tampered != before
        path.write_bytes(tampered)
        os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
        (ws / "top").write_text("changed again\n")
        after = describe(ws)
        with pytest.raises(SnapshotCorruptError):
            await tk.restore(snap)
        assert describe(ws) == after
        path.write_bytes(before)
        await tk.restore(snap)  # the stored bytes again: restored as before
        assert (ws / "top").read_text() != "changed again\n"


async def test_another_users_store_is_never_read(ws: Path, store: Path) -> None:
    async with Toolkit("host", base_dir=ws) as tk:
        snap = await tk.snapshot()
        for path in [store, *store.rglob("*")]:
            mode = stat.S_IMODE(path.lstat().st_mode)
            assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
        manifest = store / "manifests" / f"{snap.id}.json"
        os.chown(manifest, NOBODY, NOBODY)  # planted by another user
        with pytest.raises(SnapshotCorruptError, match="not this user's"):
            await tk.restore(snap)
        os.chown(manifest, 0, 0)
        for obj in (store / "objects").rglob("*"):
            if obj.is_file():
                os.chown(obj, NOBODY, NOBODY)
        (ws / "top").unlink()  # so the restore needs an object
        with pytest.raises(SnapshotCorruptError, match="not this user's"):
            await tk.restore(snap)
        os.chown(store, NOBODY, NOBODY)
        with pytest.raises(ConfigurationError, match="this user's alone"):
            await tk.snapshot()
