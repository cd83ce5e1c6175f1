"""Restoring a snapshot into a directory on this machine, so that it holds exactly the
snapshot's tree — and writes nothing outside it, whatever the snapshot or the directory holds.

1. The manifest is checked whole (``manifest.checked_tree``): plain relative names whose
   parents are directories of the same snapshot, files, directories and links only.
2. Every file that must be written is copied out of the store into a staging directory in the
   root first, each checked against its digest: a tampered object stops the restore before
   anything changed.
3. Names the snapshot does not have (or has as another kind) are removed; then directories
   are made, links placed and staged files renamed into place, parents first; modes and times
   are set last, deepest first. Every directory on the way is opened ``O_NOFOLLOW`` below its
   parent's descriptor, so a link a command left where a directory was is never passed through.
4. A file whose (inode, size, mtime, ctime) is what this session last stored or restored keeps
   its bytes (cost: what changed). One with a second hard link is always written anew (by
   rename): a chmod of it could change a file outside the root through that link.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from dataclasses import dataclass

from .capture import Known, stat_key, walk
from .manifest import Entry, Manifest, checked_tree
from .store import SnapshotStore

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
STAGING_PREFIX = ".toolseam-restore-"


@dataclass
class Restored:
    written: int  # files written
    removed: int  # names removed
    known: Known


class _Dirs:
    """Open directories below the root by relative name, each opened below its parent."""

    def __init__(self, root_fd: int) -> None:
        self.fds = {"": root_fd}

    def get(self, rel: str) -> int:
        fd = self.fds.get(rel)
        if fd is None:
            parent, _, name = rel.rpartition("/")
            fd = self.fds[rel] = os.open(name, _DIR_FLAGS, dir_fd=self.get(parent))
        return fd

    def forget(self, rel: str) -> None:
        for name in [n for n in self.fds if n == rel or n.startswith(rel + "/")]:
            os.close(self.fds.pop(name))

    def close(self) -> None:
        for name, fd in self.fds.items():
            if name:
                os.close(fd)


def _split(path: str) -> tuple[str, str]:
    """A name's parent and last part (os functions encode a str by surrogateescape: a name
    that is not UTF-8 reaches the filesystem as the bytes it was)."""
    parent, _, name = path.rpartition("/")
    return parent, name


def restore(root: str, manifest: Manifest, store: SnapshotStore, known: Known,
            owner: int | None = None) -> Restored:
    """``root`` made the manifest's tree; what is made there is ``owner``'s (None: ours)."""
    tree = checked_tree(manifest.entries)
    root_fd = os.open(root, _DIR_FLAGS)
    dirs = _Dirs(root_fd)
    stage_name = STAGING_PREFIX + secrets.token_hex(6)
    os.mkdir(stage_name, 0o700, dir_fd=root_fd)
    stage_fd = os.open(stage_name, _DIR_FLAGS, dir_fd=root_fd)
    try:
        current = {w.path: w.st for w in walk(root_fd)}
        kept = {p for p, st in current.items() if p in tree and _same(tree[p], st, dirs, known)}
        to_write = [e for e in tree.values() if e.kind == "file" and e.path not in kept]
        staged = _stage(to_write, store, stage_fd, owner)  # nothing has changed before this is done
        removed = _remove_extra(current, tree, dirs)
        untouched = set()
        for entry in sorted(tree.values(), key=lambda e: (e.path.count("/"), e.path)):
            seen = current.get(entry.path)
            if (entry.kind == "file" and entry.path in kept and seen is not None
                    and (stat.S_IMODE(seen.st_mode), seen.st_mtime_ns)
                    == (entry.mode, entry.mtime_ns)):
                untouched.add(entry.path)  # the walk saw it as the snapshot has it
                continue
            if not _place(entry, entry.path in kept and entry.path not in removed, dirs, staged,
                          stage_fd, owner):
                untouched.add(entry.path)
        for entry in sorted((e for e in tree.values() if e.kind == "dir"),
                            key=lambda e: -e.path.count("/")):
            fd = dirs.get(entry.path)
            os.fchmod(fd, entry.mode)
            os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
        now = Known()
        for entry in tree.values():
            if entry.kind == "file":
                if entry.path in untouched:  # its stat is the one the walk saw
                    st = current[entry.path]
                else:
                    parent, name = _split(entry.path)
                    st = os.stat(name, dir_fd=dirs.get(parent), follow_symlinks=False)
                now.files[entry.path] = (stat_key(st), entry.digest)
        return Restored(len(to_write), len(removed), now)
    finally:
        os.close(stage_fd)
        remove_tree_at(root_fd, stage_name)
        dirs.close()
        os.close(root_fd)


def _same(entry: Entry, st: os.stat_result, dirs: _Dirs, known: Known) -> bool:
    """The name holds what the snapshot has there already (a file: by its stat key)."""
    if entry.kind == "dir":
        return stat.S_ISDIR(st.st_mode)
    if entry.kind == "link":
        if not stat.S_ISLNK(st.st_mode):
            return False
        parent, name = _split(entry.path)
        return os.fsdecode(os.readlink(name, dir_fd=dirs.get(parent))) == entry.digest
    return (stat.S_ISREG(st.st_mode) and st.st_nlink == 1
            and known.digest(entry.path, st) == entry.digest)


def _stage(entries: list[Entry], store: SnapshotStore, stage_fd: int, owner: int | None
           ) -> dict[str, str]:
    staged = {}
    for number, entry in enumerate(entries):
        name = str(number)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=stage_fd)
        try:
            store.copy_out(entry.digest, fd)
            if owner is not None:
                os.fchown(fd, owner, owner)
            os.fchmod(fd, entry.mode)
            os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
        finally:
            os.close(fd)
        staged[entry.path] = name
    return staged


def _remove_extra(current: dict[str, os.stat_result], tree: dict[str, Entry],
                  dirs: _Dirs) -> set[str]:
    removed: set[str] = set()
    for path in sorted(current):
        parent, name = _split(path)
        if any(path.startswith(r + "/") for r in removed if len(r) < len(path)):
            continue
        entry, st = tree.get(path), current[path]
        is_dir = stat.S_ISDIR(st.st_mode)
        unwanted = (entry is None or (entry.kind == "dir") != is_dir
                    or (entry.kind == "link" and not stat.S_ISLNK(st.st_mode)))
        if unwanted:
            parent_fd = dirs.get(parent)
            if is_dir:
                dirs.forget(path)
                remove_tree_at(parent_fd, name)
            else:
                os.unlink(name, dir_fd=parent_fd)
            removed.add(path)
    return removed


def _place(entry: Entry, kept: bool, dirs: _Dirs, staged: dict[str, str],
           stage_fd: int, owner: int | None) -> bool:
    """Put one entry in place; whether anything at its name changed."""
    parent, name = _split(entry.path)
    parent_fd = dirs.get(parent)
    if entry.kind == "dir":
        if not kept:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=parent_fd)
            if owner is not None:
                os.fchown(dirs.get(entry.path), owner, owner)
        os.fchmod(dirs.get(entry.path), 0o700)  # writable while it is filled; its mode last
        return True
    if entry.kind == "link":
        if not kept:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=parent_fd)  # a stale link of another target
            os.symlink(entry.digest, name, dir_fd=parent_fd)
            if owner is not None:
                os.chown(name, owner, owner, dir_fd=parent_fd, follow_symlinks=False)
        return not kept
    if entry.path in staged:
        os.rename(staged[entry.path], name, src_dir_fd=stage_fd, dst_dir_fd=parent_fd)
        return True
    # the same bytes already: its mode and time, through a descriptor of it alone
    fd = os.open(name, _PATH_FLAGS, dir_fd=parent_fd)
    try:
        st = os.fstat(fd)
        changed = False
        if stat.S_IMODE(st.st_mode) != entry.mode:
            os.chmod(f"/proc/self/fd/{fd}", entry.mode)
            changed = True
        if st.st_mtime_ns != entry.mtime_ns:
            os.utime(f"/proc/self/fd/{fd}", ns=(entry.mtime_ns, entry.mtime_ns))
            changed = True
        return changed
    finally:
        os.close(fd)


def remove_tree_at(parent_fd: int, name: str) -> None:
    """Remove ``name`` below ``parent_fd`` and all it holds, never through a link."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        return
    except PermissionError:  # a 0000 directory (not root): opened once it is ours to read
        handle = os.open(name, _PATH_FLAGS | os.O_DIRECTORY, dir_fd=parent_fd)
        try:
            os.chmod(f"/proc/self/fd/{handle}", 0o700)
        finally:
            os.close(handle)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        os.fchmod(fd, 0o700)  # a 0500 directory's entries can be removed too
        with os.scandir(fd) as entries:
            children = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
        for child, is_dir in children:
            if is_dir:
                remove_tree_at(fd, child)
            else:
                os.unlink(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)
