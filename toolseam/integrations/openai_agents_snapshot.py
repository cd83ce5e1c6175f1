"""The OpenAI Agents SDK's sandbox snapshot kept in toolseam's snapshot store (issue 48).

``ToolseamSnapshotSpec()`` (or ``ToolseamSnapshot(id=...)``) where the SDK takes a snapshot spec —
``client.create(snapshot=...)``, ``SandboxRunConfig(snapshot=...)`` — keeps the workspace the
SDK persists in this user's content-addressed store (``backends/snapshots/``, docs/branching.md)
instead of a tar file: two persists that share files store them once, every object is checked
against its digest when read back, and a restore is toolseam's.

* **On a toolseam session** (``ToolseamSandboxClient``) whose workspace root is the session's
  base dir, persist is ``Toolkit.snapshot`` of the session's files and restore the backend's
  own restore (``Branching.restore_files``: descriptor-relative, never outside the workspace,
  costing what changed) — no tar at all (``ToolseamSandboxSession`` calls ``keep`` and
  ``put_back``).
* **Anywhere else** (the SDK's own clients; a manifest with ephemeral paths left out) the SDK
  hands ``persist`` its tar: each member's name is checked as a manifest's (no ``..``, no
  absolute name), set-id bits are dropped, devices left out, its files go into the store;
  ``restore`` gives the SDK a tar made from the store, each object checked as it is copied.

One SDK snapshot id keeps one toolseam snapshot, labelled ``openai-agents <id>``: a persist
replaces the one before (as the SDK's ``LocalSnapshot`` overwrites its tar). An id that is a
toolseam snapshot's own (``ToolseamSnapshot(id=snap.id)``) starts a session from that
snapshot, which a later persist never removes.
"""

from __future__ import annotations

import asyncio
import functools
import io
import tarfile
import tempfile
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

from agents.sandbox.errors import (
    SnapshotNotRestorableError,
    SnapshotPersistError,
    SnapshotRestoreError,
)
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec

from ..backends.snapshots import DEFAULT_LIMIT, Snapshot, SnapshotStore
from ..backends.snapshots.archive import capture_archive, restore_archive
from ..backends.snapshots.capture import Captured
from ..backends.snapshots.local import keep_manifest
from ..backends.snapshots.manifest import Manifest
from ..backends.snapshots.store import CHUNK
from ..seam.capabilities import branching
from ..seam.errors import ToolseamError

if TYPE_CHECKING:
    from ..session.toolkit import Toolkit

__all__ = ["ToolseamSnapshot", "ToolseamSnapshotSpec"]

_TAR_BACKEND = "openai-agents"  # the "backend" of a snapshot that came as the SDK's tar
# what a store, a tar the SDK handed over or a backend's restore raises, said as the SDK's error
_FAILURES = (ToolseamError, OSError, ValueError, tarfile.TarError)


class ToolseamSnapshot(SnapshotBase):
    """An SDK snapshot whose bytes are in toolseam's store. ``id``: the SDK's name for it (the
    session's id when built from ``ToolseamSnapshotSpec``), or a toolseam snapshot's id to
    start from. ``max_bytes``: the most file bytes one persist may hold."""

    type: Literal["toolseam"] = "toolseam"
    max_bytes: int = DEFAULT_LIMIT

    @property
    def label(self) -> str:
        return f"openai-agents {self.id}"

    def stored(self) -> Manifest | None:
        """The toolseam snapshot this id names now: the newest one persisted under it, else
        the toolseam snapshot whose id it is, else None."""
        store = SnapshotStore()
        mine = [m for m in store.all() if m.label == self.label]
        if mine:
            return mine[-1]  # all() is oldest first
        return store.load(self.id) if store.has_snapshot(self.id) else None

    def _replace_older(self, kept: str) -> None:
        """Remove what was persisted under this id before ``kept`` — only before: of two
        sessions persisting under one id at once, the later snapshot stays."""
        store = SnapshotStore()
        made = store.load(kept).created
        older = [m.id for m in store.all()
                 if m.label == self.label and m.id != kept and m.created < made]
        if older:
            store.remove(older)

    # --- the SDK's interface: a tar in, a tar out ---------------------------------------------
    async def persist(self, data: io.IOBase, *, dependencies: Dependencies | None = None
                      ) -> None:
        chunks = iter(functools.partial(data.read, CHUNK), b"")
        take = functools.partial(_capture_tar, chunks, self.max_bytes)
        try:
            manifest = await asyncio.to_thread(keep_manifest, take, self.label, _TAR_BACKEND,
                                               self.id)
            await asyncio.to_thread(self._replace_older, manifest.id)
        except _FAILURES as exc:
            raise SnapshotPersistError(snapshot_id=self.id, path=SnapshotStore().root,
                                       cause=exc) from exc

    async def restore(self, *, dependencies: Dependencies | None = None) -> io.IOBase:
        try:
            return await asyncio.to_thread(self._as_tar)
        except _FAILURES as exc:
            raise SnapshotRestoreError(snapshot_id=self.id, path=SnapshotStore().root,
                                       cause=exc) from exc

    def _as_tar(self) -> io.IOBase:
        manifest = self.stored()
        if manifest is None:
            raise SnapshotNotRestorableError(snapshot_id=self.id, path=SnapshotStore().root)
        store = SnapshotStore()
        out = tempfile.TemporaryFile(prefix="toolseam-sdk-restore-")  # noqa: SIM115 - the SDK closes it
        try:
            with store.lock(exclusive=False):  # its objects stay while they are copied out
                restore_archive(manifest, store, out, whole=True)
        except BaseException:
            out.close()
            raise
        out.seek(0)
        return out

    async def restorable(self, *, dependencies: Dependencies | None = None) -> bool:
        return await asyncio.to_thread(self.stored) is not None

    # --- a toolseam session's own files: no tar ----------------------------------------------
    async def keep(self, toolkit: Toolkit) -> Snapshot:
        """Persist: ``toolkit``'s files as a toolseam snapshot under this id."""
        try:
            snap = await toolkit.snapshot(self.label)
            await asyncio.to_thread(self._replace_older, snap.id)
        except _FAILURES as exc:
            raise SnapshotPersistError(snapshot_id=self.id, path=SnapshotStore().root,
                                       cause=exc) from exc
        return snap

    async def put_back(self, toolkit: Toolkit) -> None:
        """Restore: ``toolkit``'s files made exactly this snapshot's by the backend's restore
        (its running jobs are left alone, as the SDK's own restore leaves them)."""
        try:
            manifest = await asyncio.to_thread(self.stored)
            if manifest is None:
                raise SnapshotNotRestorableError(snapshot_id=self.id,
                                                 path=SnapshotStore().root)
            await toolkit.open()
            await branching(toolkit.backend).restore_files(toolkit.base_dir, manifest.id)
        except _FAILURES as exc:
            raise SnapshotRestoreError(snapshot_id=self.id, path=SnapshotStore().root,
                                       cause=exc) from exc


class ToolseamSnapshotSpec(SnapshotSpec):
    """``SnapshotSpec`` for toolseam's store: each session's snapshot is named by its id."""

    type: Literal["toolseam"] = "toolseam"
    max_bytes: int = DEFAULT_LIMIT

    def build(self, snapshot_id: str) -> ToolseamSnapshot:
        return ToolseamSnapshot(id=snapshot_id, max_bytes=self.max_bytes)


def _capture_tar(chunks: Iterable[bytes], limit: int, store: SnapshotStore) -> Captured:
    return capture_archive(chunks, store, limit, relative=True)
