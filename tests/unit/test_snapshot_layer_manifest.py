"""The writable layer's part of a manifest (decision 440): it round-trips, an old manifest
(format 1) is still read, and a layer a hostile command shaped is refused whole — a deleted
name with ``..`` or absolute, an entry below a name that is not a directory of the layer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolseam.backends.snapshots.manifest import (
    Entry,
    Manifest,
    SnapshotCorruptError,
    checked_tree,
)
from toolseam.backends.snapshots.store import SnapshotStore

DIGEST = "ab" * 32


def _manifest() -> Manifest:
    return Manifest("0" * 20, None, 1.0, "podman", "s", 3, [Entry("w", "file", 0o644, DIGEST, 3)],
                    ["/tmp/fifo"], [Entry("tmp", "dir", 0o1777), Entry("tmp/k", "file", 0o4755,
                                                                        DIGEST, 3)],
                    ["etc/issue"])


def test_the_layer_round_trips_without_set_id_bits() -> None:
    back = Manifest.loads(_manifest().dumps())
    assert back.layer == [Entry("tmp", "dir", 0o1777), Entry("tmp/k", "file", 0o755, DIGEST, 3)]
    assert back.layer_deleted == ["etc/issue"] and back.digests() == {DIGEST}


def test_a_format_1_manifest_has_no_layer() -> None:
    data = json.loads(_manifest().dumps())
    data["version"] = 1
    del data["layer"], data["layer_deleted"]
    back = Manifest.loads(json.dumps(data))
    assert back.layer == [] and back.layer_deleted == []


@pytest.mark.parametrize("deleted", ["../etc/passwd", "/etc/passwd", "a/./b", "", 7])
def test_a_hostile_deleted_name_refuses_the_whole_manifest(deleted: object) -> None:
    data = json.loads(_manifest().dumps())
    data["layer_deleted"] = [deleted]
    with pytest.raises(SnapshotCorruptError):
        Manifest.loads(json.dumps(data))


def test_a_layer_entry_below_a_link_is_refused() -> None:
    layer = [Entry("opt", "link", 0, "/workspace"), Entry("opt/x", "file", 0o644, DIGEST, 1)]
    with pytest.raises(SnapshotCorruptError, match="not a directory"):
        checked_tree(layer)


def test_removing_one_snapshot_keeps_the_objects_another_ones_layer_names(
        tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "store")
    kept, _ = store.ingest_from(iter([b"layer bytes", b""]).__next__)
    other, _ = store.ingest_from(iter([b"other bytes", b""]).__next__)
    layer_only = Manifest("1" * 20, None, 1.0, "docker", "s", 0, [], [],
                          [Entry("opt", "dir", 0o755), Entry("opt/f", "file", 0o644, kept, 11)])
    gone = Manifest("2" * 20, None, 2.0, "docker", "s", 0,
                    [Entry("f", "file", 0o644, other, 11)], [])
    store.save(layer_only)
    store.save(gone)
    store.remove([gone.id])
    assert store.has(kept) and not store.has(other)
