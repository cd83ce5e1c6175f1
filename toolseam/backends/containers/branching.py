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

from ...seam.models import SyncReport
from ..snapshots import DEFAULT_LIMIT, LocalSnapshots, Restored, Snapshot, SnapshotStore
from ..snapshots.archive import capture_archive, finishing_script, restore_archive
from ..snapshots.capture import Captured, Known, SnapshotLimitError
from ..snapshots.local import keep_manifest
from ..snapshots.manifest import Manifest
from .engine.protocol import in_engine_thread
from .labels import WORKSPACE
from .layer_snapshots import _OUTSIDE, LayerSnapshots, PackDenied, PackStopped, _still_stored
from .workspace_restore import DigestOnly, WorkspaceRestore, workspace_restore
from .workspace_sync.tar_sync import WorkspaceCopy

# Run by the agent as the sandbox's root, in /workspace: every name in it goes, links as links
# (find's default never follows one; rm -rf removes a link, not what it names). Directories
# are made enterable first, each as find reaches it (";", not "+": a batch after the walk
# would come too late for the directories inside one it could not enter) — the sandbox's root
# may lack CAP_DAC_OVERRIDE. The first find lists what was there (the restore's "removed").
_EMPTY_WORKSPACE = ("cd /workspace && find . -mindepth 1 ; find . -mindepth 1 -type d "
                    "! -perm -u=rwx -exec chmod u+rwx -- {} ';' ; find . -mindepth 1 "
                    "-maxdepth 1 -exec rm -rf -- {} +")


class ContainerBranching(LayerSnapshots, LocalSnapshots):
    """The ``Branching`` methods of ``ContainerBackend`` (mixed in there)."""

    _layer_start: Manifest | None = None  # a fork's snapshot, whose layer its child opens with
    _workspace_known: Known | None = None  # copy mode: what /workspace's last pack read

    async def snapshot_files(self, root: str,
                             label: str | None, session: str,
                             limit: int = DEFAULT_LIMIT) -> Snapshot:
        container = self._running_container()
        known = _still_stored(self._layer_known)
        layer_plan, names = await self._layer_plan(container, limit, known)
        parts = [(layer_plan, "pack its writable layer", _OUTSIDE)]
        copy = not self.sandbox.mode.shares_host_dir
        known_files = _still_stored(self._workspace_known) if copy else None
        if copy:  # the sandbox's root packs what changed since (decision 467), same run
            parts.append((self._workspace_plan(limit, known_files), "pack its workspace",
                          WORKSPACE))
        try:
            drop = await self._pack(container, parts, limit)
        except PackStopped as stopped:
            if stopped.part == 0 or not isinstance(stopped.cause, PackDenied):
                await self._drop_workspace_file(*stopped.packed)
                raise stopped.cause from None
            drop = stopped.packed  # a name its root may not read: the engine's whole archive
            known_files = None
        taken: list[Captured] = []

        def layer(store: SnapshotStore, left: int) -> tuple[Captured, list[str]]:
            taken.append(self._read_packed(container, drop[0], store, left, known))
            return taken[0], names.deleted
        try:
            if not copy:
                snap = await asyncio.to_thread(self._take, self._workspace, label, session,
                                               limit, layer)
            else:
                files = drop[1] if len(drop) > 1 else None
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
        self._names_at = (snap.id, names)
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
        manifest = SnapshotStore().load(snapshot_id)
        try:
            return await self._restore_what_changed(container, manifest)
        except (PackStopped, SnapshotLimitError):  # more than a snapshot may hold there now,
            done = await self._restore_whole(container, manifest)  # or locked: emptied, refilled
        done.written += await self.restore_layer(manifest)
        return done

    async def _restore_what_changed(self, container: str, manifest: Manifest) -> Restored:
        """Decisions 468-469: the workspace and the layer packed by one run of the sandbox's
        root (only what changed since the session last saw them is read), compared with the
        snapshot, and only the differences applied by one more (``workspace_restore.py``,
        ``layer_restore.py``)."""
        known = _still_stored(self._workspace_known)
        layer_known = _still_stored(self._layer_known)
        layer_plan, names = await self._layer_plan(container, DEFAULT_LIMIT, layer_known)
        diff_layer = any(e.kind == "file" for e in manifest.layer)
        parts = [(self._workspace_plan(DEFAULT_LIMIT, known), "pack its workspace", WORKSPACE)]
        if diff_layer:
            parts.append((layer_plan, "pack its writable layer", _OUTSIDE))
        try:
            packed = await self._pack(container, parts, DEFAULT_LIMIT)
        except PackStopped as stopped:
            if stopped.part == 0:
                raise
            packed = stopped.packed  # the layer's part: all of it is written again
        try:
            def read() -> tuple[WorkspaceRestore, Captured | None]:
                now = self._read_packed(container, packed[0], DigestOnly(), DEFAULT_LIMIT,
                                        known)
                layer = (self._read_packed(container, packed[1], DigestOnly(), DEFAULT_LIMIT,
                                           layer_known) if len(packed) > 1 else None)
                return workspace_restore(manifest, now), layer
            part, current = await in_engine_thread(read)
        except BaseException:
            await self._drop_workspace_file(*packed)
            raise
        written = await self._apply_restore(container, manifest, names, current, part,
                                            packed)
        part.kept.source = manifest.id  # the files kept in place: the snapshot's objects
        self._workspace_known = part.kept
        return Restored(written, part.removed, Known())

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
        LocalSnapshots()._restore(workspace, snapshot_id,
                                  manifest=self.fork_manifest(snapshot_id))

    async def ready_branch_home(self) -> None:
        """A local fork's child forking in turn (decision 507): its private host directory,
        its branches' home, starts empty and is filled by its first sync — done now, so a
        kept grandchild is compared with the child's files, not with an empty directory."""
        copy = getattr(self.sandbox.mode, "copy", None)
        if getattr(self.sandbox.mode, "overlay", None) is not None and copy is not None \
                and not copy.baseline:
            await self.sandbox.sync()

    async def keep_directly(self, home: WorkspaceCopy) -> SyncReport | None:
        """``keep()`` of a local fork's overlay child whose private directory was never
        filled (decision 507): the engine's archive of ``/workspace`` applied to the home by
        the copy-back rule, as a sync would apply it to that directory — one copy, not two.
        None for any other session (its sync, then its directory)."""
        mode = self.sandbox.mode
        copy = getattr(mode, "copy", None)
        if getattr(mode, "overlay", None) is None or copy is None or copy.baseline:
            return None
        container = self._running_container()
        engine = self.sandbox.engine

        def bring() -> SyncReport:
            with engine.get_archive(container, WORKSPACE) as chunks:
                spool = home.spool(chunks, "the branch's workspace")
            with spool:
                return home.apply(spool, source=f"the branch's workspace (the {self.name} "
                                                f"container {container[:12]})")
        return await asyncio.to_thread(bring)

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
