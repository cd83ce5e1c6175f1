"""A copy-mode ``/workspace`` made a snapshot's at the cost of what changed (decision 468).

The sandbox's root packs the workspace as for a snapshot (``toolseam_agent/pack.py``: files
whose stat key the session last saw without their bytes), read here into digests only
(``DigestOnly``: nothing is stored). Against the snapshot's manifest that says which files
differ; one tar in ``toolseam_agent/layer.py``'s apply form then carries a plan — each of the
snapshot's directories keeps only the snapshot's names (whatever else is there, fifos and
sockets too, goes, links removed as links) — every directory and link of the snapshot, and only
the files whose content, mode, size or time differ, each object checked against its digest as it
is copied out of the store, before the sandbox is touched. The applier opens every directory
``O_NOFOLLOW`` below its parent, so no name passes through a link a command planted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from ..snapshots.capture import Captured, Known
from ..snapshots.manifest import Entry, Manifest, checked_tree
from ..snapshots.store import SnapshotStore
from ..snapshots.unchanged_dirs import kept_dirs

_TOP = "workspace"  # names below "/" as the applier takes them


class DigestOnly(SnapshotStore):
    """The store, except that what it is given is hashed and never kept."""

    def ingest_from(self, read: Callable[[], bytes]) -> tuple[str, int]:
        digest = hashlib.sha256()
        while chunk := read():
            digest.update(chunk)
        return digest.hexdigest(), 0


@dataclass
class WorkspaceRestore:
    """What a restore does to ``/workspace`` (under ``workspace/`` in the applier's names):
    each of the snapshot's directories keeping only its names, the entries to write, names
    removed, and what is known after."""

    keep_only: dict[str, list[str]]
    write: list[Entry]
    removed: int
    kept: Known


def workspace_restore(manifest: Manifest, now: Captured) -> WorkspaceRestore:
    """The snapshot's tree over the workspace ``now`` holds: every directory (its mode comes
    back), and only the files and links that differ; the files kept in place keep their keys
    and the directories none of whose entries changed their sums (with the snapshot's
    digests)."""
    tree = checked_tree(manifest.entries)
    current = {e.path: e for e in now.entries}
    children: dict[str, list[str]] = {_TOP: []}
    for entry in tree.values():
        parent, _, last = entry.path.rpartition("/")
        children.setdefault(f"{_TOP}/{parent}" if parent else _TOP, []).append(last)
        if entry.kind == "dir":
            children.setdefault(f"{_TOP}/{entry.path}", [])
    removed = sum(1 for path in [*current, *now.left_out] if path not in tree)
    kept = Known(dirs=kept_dirs(now.known.dirs, tree))
    write: list[Entry] = []
    for entry in sorted(tree.values(), key=lambda e: (e.path.count("/"), e.path)):
        if entry.kind != "dir" and current.get(entry.path) == entry:
            seen = now.known.files.get(entry.path)
            if seen is not None:
                kept.files[entry.path] = seen
            continue  # the same bytes (or target), mode and time are there
        write.append(_under_top(entry))
    return WorkspaceRestore(children, write, removed, kept)


def _under_top(entry: Entry) -> Entry:
    return Entry(f"{_TOP}/{entry.path}", entry.kind, entry.mode, entry.digest, entry.size,
                 entry.mtime_ns)
