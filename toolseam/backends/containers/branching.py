"""Branching for the container backends (``seam/capabilities.py`` ``Branching``; docs/branching.md,
decisions 400-403): a snapshot is the sandbox's whole ``/workspace``, in the same store as the
host backend's.

* **bind mode**: ``/workspace`` is a host directory, so the host backend's own code takes and
  restores it (``snapshots/local.py``: descriptor-relative, cost what changed). On a rootless
  engine run by root, what a restore makes is given to the uid container root maps to, as the
  files its commands make are.
* **copy mode** (remote engines): the sandbox's root packs ``/workspace`` into a file there,
  the files whose stat key is what this session's previous snapshot stored without their bytes
  (``toolseam_agent/pack.py``, decision 467), and the host reads it as any archive into the
  store (``snapshots/archive.py``); a restore ends the jobs, packs the workspace the same way
  (digests only), and has the sandbox's root apply only the differences, descriptor-relative
  (``workspace_restore.py``, decision 468) — or, when the workspace now holds more than a
  snapshot may, empties it (links removed, never followed) and puts the whole tree back
  through the archive API (decision 402).
* **the writable layer** outside ``/workspace`` (``/tmp``, packages a command installed, the
  image's files it deleted) is a second part of the same manifest, in either mode
  (``layer.py``, decision 440; ``layer_snapshots.py`` carries it in and out); a restore puts
  it back after the workspace, a fork's child gets it when it opens.
* **a fork** is a new sandbox of the same engine and options in copy mode, started from a
  private host directory the snapshot was restored into: its own copy of the workspace, which
  ``keep()`` brings home by the copy-back rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Iterable, Iterator
from typing import IO

from ..snapshots import DEFAULT_LIMIT, LocalSnapshots, Restored, Snapshot, SnapshotStore
from ..snapshots.archive import capture_archive, finishing_script, restore_archive
from ..snapshots.capture import Captured, Known, SnapshotLimitError
from ..snapshots.local import keep_manifest
from ..snapshots.manifest import Manifest
from .engine.protocol import in_engine_thread
from .labels import WORKSPACE
from .layer import token_name
from .layer_snapshots import LayerSnapshots, PackDenied
from .workspace_restore import DigestOnly, apply_workspace

# Run by the agent as the sandbox's root, in /workspace: every name in it goes, links as links
# (find's default never follows one; rm -rf removes a link, not what it names). Directories
# are made enterable first, each as find reaches it (";", not "+": a batch after the walk
# would come too late for the directories inside one it could not enter) — the sandbox's root
# may lack CAP_DAC_OVERRIDE. The first find lists what was there (the restore's "removed").
_EMPTY_WORKSPACE = ("cd /workspace && find . -mindepth 1 ; find . -mindepth 1 -type d "
                    "! -perm -u=rwx -exec chmod u+rwx -- {} ';' ; find . -mindepth 1 "
                    "-maxdepth 1 -exec rm -rf -- {} +")


def _still_stored(known: Known | None) -> Known | None:
    """``known`` while the snapshot it came from is in the store (so are its objects); else
    None: every file is sent again."""
    if known is not None and SnapshotStore().has_snapshot(known.source or ""):
        return known
    return None


class ContainerBranching(LayerSnapshots, LocalSnapshots):
    """The ``Branching`` methods of ``ContainerBackend`` (mixed in there)."""

    _layer_start: str | None = None  # a fork's snapshot, whose layer its child opens with
    _layer_known: Known | None = None  # the layer's files the last snapshot stored, by key
    _workspace_known: Known | None = None  # copy mode: the same of /workspace

    async def snapshot_files(self, root: str,
                             label: str | None, session: str,
                             limit: int = DEFAULT_LIMIT) -> Snapshot:
        container = self._running_container()
        known = _still_stored(self._layer_known)
        packed, deleted = await self._pack_layer(container, limit, known)
        drop = [packed]
        taken: list[Captured] = []

        def layer(store: SnapshotStore, left: int) -> tuple[Captured, list[str]]:
            with self._workspace_file(container, packed) as source:
                chunks = iter(lambda: source.read(1 << 20), b"")
                taken.append(capture_archive(chunks, store, left, known))
                return taken[0], deleted
        try:
            if self.sandbox.mode.shares_host_dir:
                snap = await asyncio.to_thread(self._take, self._workspace, label, session,
                                               limit, layer)
            else:  # the sandbox's root packs what changed since (decision 467)
                known_files = _still_stored(self._workspace_known)
                files: str | None = None
                try:
                    files = await self._pack_workspace(container, limit, known_files)
                    drop.append(files)
                except PackDenied:  # a name its root may not read: the engine's whole archive
                    known_files = None
                workspace: list[Captured] = []

                def take() -> Snapshot:
                    with self._workspace_chunks(container, files) as chunks:

                        def capture(store: SnapshotStore) -> Captured:
                            workspace.append(capture_archive(chunks, store, limit, known_files))
                            return workspace[0]
                        manifest = keep_manifest(capture, label, self.name, session, layer,
                                                 limit)
                    return Snapshot.of(manifest)
                snap = await asyncio.to_thread(take)
                workspace[0].known.source = snap.id
                self._workspace_known = workspace[0].known
        finally:
            await self._drop_workspace_file(*drop)
        taken[0].known.source = snap.id  # the next snapshot sends only what changed since
        self._layer_known = taken[0].known
        return snap

    @contextlib.contextmanager
    def _workspace_chunks(self, container: str, packed: str | None) -> Iterator[Iterable[bytes]]:
        """The archive of /workspace: the sandbox's pack of it, or the engine's (``None``)."""
        if packed is None:
            with self.sandbox.engine.get_archive(container, WORKSPACE) as chunks:
                yield chunks
            return
        with self._workspace_file(container, packed) as source:
            yield iter(lambda: source.read(1 << 20), b"")

    async def restore_files(self, root: str,
                            snapshot_id: str) -> Restored:
        container = self._running_container()
        if self.sandbox.mode.shares_host_dir:
            done = await asyncio.to_thread(self._restore, self._workspace, snapshot_id,
                                           self._give_to())
            done.written += await self.restore_layer(SnapshotStore().load(snapshot_id))
            return done
        store = SnapshotStore()
        manifest = store.load(snapshot_id)
        try:
            done = await self._restore_what_changed(container, manifest)
        except (SnapshotLimitError, PackDenied):  # more than a snapshot may hold there now,
            done = await self._restore_whole(container, manifest)  # or locked: emptied
        done.written += await self.restore_layer(manifest)
        return done

    async def _restore_what_changed(self, container: str, manifest: Manifest) -> Restored:
        """Decision 468: the workspace packed as for a snapshot (only what changed since the
        session last saw it is read), compared with the snapshot, and only the differences
        applied by the sandbox's root (``workspace_restore.py``)."""
        known = _still_stored(self._workspace_known)
        packed = await self._pack_workspace(container, DEFAULT_LIMIT, known)
        store = SnapshotStore()
        name = token_name() + ".tar"
        try:
            def plan(archive: IO[bytes]) -> tuple[int, int, Known]:
                with self._workspace_file(container, packed) as source:
                    chunks = iter(lambda: source.read(1 << 20), b"")
                    now = capture_archive(chunks, DigestOnly(), DEFAULT_LIMIT, known)
                with store.lock(exclusive=False):  # every object checked before the sandbox
                    return apply_workspace(manifest, now, store, archive)
            with tempfile.TemporaryFile(prefix="toolseam-restore-") as archive:
                written, removed, kept = await in_engine_thread(lambda: plan(archive))
                archive.seek(0)
                await self._put_workspace_file(container, name, archive)
            await self._agent_as_root(["--layer-apply", f"{WORKSPACE}/{name}"],
                                      "make its workspace the snapshot's", place=WORKSPACE)
        finally:
            await self._drop_workspace_file(packed, name)
        kept.source = manifest.id  # the files kept in place: the snapshot's objects
        self._workspace_known = kept
        return Restored(written, removed, Known())

    async def _restore_whole(self, container: str, manifest: Manifest) -> Restored:
        """Decision 402: the workspace emptied and the snapshot's whole tree put back."""
        engine = self.sandbox.engine
        store = SnapshotStore()
        with tempfile.TemporaryFile(prefix="toolseam-restore-") as archive:
            with store.lock(exclusive=False):  # every object is checked before the sandbox
                files, late_links = await asyncio.to_thread(restore_archive, manifest, store,
                                                            archive)
            were = await self._as_root(_EMPTY_WORKSPACE, "empty the workspace")
            archive.seek(0)
            await asyncio.to_thread(engine.put_archive, container, WORKSPACE, archive)
        finishing = finishing_script(manifest, late_links)
        if finishing is not None:
            await self._as_root(f"cd /workspace && {finishing}",
                                "make its links and set its directories' modes")
        names = {e.path for e in manifest.entries}
        removed = sum(1 for line in were.splitlines() if line[2:] not in names)
        self._workspace_known = None
        return Restored(files, removed, Known())

    def prefill_branch(self, workspace: str, snapshot_id: str) -> None:
        """A fork's private host directory made the snapshot's tree (copy mode carries it in)."""
        LocalSnapshots()._restore(workspace, snapshot_id)

    def branch_home(self, root: str) -> str:
        """Where a kept branch of this session comes home: the host directory that is (bind
        mode) or is copied to (copy mode) ``/workspace``."""
        return self._workspace

    def home_stamps(self) -> dict[str, tuple[int, int] | None] | None:
        """Copy mode: the host's (size, mtime) of each name as the last copy in or back left
        it (the snapshot's times are the sandbox's, not the host's)."""
        copy = getattr(self.sandbox.mode, "copy", None)
        if self.sandbox.mode.shares_host_dir or copy is None:
            return None
        return {rel: entry.host_stamp for rel, entry in copy.baseline.items()}
