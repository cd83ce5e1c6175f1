"""Snapshots of a backend whose files are on this machine (the host backend): the
``Branching`` capability (``seam/capabilities.py``) over ``capture`` and ``apply``, and the
private workspaces a branch works in."""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .apply import Restored, remove_tree_at, restore
from .capture import Captured, Known, capture
from .manifest import Manifest
from .snapshot import Snapshot
from .store import SnapshotStore

DEFAULT_LIMIT = 4 << 30  # file bytes one snapshot may hold
# A container's writable layer (containers/layer.py): given the store and the file bytes the
# snapshot may still hold, what it stored and the image's names a command deleted.
LayerTake = Callable[[SnapshotStore, int], tuple[Captured, list[str]]]


class LocalSnapshots:
    """A mixin for a backend whose ``root`` is a directory here. What it last stored or
    restored there is remembered (``Known``), so the next snapshot or restore costs what
    changed."""

    name: str
    _known_tree: tuple[str, Known] | None = None

    def _known(self, root: str) -> Known:
        found = self._known_tree
        return found[1] if found is not None and found[0] == root else Known()

    async def snapshot_files(self, root: str, label: str | None, session: str,
                             limit: int = DEFAULT_LIMIT) -> Snapshot:
        return await asyncio.to_thread(self._take, root, label, session, limit)

    def _take(self, root: str, label: str | None, session: str, limit: int,
              layer: LayerTake | None = None) -> Snapshot:
        found: list[Captured] = []

        def take(store: SnapshotStore) -> Captured:
            found.append(capture(root, store, self._known(root), limit))
            return found[0]
        manifest = keep_manifest(take, label, self.name, session, layer, limit)
        found[0].known.source = manifest.id
        self._known_tree = (root, found[0].known)
        return Snapshot.of(manifest)

    async def restore_files(self, root: str, snapshot_id: str) -> Restored:
        return await asyncio.to_thread(self._restore, root, snapshot_id)

    def _restore(self, root: str, snapshot_id: str, owner: int | None = None,
                 manifest: Manifest | None = None) -> Restored:
        """``owner``: the uid what the restore makes is given to (root restoring for a
        rootless engine's sandbox); None: this process's. ``manifest``: the snapshot's, read
        already (``fork_manifest``)."""
        store = SnapshotStore()
        with store.lock(exclusive=False):  # its objects stay while they are copied out
            if manifest is None or manifest.id != snapshot_id:
                manifest = store.load(snapshot_id)
            done = restore(root, manifest, store, self._known(root), owner)
        done.known.source = snapshot_id
        self._known_tree = (root, done.known)
        return done

    _fork_read: Manifest | None = None  # the snapshot its last fork's children start from

    def fork_manifest(self, snapshot_id: str) -> Manifest:
        """A fork's snapshot, read once for all its children (``branch_backend`` runs once
        per child, in threads): each of 8 children reading 5 000 entries took 30 ms of the
        interpreter, which the parent's calls waited for. ``SnapshotStore.load`` keeps a
        checked manifest too, but still reads and hashes its file per call: with it alone a
        host's next ``fork(8)`` took 0.68 s against 0.48-0.55 s (decision 518)."""
        with _FORK_READ_LOCK:
            if self._fork_read is None or self._fork_read.id != snapshot_id:
                self._fork_read = SnapshotStore().load(snapshot_id)
            return self._fork_read


_FORK_READ_LOCK = threading.Lock()


def keep_manifest(take: Callable[[SnapshotStore], Captured], label: str | None, backend: str,
                  session: str, layer: LayerTake | None = None,
                  limit: int = DEFAULT_LIMIT) -> Manifest:
    """A new snapshot of what ``take`` stores (and ``layer``, within what is left of
    ``limit``), its manifest saved — or, when either fails, nothing of it left in the store."""
    store = SnapshotStore()
    try:
        with store.lock(exclusive=False):
            taken = take(store)
            manifest = Manifest(secrets.token_hex(10), label, time.time(), backend, session,
                                taken.added_bytes, taken.entries, taken.left_out)
            if layer is not None:
                held = sum(e.size for e in taken.entries if e.kind == "file")
                outside, manifest.layer_deleted = layer(store, limit - held)
                manifest.layer = outside.entries
                manifest.size_bytes += outside.added_bytes
                manifest.left_out += ["/" + name for name in outside.left_out]
            store.save(manifest)
    except BaseException:
        store.remove([])  # what this attempt stored and no snapshot names goes again
        raise
    return manifest


def branches_root() -> Path:
    return SnapshotStore().root / "branches"  # made and checked by the store


def new_branch_workspace() -> str:
    """An empty directory only this user can reach, for a session opened from a snapshot."""
    path = branches_root() / secrets.token_hex(8)
    os.mkdir(path, 0o700)
    return str(path)


class SpareWorkspaces:
    """A session's branches' private workspaces kept once their branch closed, for the
    session's next fork (decision 514): a child restored into one writes only what differs
    between what the last branch left there and the snapshot (the stat keys its last restore
    or snapshot kept say which files are still what they were), not every file again. Only
    this user's workspaces in the store's branches dir; at most ``MAX`` kept; all removed when
    the session closes."""

    MAX = 64  # fork()'s own limit on children

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: list[tuple[str, Known]] = []
        self._closed = False

    def put(self, workspace: str, known: Known | None) -> None:
        """A closed branch's ``workspace`` kept under a name of its own (the session's
        removal of that path then finds nothing), or removed: no stat keys to trust, the
        session closed, or enough kept."""
        if known is None or Path(workspace).parent != branches_root():
            return  # its session removes it, as any branch workspace
        spare = str(branches_root() / secrets.token_hex(8))
        try:
            os.rename(workspace, spare)
        except OSError:
            return
        with self._lock:
            keep = not self._closed and len(self._kept) < self.MAX
            if keep:
                self._kept.append((spare, known))
        if not keep:
            remove_branch_workspace(spare)

    def take_into(self, workspace: str) -> Known | None:
        """A kept workspace moved to ``workspace`` (a new, empty branch workspace), and the
        stat keys that came with it; None when none is kept (``workspace`` stays as it was)."""
        with self._lock:
            found = self._kept.pop() if self._kept else None
        if found is None:
            return None
        spare, known = found
        try:
            os.rmdir(workspace)  # empty: a branch workspace just made
        except OSError:
            remove_branch_workspace(spare)
            return None
        try:
            os.rename(spare, workspace)
            os.chmod(workspace, 0o700)  # what a command there made of its mode
        except OSError:
            remove_branch_workspace(spare)
            os.makedirs(workspace, 0o700, exist_ok=True)
            return None
        return known

    def close(self) -> None:
        with self._lock:
            self._closed = True
            kept, self._kept = self._kept, []
        for spare, _ in kept:
            remove_branch_workspace(spare)


# Another user's branch workspace (a rootless engine's, for root) lives in the temp dir: that
# user must pass every directory on the way (the engines' access check walks the path), and
# the store's are 0700 — the workspace itself is 0700 and that user's.
_OTHER_USERS_PREFIX = "toolseam-branch-"


def filled_branch_workspace(snapshot_id: str, owner: int | None = None) -> str:
    """A new private workspace made the snapshot's tree by the safe restore (``apply.py``):
    a snapshot pool's warm workspace. ``owner``: the uid it and everything in it is given to
    (root filling one for a rootless engine's sandbox); None: this process's, in the store."""
    if owner is None:
        path = new_branch_workspace()
    else:
        path = tempfile.mkdtemp(prefix=_OTHER_USERS_PREFIX)
        os.chown(path, owner, owner)
    try:
        restore_tree(path, snapshot_id, owner)
    except BaseException:
        remove_branch_workspace(path)
        raise
    return path


def restore_tree(root: str, snapshot_id: str, owner: int | None = None) -> Restored:
    """The directory ``root`` here made the snapshot's tree, what the restore makes given to
    ``owner`` (None: this process's)."""
    return LocalSnapshots()._restore(root, snapshot_id, owner)


def remove_branch_workspace(path: str) -> None:
    """Remove a workspace ``new_branch_workspace`` or ``filled_branch_workspace`` made (never
    anything else)."""
    real = Path(path)
    in_temp = (real.parent == Path(tempfile.gettempdir())
               and real.name.startswith(_OTHER_USERS_PREFIX))
    if real.parent != branches_root() and not in_temp:
        raise ValueError(f"{path} is not a branch workspace")
    parent_fd = os.open(real.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        remove_tree_at(parent_fd, real.name)
    finally:
        os.close(parent_fd)
