"""Taking a snapshot of a directory on this machine: a walk that never follows a link (every
directory opened ``O_NOFOLLOW`` below its parent's descriptor), each file's bytes into the
store — unless the same file was stored by this session's previous snapshot: a file whose
(inode, size, mtime, ctime) is what it was then keeps its digest, so a snapshot costs what
changed. ctime is in the key because a command can set mtime back; it cannot set ctime.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ...seam.errors import CouldNotRunError
from .manifest import KEPT_MODE_BITS, WORKING_PREFIXES, Entry
from .store import SnapshotStore

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
StatKey = tuple[int, int, int, int]


def stat_key(st: os.stat_result) -> StatKey:
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


@dataclass
class DirSeen:
    """A directory's entries that are not directories, as a sandbox's packer last summed them
    (``toolseam_agent/pack.py`` ``TOOLSEAM.sum``): the summary, and each entry in the order of
    its name's bytes — ``None`` for one left out (a fifo, a device)."""

    summary: str
    children: list[tuple[bytes, str, Entry | None]] = field(default_factory=list)


@dataclass
class Known:
    """What this session last knew of its root: a file's stat key → its digest, by name, and
    the snapshot they came from (while its manifest is in the store, so are its objects); for
    a tree read from a sandbox's packer, what each directory held (``dirs``)."""

    files: dict[str, tuple[StatKey, str]] = field(default_factory=dict)
    source: str | None = None
    dirs: dict[str, DirSeen] = field(default_factory=dict)

    def digest(self, path: str, st: os.stat_result) -> str | None:
        seen = self.files.get(path)
        return seen[1] if seen is not None and seen[0] == stat_key(st) else None


@dataclass
class Walked:
    path: str
    name: str  # below parent_fd
    parent_fd: int
    st: os.stat_result


class TreeChangedError(CouldNotRunError):
    """A name changed kind or identity between the walk's ``lstat`` and its open (a command
    swapped it meanwhile): nothing read after the swap came from outside the tree."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path!r} changed while the directory was read (a command swapped "
                         "it meanwhile); nothing was kept — try again", retryable=True)


def _working(name: str) -> bool:
    return name.startswith(WORKING_PREFIXES)


def walk(root_fd: int, skip: Callable[[str], bool] = _working,
         strict: bool = False) -> Iterator[Walked]:
    """Every name below ``root_fd``, parents before children, in name order; a directory's
    descriptor is open while its entries are yielded. Names ``skip`` says (toolseam's working
    names by default) are left out, at any depth.

    Never by path: each directory is opened ``O_NOFOLLOW`` below its parent's descriptor when
    its turn comes (one descriptor per level, so a directory with more sub-directories than
    this process may open files is walked whole), and only if the opened descriptor is the
    directory the walk yielded (``st_dev``, ``st_ino``): a directory swapped for a link or for
    another directory since is not walked — skipped, or ``TreeChangedError`` when ``strict``
    (a reader that already wrote the name's header must not leave it looking emptied)."""
    frames: list[tuple[int, list[Walked]]] = []  # an open directory, its sub-dirs still to enter
    fd = os.dup(root_fd)
    rel = ""
    try:
        while True:
            if fd >= 0:
                pending: list[Walked] = []
                frames.append((fd, pending))
                with os.scandir(fd) as entries:
                    names = sorted(e.name for e in entries)
                for name in names:
                    if skip(name):
                        continue
                    try:
                        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # gone meanwhile
                    item = Walked(f"{rel}/{name}" if rel else name, name, fd, st)
                    yield item
                    if stat.S_ISDIR(st.st_mode):
                        pending.append(item)
                pending.reverse()
            fd = -1
            while frames and fd < 0:
                parent, pending = frames[-1]
                if not pending:
                    os.close(parent)
                    frames.pop()
                    continue
                item = pending.pop()
                fd, rel = _enter(item, strict), item.path
            if fd < 0:
                return  # every directory walked
    finally:
        for parent, _ in frames:
            os.close(parent)


def _enter(item: Walked, strict: bool) -> int:
    """The directory ``item`` names, opened below its parent — if it is still the one walked.
    One removed since is not walked even when ``strict``: what it held is gone either way."""
    try:
        fd = os.open(item.name, _DIR_FLAGS, dir_fd=item.parent_fd)
    except FileNotFoundError:
        return -1
    except OSError:
        fd = -1  # replaced by a link or a file since: not below us now
    if fd >= 0:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) == (item.st.st_dev, item.st.st_ino):
            return fd
        os.close(fd)
    if strict:
        raise TreeChangedError(item.path)
    return -1


@dataclass
class Captured:
    entries: list[Entry]
    added_bytes: int
    left_out: list[str]
    known: Known


def capture(root: str, store: SnapshotStore, known: Known, limit: int) -> Captured:
    """The tree below ``root`` into ``store``. ``limit``: the most file bytes a snapshot may
    hold (a sparse 10 GB file a command made must not fill this machine's disk) — past it,
    a ``SnapshotLimitError`` and nothing of this snapshot is named by any manifest."""
    entries: list[Entry] = []
    left_out: list[str] = []
    now = Known()
    added = total = 0
    # the source snapshot's manifest still there: every object it names is (store.py's lock)
    trusted = known.source is not None and store.has_snapshot(known.source)
    root_fd = os.open(root, _DIR_FLAGS)
    try:
        for item in walk(root_fd):
            st = item.st
            mode = stat.S_IMODE(st.st_mode) & KEPT_MODE_BITS
            if stat.S_ISDIR(st.st_mode):
                entries.append(Entry(item.path, "dir", mode, "", 0, st.st_mtime_ns))
            elif stat.S_ISLNK(st.st_mode):
                target = os.fsdecode(os.readlink(item.name, dir_fd=item.parent_fd))
                # size and time: the copy-back rule's stamp of a link (keep())
                entries.append(Entry(item.path, "link", 0, target, st.st_size, st.st_mtime_ns))
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
                if total > limit:
                    raise SnapshotLimitError(item.path, limit)
                digest = known.digest(item.path, st)
                if digest is None or not (trusted or store.has(digest)):
                    digest, grew, st = _store_file(item, store)
                    added += grew
                now.files[item.path] = (stat_key(st), digest)
                entries.append(Entry(item.path, "file", mode, digest, st.st_size,
                                     st.st_mtime_ns))
            else:
                left_out.append(item.path)
    finally:
        os.close(root_fd)
    return Captured(entries, added, left_out, now)


def _store_file(item: Walked, store: SnapshotStore) -> tuple[str, int, os.stat_result]:
    fd = os.open(item.name, _FILE_FLAGS, dir_fd=item.parent_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped for a fifo or device since the stat
            raise SnapshotRaceError(item.path)
        digest, grew = store.ingest(fd)
        return digest, grew, st
    finally:
        os.close(fd)


class SnapshotLimitError(CouldNotRunError):
    def __init__(self, path: str, limit: int) -> None:
        super().__init__(f"the snapshot would hold more than {limit} bytes of files (at "
                         f"{path!r}); nothing was kept — remove it, or raise the limit "
                         "(Toolkit.snapshot(limit=...))", retryable=False)


class SnapshotRaceError(CouldNotRunError):
    def __init__(self, path: str) -> None:
        super().__init__(f"{path!r} changed kind while the snapshot was taken; nothing was "
                         "kept", retryable=True)
