"""Branching for the container backends (``seam/capabilities.py`` ``Branching``; docs/branching.md,
decisions 400-403): a snapshot is the sandbox's whole ``/workspace``, in the same store as the
host backend's.

* **bind mode**: ``/workspace`` is a host directory, so the host backend's own code takes and
  restores it (``snapshots/local.py``: descriptor-relative, cost what changed). On a rootless
  engine run by root, what a restore makes is given to the uid container root maps to, as the
  files its commands make are.
* **copy mode** (remote engines): the engine's archive of ``/workspace`` is read into the store
  (``snapshots/archive.py``); a restore ends the jobs, empties ``/workspace`` by a command the
  agent runs as the sandbox's root (links removed, never followed) and puts the snapshot's tree
  there through the archive API — the engine writes only inside the container, and nothing of
  the old tree is left for a name to pass through.
* **a fork** is a new sandbox of the same engine and options in copy mode, started from a
  private host directory the snapshot was restored into: its own copy of the workspace, which
  ``keep()`` brings home by the copy-back rule.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
from typing import TYPE_CHECKING

from ...seam.errors import CouldNotRunError
from ...seam.models import SpawnRequest
from ..snapshots import DEFAULT_LIMIT, LocalSnapshots, Restored, Snapshot, SnapshotStore
from ..snapshots.archive import capture_archive, finishing_script, restore_archive
from ..snapshots.capture import Known
from ..snapshots.local import keep_manifest
from .labels import WORKSPACE
from .modes.bind import socket_owner

if TYPE_CHECKING:
    from ..agentlink.parts import AgentExec
    from .sandbox import ContainerSandbox

# Run by the agent as the sandbox's root, in /workspace: every name in it goes, links as links
# (find's default never follows one; rm -rf removes a link, not what it names). Directories
# are made enterable first, each as find reaches it (";", not "+": a batch after the walk
# would come too late for the directories inside one it could not enter) — the sandbox's root
# may lack CAP_DAC_OVERRIDE. The first find lists what was there (the restore's "removed").
_EMPTY_WORKSPACE = ("cd /workspace && find . -mindepth 1 ; find . -mindepth 1 -type d "
                    "! -perm -u=rwx -exec chmod u+rwx -- {} ';' ; find . -mindepth 1 "
                    "-maxdepth 1 -exec rm -rf -- {} +")
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ContainerBranching(LocalSnapshots):
    """The ``Branching`` methods of ``ContainerBackend`` (mixed in there)."""

    sandbox: ContainerSandbox
    _workspace: str
    _closed: bool
    _exec: AgentExec

    async def snapshot_files(self, root: str,
                             label: str | None, session: str,
                             limit: int = DEFAULT_LIMIT) -> Snapshot:
        if self.sandbox.mode.shares_host_dir:
            return await LocalSnapshots.snapshot_files(self, self._workspace, label, session,
                                                       limit)
        container = self._running_container()
        engine = self.sandbox.engine

        def take() -> Snapshot:
            with engine.get_archive(container, WORKSPACE) as chunks:
                manifest = keep_manifest(lambda store: capture_archive(chunks, store, limit),
                                         label, self.name, session)
            return Snapshot.of(manifest)
        return await asyncio.to_thread(take)

    async def restore_files(self, root: str,
                            snapshot_id: str) -> Restored:
        if self.sandbox.mode.shares_host_dir:
            owner = socket_owner(self.sandbox.engine.endpoint)
            give_to = owner if os.geteuid() == 0 and owner not in (None, 0) else None
            return await asyncio.to_thread(self._restore, self._workspace, snapshot_id, give_to)
        container = self._running_container()
        engine = self.sandbox.engine
        store = SnapshotStore()
        manifest = store.load(snapshot_id)
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

    # --- helpers ----------------------------------------------------------------------------
    def _running_container(self) -> str:
        container = self.sandbox.container
        if container is None or self._closed:
            raise CouldNotRunError(f"the {self.name} sandbox is not running", retryable=True)
        return container

    async def _as_root(self, script: str, what: str
                       ) -> str:
        """Run ``script`` as the sandbox's root; its standard output."""
        status = await self._exec.start(SpawnRequest(
            job=f"toolseam-restore-{secrets.token_hex(4)}", argv=["/bin/sh", "-c", script],
            cwd="/", env={"PATH": _PATH, "LC_ALL": "C"}, forget_when_done=True,
            deadline_ms=120_000))
        out = "".join(c.text for c in status.chunks if c.stream == "stdout")
        if status.exit_code != 0:
            err = "".join(c.text for c in status.chunks if c.stream == "stderr").strip()
            raise CouldNotRunError(f"restore: could not {what} in the {self.name} sandbox "
                                   f"(exit {status.exit_code}: {err[:300]})", retryable=False)
        return out

