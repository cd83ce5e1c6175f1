"""A container's writable layer outside ``/workspace`` in a snapshot (decision 440, issue 48).

* **Names**: the engine's diff (``Engine.changes``: docker's and podman's "changes" API) says
  what the layer added, changed and deleted; mounts are never in it, and these names are left
  out whatever it says (``EXCLUDED``): ``/workspace`` (the snapshot's other part), ``/proc``,
  ``/sys``, ``/dev``, ``/run``, the agent's ``/opt/toolseam``, the engine's ``/etc/hosts``,
  ``/etc/hostname``, ``/etc/resolv.conf``, ``/.dockerenv``, ``/.containerenv``, and every
  mount point the engine lists. ``/tmp`` is a tmpfs (no diff sees it) private to the
  sandbox: it is taken whole. A read-only root (the default hardening) changes nothing but
  ``/tmp``, so its diff is not asked for.
* **Bytes**: the sandbox's root packs them (``toolseam_agent/layer.py``) into a tar in
  ``/workspace``, which the host reads as a bind mount or through the archive API — docker's
  archive API does not see a tmpfs — and checks as any archive (``snapshots/archive.py``:
  names, the size limit before the bytes, set-id bits dropped, devices left out).
* **Restore**: one tar in ``/workspace`` — a plan (names added or changed since to remove,
  ``/tmp`` to empty, the snapshot's deleted names), the image's own files a command deleted
  or rewrote since (read from a never-started container of the same image), the snapshot's
  layer (every object checked against its digest first) — applied by the sandbox's root.
"""

from __future__ import annotations

import contextlib
import io
import json
import posixpath
import secrets
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO

from ..snapshots.archive import ChunkReader
from ..snapshots.capture import Known
from ..snapshots.manifest import Entry, Manifest, check_name, checked_tree
from ..snapshots.store import SnapshotStore
from .engine.errors import EngineNotFound
from .engine.protocol import ContainerSpec, Engine, Hardening

EXCLUDED = ("workspace", "tmp", "proc", "sys", "dev", "run", "opt/toolseam", "etc/hosts",
            "etc/hostname", "etc/resolv.conf", ".dockerenv", ".containerenv")
WHOLE = ("tmp",)  # taken whole, emptied on restore
PREFIX = ".toolseam-layer-"  # snapshots/manifest.py WORKING_PREFIXES: never in a snapshot
_GO_MODE_DIR = 1 << 31  # os.ModeDir in the archive API's path stat


@dataclass
class LayerNames:
    """What the engine's diff says of the layer now, each name relative to ``/``."""

    added: list[str]  # top-most only: what is below an added directory is added too
    changed: list[str]
    deleted: list[str]


def _below(name: str, tops: Iterable[str]) -> bool:
    return any(name == top or name.startswith(top + "/") for top in tops)


def layer_names(engine: Engine, container: str, read_only_root: bool) -> LayerNames:
    if read_only_root:
        return LayerNames([], [], [])
    skip = [*EXCLUDED, *(p.strip("/") for p in engine.mount_points(container))]
    kinds: dict[str, int] = {}
    for path, kind in engine.changes(container):
        name = posixpath.normpath(path).lstrip("/")
        if not name or name == "." or _below(name, skip):
            continue
        check_name(name)  # the engine's own answer; still never a ".." or a NUL
        kinds[name] = kind
    added = sorted(n for n, k in kinds.items() if k == 1)
    tops: list[str] = []
    for name in added:  # sorted: a directory before what is below it
        if not _below(name, tops):
            tops.append(name)
    return LayerNames(tops, sorted(n for n, k in kinds.items() if k == 0),
                      sorted(n for n, k in kinds.items() if k == 2))


def pack_plan(names: LayerNames, limit: int, known: Known | None) -> bytes:
    """What the sandbox's root packs; ``known``: the stat keys of the files the previous
    snapshot stored (unchanged ones are sent as such, without their bytes)."""
    keys = {name: list(key) for name, (key, _) in known.files.items()} if known else {}
    return json.dumps({"changed": names.changed, "whole": [*names.added, *WHOLE],
                       "limit": limit, "known": keys}).encode("utf-8", "surrogateescape")


def workspace_plan(limit: int, known: Known | None, seconds: str) -> bytes:
    """What the sandbox's root packs of a copy-mode ``/workspace`` (decision 467): all of it,
    files whose key is in ``known`` without their bytes, times made whole seconds as the
    engine's archive API makes them (``seconds``: "truncate" or "round")."""
    keys = {name: list(key) for name, (key, _) in known.files.items()} if known else {}
    return json.dumps({"base": "workspace", "prefix": "workspace", "changed": [],
                       "whole": [""], "limit": limit, "known": keys, "seconds": seconds}
                      ).encode("utf-8", "surrogateescape")


def token_name() -> str:
    return PREFIX + secrets.token_hex(8)


def one_file_archive(name: str, data: bytes) -> IO[bytes]:
    """A tar holding one 0600 file ``name`` (for the archive API)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o600
        tar.addfile(info, io.BytesIO(data))
    out.seek(0)
    return out


@contextlib.contextmanager
def inner_file(chunks: Iterable[bytes], name: str) -> Iterator[IO[bytes]]:
    """The one regular file ``name`` of an engine's archive stream (anything else refused)."""
    with tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as tar:  # type: ignore[call-overload]
        member = next(iter(tar), None)
        if member is None or member.name != name or not member.isreg():
            raise OSError(f"the sandbox's {name} is not the file the layer was packed into")
        data = tar.extractfile(member)
        assert data is not None
        yield data


def image_names_to_fetch(engine: Engine, container: str, now: LayerNames,
                         manifest: Manifest) -> list[str]:
    """The image's own names the restore must bring back: deleted since, or a file rewritten
    since, and not in the snapshot's layer as a file or link (that one is written anyway) nor
    deleted in it."""
    kept = {e.path for e in manifest.layer if e.kind != "dir"}
    wanted: list[str] = []
    for name in now.deleted:
        if not (_below(name, manifest.layer_deleted) or name in kept):
            wanted.append(name)
    for name in now.changed:
        if _below(name, manifest.layer_deleted) or name in kept:
            continue
        found = engine.path_stat(container, "/" + name)
        if found is not None and not int(found.get("mode", 0)) & _GO_MODE_DIR:
            wanted.append(name)  # a file of the image, rewritten since
    tops: list[str] = []
    for name in sorted(wanted):
        if not _below(name, tops):
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


def apply_archive(manifest: Manifest, store: SnapshotStore, now: LayerNames,
                  engine: Engine, image: str, hardening: Hardening, labels: dict[str, str],
                  from_image: list[str], out: IO[bytes]) -> int:
    """The tar ``toolseam_agent/layer.py`` applies: plan, image members, the snapshot's layer
    (each object checked as it is copied out, before the sandbox is touched). Files written."""
    tree = checked_tree(manifest.layer)
    plan = json.dumps({"added": now.added, "changed": now.changed, "emptied": list(WHOLE),
                       "deleted": manifest.layer_deleted}).encode("utf-8", "surrogateescape")
    written = 0
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("plan.json")
        info.size = len(plan)
        tar.addfile(info, io.BytesIO(plan))
        if from_image:
            helper = engine.create(ContainerSpec(
                image=image, name=f"toolseam-layer-{secrets.token_hex(6)}",
                command=["/opt/toolseam/never-started"], labels=labels, environment={},
                binds=[], hardening=hardening))
            try:
                for name in from_image:
                    _image_members(engine, helper, name, tar)
            finally:
                engine.remove(helper)
        for entry in sorted(tree.values(), key=lambda e: (e.path.count("/"), e.path)):
            written += layer_member(entry, store, tar)
    return written


def layer_member(entry: Entry, store: SnapshotStore, tar: tarfile.TarFile) -> int:
    info = tarfile.TarInfo("layer/" + entry.path)
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
