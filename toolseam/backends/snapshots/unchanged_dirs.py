"""Directories a sandbox's packer said unchanged, put back in their place in the tree read
(``archive.capture_archive``; ``toolseam_agent/pack.py``'s ``dirs``).

The packer sums each directory it packs whole: the names, kinds, modes, inodes, sizes and times
(ctime too, which no command can set back) of its entries that are not directories. When the
sum is the one the host gave — the one this session's previous snapshot or restore read with
that directory's entries — the directory's header is marked unchanged and those entries are not
sent at all: only its sub-directories are walked. Here the entries stored with that sum are put
back exactly where the packer would have sent them (in the order of their names' bytes, between
the sub-directories' trees), so the manifest is the same tree, entry for entry, as a whole pack
gives. A directory said unchanged that this session did not read with that very sum, or from a
snapshot no longer in the store, refuses the whole snapshot: the packer decides nothing the
host did not see itself.
"""

from __future__ import annotations

import os
import tarfile
from collections import deque

from .capture import DirSeen, Known
from .manifest import Entry, SnapshotCorruptError

SUM_HEADER, SAME_HEADER = "TOOLSEAM.sum", "TOOLSEAM.same"
Child = tuple[bytes, str, Entry | None]  # a name's bytes, its path, its entry (None: left out)


def _inside(path: str, top: str) -> bool:
    """``path`` strictly below the directory ``top`` (``""``: the tree's root)."""
    return path != "" if top == "" else path.startswith(top + "/")


class UnchangedDirs:
    """What ``capture_archive`` is to put in, and where, for the directories said unchanged;
    and each directory's entries as now read (``now.dirs``), for the next pack."""

    def __init__(self, known: Known | None, trusted: bool, now: Known) -> None:
        self._known = known
        self._trusted = trusted
        self._now = now
        self._open: list[tuple[str, deque[Child]]] = []  # unchanged dirs still being walked
        self._fresh: set[str] = set()  # dirs whose entries are read now, one by one

    def before(self, path: str) -> list[Child]:
        """The stored entries that come before the member ``path`` in the packer's order."""
        out: list[Child] = []
        while self._open and not _inside(path, self._open[-1][0]):
            out.extend(self._open.pop()[1])  # that directory's walk is over: the rest of it
        for top, kids in self._open:
            first = os.fsencode((path[len(top) + 1:] if top else path).split("/")[0])
            while kids and kids[0][0] < first:
                out.append(kids.popleft())
        return out

    def end(self) -> list[Child]:
        out: list[Child] = []
        while self._open:
            out.extend(self._open.pop()[1])
        return out

    def directory(self, path: str, member: tarfile.TarInfo) -> None:
        """A directory's header: its sum noted; said unchanged, its stored entries opened."""
        summary = member.pax_headers.get(SUM_HEADER)
        if summary is None:
            return
        if member.pax_headers.get(SAME_HEADER) != "1":
            self._now.dirs[path] = DirSeen(summary)
            self._fresh.add(path)
            return
        seen = self._known.dirs.get(path) if self._known is not None else None
        if seen is None or seen.summary != summary or not self._trusted:
            raise SnapshotCorruptError(f"the directory {path!r} is said unchanged, and is not")
        self._now.dirs[path] = seen
        self._open.append((path, deque(seen.children)))

    def child(self, path: str, entry: Entry | None) -> None:
        """A member that is no directory, read now: noted in its directory's entries."""
        parent, _, last = path.rpartition("/")
        if parent in self._fresh:
            self._now.dirs[parent].children.append((os.fsencode(last), path, entry))


def kept_dirs(seen: dict[str, DirSeen], tree: dict[str, Entry]) -> dict[str, DirSeen]:
    """After a restore to ``tree``: the directories read before it whose entries that are not
    directories were the snapshot's, every one (so none was written or removed there) — their
    sums and entries hold still."""
    by_parent: dict[str, int] = {}
    for path, entry in tree.items():
        if entry.kind != "dir":
            parent = path.rpartition("/")[0]
            by_parent[parent] = by_parent.get(parent, 0) + 1
    return {name: dir_seen for name, dir_seen in seen.items()
            if by_parent.get(name, 0) == len(dir_seen.children)
            and all(entry is not None and tree.get(path) == entry
                    for _, path, entry in dir_seen.children)}
