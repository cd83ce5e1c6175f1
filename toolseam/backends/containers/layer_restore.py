"""A container's writable layer made a snapshot's (decisions 440-442, 489): the applier's plan,
the image's own files a command deleted or rewrote since, and the snapshot's entries — only
those that differ from what the layer holds now, when the layer could be packed (digests
only) first; everything the diff names otherwise. ``toolseam_agent/layer.py`` applies it.
"""

from __future__ import annotations

import io
import json
import posixpath
import secrets
import tarfile
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

from ..snapshots.archive import ChunkReader
from ..snapshots.capture import Captured, Known
from ..snapshots.manifest import Entry, Manifest, check_name, checked_tree
from ..snapshots.store import SnapshotStore
from ..snapshots.unchanged_dirs import kept_dirs
from .engine.errors import EngineNotFound
from .engine.protocol import ContainerSpec, Engine, Hardening
from .layer import GO_MODE_DIR, WHOLE, LayerNames, below


def image_names_to_fetch(engine: Engine, container: str, now: LayerNames,
                         manifest: Manifest) -> list[str]:
    """The image's own names the restore must bring back: deleted since, or a file rewritten
    since, and not in the snapshot's layer as a file or link (that one is written anyway) nor
    deleted in it."""
    kept = {e.path for e in manifest.layer if e.kind != "dir"}
    wanted: list[str] = []
    for name in now.deleted:
        if not (below(name, manifest.layer_deleted) or name in kept):
            wanted.append(name)
    for name in now.changed:
        if below(name, manifest.layer_deleted) or name in kept:
            continue
        found = engine.path_stat(container, "/" + name)
        if found is not None and not int(found.get("mode", 0)) & GO_MODE_DIR:
            wanted.append(name)  # a file of the image, rewritten since
    tops: list[str] = []
    for name in sorted(wanted):
        if not below(name, tops):
            tops.append(name)
    return tops


def _image_members(engine: Engine, helper: str, name: str, tar: tarfile.TarFile) -> None:
    """``name`` as the image has it, copied into ``tar`` as ``image/NAME…`` (checked names,
    set-id bits dropped, devices left out)."""
    parent = posixpath.dirname(name)
    base = posixpath.basename(name)
    try:
        with engine.get_archive(helper, "/" + name) as chunks, tarfile.open(
                fileobj=ChunkReader(chunks), mode="r|") as source:  # type: ignore[call-overload]
            for member in source:
                inner = member.name.rstrip("/")
                if not (inner == base or inner.startswith(base + "/")):
                    continue
                full = f"{parent}/{inner}" if parent else inner
                check_name(full)
                info = tarfile.TarInfo("image/" + full)
                info.mode, info.mtime = member.mode & 0o1777, member.mtime
                if member.isdir():
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif member.issym():
                    info.type, info.linkname = tarfile.SYMTYPE, member.linkname
                    tar.addfile(info)
                elif member.islnk():
                    target = f"{parent}/{member.linkname}" if parent else member.linkname
                    check_name(target)
                    info.type, info.linkname = tarfile.LNKTYPE, "image/" + target
                    tar.addfile(info)
                elif member.isreg():
                    info.size = member.size
                    tar.addfile(info, source.extractfile(member))
    except EngineNotFound:
        return  # not in the image: nothing to bring back


@dataclass
class LayerRestore:
    """What a restore does to the layer: the applier's plan fields, the snapshot's entries to
    write, and the files kept in place (with their keys, for the next snapshot)."""

    plan: dict[str, Any]
    write: list[Entry]
    kept: Known


def layer_restore(manifest: Manifest, now: LayerNames, current: Captured | None
                  ) -> LayerRestore:
    """The layer made the snapshot's. ``current``: the layer as packed now (digests only), or
    None: everything the diff names goes and the snapshot's whole layer is written. With it,
    only what differs is written: a file or link the same as the snapshot's (content, mode,
    size, time) stays; a directory taken whole (``/tmp``, one a command added) that is one in
    both keeps only the snapshot's names (``keep_only``: whatever else is there at that
    moment goes) instead of being emptied."""
    tree = checked_tree(manifest.layer)
    if current is None:
        return LayerRestore({"added": now.added, "changed": now.changed,
                             "emptied": list(WHOLE), "deleted": manifest.layer_deleted},
                            in_order(tree.values()), Known())
    here = {e.path: e for e in current.entries}
    same = {path for path, e in tree.items() if e.kind != "dir" and here.get(path) == e}

    def both_dirs(name: str) -> bool:
        return (name in tree and tree[name].kind == "dir" and name in here
                and here[name].kind == "dir")
    whole = [top for top in [*now.added, *WHOLE] if both_dirs(top)]
    keep_only: dict[str, list[str]] = {e.path: [] for e in tree.values()
                                       if e.kind == "dir" and below(e.path, whole)}
    for path in tree:
        parent, _, last = path.rpartition("/")
        if parent in keep_only:
            keep_only[parent].append(last)
    plan = {"added": [t for t in now.added if t not in whole and t not in same],
            "changed": [n for n in now.changed if n not in same],
            "emptied": [t for t in WHOLE if t not in whole], "keep_only": keep_only,
            "deleted": manifest.layer_deleted}
    kept = Known({p: current.known.files[p] for p in same if p in current.known.files},
                 dirs=kept_dirs(current.known.dirs, tree))
    return LayerRestore(plan, [e for e in in_order(tree.values()) if e.path not in same],
                        kept)


def in_order(entries: Iterable[Entry]) -> list[Entry]:
    return sorted(entries, key=lambda e: (e.path.count("/"), e.path))


def apply_archive(plan: dict[str, Any], store: SnapshotStore, write: list[Entry],
                  out: IO[bytes], from_image: ImageSource | None = None) -> int:
    """The tar ``toolseam_agent/layer.py`` applies: ``plan``, the image's members, ``write``
    (each object checked as it is copied out, before the sandbox is touched). Files written."""
    data = json.dumps(plan).encode("utf-8", "surrogateescape")
    written = 0
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("plan.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        if from_image is not None and from_image.names:
            from_image.copy_into(tar)
        for entry in write:
            written += layer_member(entry, store, tar)
    return written


@dataclass
class ImageSource:
    """The image's own names a restore brings back, read from a never-started container of
    the sandbox's image (decision 442)."""

    engine: Engine
    image: str
    hardening: Hardening
    labels: dict[str, str]
    names: list[str]

    def copy_into(self, tar: tarfile.TarFile) -> None:
        helper = self.engine.create(ContainerSpec(
            image=self.image, name=f"toolseam-layer-{secrets.token_hex(6)}",
            command=["/opt/toolseam/never-started"], labels=self.labels, environment={},
            binds=[], hardening=self.hardening))
        try:
            for name in self.names:
                _image_members(self.engine, helper, name, tar)
        finally:
            self.engine.remove(helper)


def layer_member(entry: Entry, store: SnapshotStore, tar: tarfile.TarFile,
                 prefix: str = "layer/") -> int:
    info = tarfile.TarInfo(prefix + entry.path)
    info.mtime, info.mode = entry.mtime_ns / 1_000_000_000, entry.mode
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        return 0
    if entry.kind == "link":
        info.type, info.linkname = tarfile.SYMTYPE, entry.digest
        tar.addfile(info)
        return 0
    with tempfile.TemporaryFile(prefix="toolseam-restore-") as data:
        store.copy_out(entry.digest, data.fileno())  # checked as it is copied
        info.size = data.tell()
        data.seek(0)
        tar.addfile(info, data)
    return 1
