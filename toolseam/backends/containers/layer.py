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
* **Restore** (``layer_restore.py``): one tar in ``/workspace`` — a plan (names added or
  changed since to remove, the snapshot's deleted names), the image's own files a command
  deleted or rewrote since (read from a never-started container of the same image), the
  snapshot's entries that differ from what the layer holds now (every object checked against
  its digest first) — applied by the sandbox's root.
"""

from __future__ import annotations

import contextlib
import io
import json
import posixpath
import secrets
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO

from ..snapshots.archive import ChunkReader
from ..snapshots.capture import Known
from ..snapshots.manifest import check_name
from .engine.protocol import Engine

EXCLUDED = ("workspace", "tmp", "proc", "sys", "dev", "run", "opt/toolseam", "etc/hosts",
            "etc/hostname", "etc/resolv.conf", ".dockerenv", ".containerenv")
WHOLE = ("tmp",)  # taken whole, emptied on restore
PREFIX = ".toolseam-layer-"  # snapshots/manifest.py WORKING_PREFIXES: never in a snapshot
GO_MODE_DIR = 1 << 31  # os.ModeDir in the archive API's path stat


@dataclass
class LayerNames:
    """What the engine's diff says of the layer now, each name relative to ``/``."""

    added: list[str]  # top-most only: what is below an added directory is added too
    changed: list[str]
    deleted: list[str]


def below(name: str, tops: Iterable[str]) -> bool:
    return any(name == top or name.startswith(top + "/") for top in tops)


def layer_names(engine: Engine, container: str, read_only_root: bool) -> LayerNames:
    if read_only_root:
        return LayerNames([], [], [])
    skip = [*EXCLUDED, *(p.strip("/") for p in engine.mount_points(container))]
    kinds: dict[str, int] = {}
    for path, kind in engine.changes(container):
        name = posixpath.normpath(path).lstrip("/")
        if not name or name == "." or below(name, skip):
            continue
        check_name(name)  # the engine's own answer; still never a ".." or a NUL
        kinds[name] = kind
    added = sorted(n for n, k in kinds.items() if k == 1)
    tops: list[str] = []
    for name in added:  # sorted: a directory before what is below it
        if not below(name, tops):
            tops.append(name)
    return LayerNames(tops, sorted(n for n, k in kinds.items() if k == 0),
                      sorted(n for n, k in kinds.items() if k == 2))


def pack_plan(names: LayerNames, limit: int, known: Known | None) -> bytes:
    """What the sandbox's root packs; ``known``: the stat keys of the files the previous
    snapshot stored (unchanged ones are sent as such, without their bytes)."""
    return json.dumps({"changed": names.changed, "whole": [*names.added, *WHOLE],
                       "limit": limit, **_known_fields(known)}).encode("utf-8",
                                                                      "surrogateescape")


def workspace_plan(limit: int, known: Known | None, seconds: str) -> bytes:
    """What the sandbox's root packs of a copy-mode ``/workspace`` (decision 467): all of it,
    files whose key is in ``known`` without their bytes, times made whole seconds as the
    engine's archive API makes them (``seconds``: "truncate" or "round")."""
    return json.dumps({"base": "workspace", "prefix": "workspace", "changed": [],
                       "whole": [""], "limit": limit, "seconds": seconds,
                       **_known_fields(known)}).encode("utf-8", "surrogateescape")


def _known_fields(known: Known | None) -> dict[str, object]:
    """The stat key of each file the host stored, and the sum of each directory it read
    (``snapshots/unchanged_dirs.py``): an unchanged directory is one header."""
    if known is None:
        return {"known": {}, "dirs": {}}
    return {"known": {name: list(key) for name, (key, _) in known.files.items()},
            "dirs": {name: seen.summary for name, seen in known.dirs.items()}}


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
