"""What a snapshot holds: one ``Entry`` per name below the session's root, and the checks that
keep a manifest — data a hostile command chose — from naming anything outside that root.

A name is kept as the text ``os.fsdecode`` makes of its bytes (``surrogateescape``: a name that
is not UTF-8 round-trips), relative, ``/``-separated, never empty, ``.`` or ``..``, never with
a NUL, each part at most 255 bytes. Kinds are files, directories and symlinks only: fifos,
sockets and device nodes are left out when the snapshot is taken and refused in a manifest.
Modes are permission bits and the sticky bit: setuid and setgid are never kept (a restore
must not hand a command an set-id file it did not make itself).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from ...seam.errors import CouldNotRunError

Kind = Literal["file", "dir", "link"]
KEPT_MODE_BITS = 0o1777  # never setuid/setgid
NAME_MAX_BYTES = 255
FORMAT_VERSION = 2  # 2: the container's writable layer (``layer``, ``layer_deleted``)
READABLE_VERSIONS = (1, 2)
# Names toolseam itself makes inside a root while it works there: never part of a snapshot.
WORKING_PREFIXES = (".toolseam-restore-", ".toolseam-sync-", ".toolseam-layer-")
SHA256 = re.compile(r"[0-9a-f]{64}")  # an object's name in the store, a file's digest here
# a part this many characters long or shorter is within NAME_MAX_BYTES however it encodes
# (at most 4 bytes a character): the encode is skipped for it, on a restore's path
_SHORT_PART = NAME_MAX_BYTES // 4


class SnapshotCorruptError(CouldNotRunError):
    """A stored snapshot is not what was stored: an object whose bytes do not match its
    digest, or a manifest that names something it may not. Nothing was changed."""

    def __init__(self, what: str) -> None:
        super().__init__(f"snapshot store: {what}; nothing was restored", retryable=False)


@dataclass(frozen=True)
class Entry:
    path: str  # relative, "/"-separated, os.fsdecode'd
    kind: Kind
    mode: int = 0  # permission + sticky bits (0 for a link)
    digest: str = ""  # a file's sha256; a link's target
    size: int = 0
    mtime_ns: int = 0

    def row(self) -> list[Any]:
        return [self.path, self.kind, self.mode, self.digest, self.size, self.mtime_ns]


def check_name(path: str) -> None:
    """Raise SnapshotCorruptError unless ``path`` is a plain relative name (see the module)."""
    if not path or "\0" in path or path.startswith("/"):
        raise SnapshotCorruptError(f"the name {path!r} is not a relative name")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise SnapshotCorruptError(f"the name {path!r} has a {part!r} part")
        if len(part) > _SHORT_PART and len(os.fsencode(part)) > NAME_MAX_BYTES:
            raise SnapshotCorruptError(f"the name {path!r} has a part longer than 255 bytes")


def entry_from_row(row: Any) -> Entry:
    """One manifest row, checked: a bad row is a ``SnapshotCorruptError``."""
    if not isinstance(row, list) or len(row) != 6:
        raise SnapshotCorruptError(f"a manifest row is malformed: {row!r:.80}")
    path, kind, mode, digest, size, mtime_ns = row
    if not (isinstance(path, str) and isinstance(digest, str) and isinstance(mode, int)
            and isinstance(size, int) and isinstance(mtime_ns, int)):
        raise SnapshotCorruptError(f"a manifest row has wrong types: {row!r:.80}")
    check_name(path)
    if kind not in ("file", "dir", "link"):
        raise SnapshotCorruptError(f"{path!r} is a {kind!r}: only files, directories and "
                                   "symlinks are kept")
    if kind == "file" and not SHA256.fullmatch(digest):
        raise SnapshotCorruptError(f"{path!r} has no sha256 digest")
    if kind == "link" and (not digest or "\0" in digest):
        raise SnapshotCorruptError(f"the link {path!r} has no target")
    if size < 0:
        raise SnapshotCorruptError(f"{path!r} has a negative size")
    return Entry(path, kind, mode & KEPT_MODE_BITS if kind != "link" else 0, digest, size,
                 mtime_ns)


def checked_tree(entries: list[Entry]) -> dict[str, Entry]:
    """The entries by name; every name's parent is a directory of the same manifest (so no
    name can pass through a link), and no name is there twice."""
    tree: dict[str, Entry] = {}
    for entry in entries:
        if entry.path in tree:
            raise SnapshotCorruptError(f"{entry.path!r} is named twice")
        tree[entry.path] = entry
    for entry in entries:
        parent = entry.path.rpartition("/")[0]
        if parent and (parent not in tree or tree[parent].kind != "dir"):
            raise SnapshotCorruptError(f"{entry.path!r} is below {parent!r}, which is not a "
                                       "directory of the snapshot")
    return tree


@dataclass
class Manifest:
    """A snapshot's record: its public facts and its entries."""

    id: str
    label: str | None
    created: float  # seconds since the epoch
    backend: str
    session: str
    size_bytes: int  # what this snapshot added to the store
    entries: list[Entry]
    left_out: list[str]  # names not kept (fifos, sockets, devices), for the caller to see
    # A container's writable layer outside /workspace (decision 440): names relative to the
    # container's "/", and the image's names a command had deleted (``containers/layer.py``).
    layer: list[Entry] = field(default_factory=list)
    layer_deleted: list[str] = field(default_factory=list)

    def digests(self) -> set[str]:
        """Every object this snapshot names (workspace and layer)."""
        return {e.digest for e in (*self.entries, *self.layer) if e.kind == "file"}

    def dumps(self) -> str:
        # json's default ensure_ascii writes a name's lone surrogates as \udcXX: they round-trip
        return json.dumps({"version": FORMAT_VERSION, "id": self.id, "label": self.label,
                           "created": self.created, "backend": self.backend,
                           "session": self.session, "size_bytes": self.size_bytes,
                           "left_out": self.left_out,
                           "entries": [e.row() for e in self.entries],
                           "layer": [e.row() for e in self.layer],
                           "layer_deleted": self.layer_deleted}, separators=(",", ":"))

    @classmethod
    def loads(cls, text: str) -> Manifest:
        try:
            data = json.loads(text)
            if data.get("version") not in READABLE_VERSIONS:
                raise SnapshotCorruptError(f"manifest format {data.get('version')!r} is unknown")
            entries = [entry_from_row(row) for row in data["entries"]]
            layer = [entry_from_row(row) for row in data.get("layer", [])]
            deleted = data.get("layer_deleted", [])
            if not isinstance(deleted, list):
                raise SnapshotCorruptError("a manifest's layer_deleted is not a list")
            for name in deleted:
                if not isinstance(name, str):
                    raise SnapshotCorruptError(f"a deleted name is not text: {name!r:.80}")
                check_name(name)
            return cls(str(data["id"]), data["label"], float(data["created"]),
                       str(data["backend"]), str(data["session"]), int(data["size_bytes"]),
                       entries, [str(n) for n in data.get("left_out", [])], layer, deleted)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SnapshotCorruptError(f"a manifest is malformed ({exc})") from None
