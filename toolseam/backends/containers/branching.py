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
* **the writable layer** outside ``/workspace`` (``/tmp``, packages a command installed, the
  image's files it deleted) is a second part of the same manifest, in either mode
  (``layer.py``, decision 440); a restore puts it back after the workspace, a fork's child
  gets it when it opens.
* **a fork** is a new sandbox of the same engine and options in copy mode, started from a
  private host directory the snapshot was restored into: its own copy of the workspace, which
  ``keep()`` brings home by the copy-back rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

from ...seam.errors import CouldNotRunError
from ...seam.models import SpawnRequest
from ..snapshots import DEFAULT_LIMIT, LocalSnapshots, Restored, Snapshot, SnapshotStore
from ..snapshots.archive import capture_archive, finishing_script, restore_archive
from ..snapshots.capture import Captured, Known, SnapshotLimitError
from ..snapshots.local import keep_manifest
from ..snapshots.manifest import Manifest
from .bundle.staged import bundle_command
from .engine.protocol import in_engine_thread
from .labels import AGENT_MOUNT, OWNER_LABEL, SESSION_LABEL, WORKSPACE, owner_label
from .layer import (
    LayerNames,
    apply_archive,
    image_names_to_fetch,
    inner_file,
    layer_names,
    one_file_archive,
    pack_plan,
    token_name,
)
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
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LIMIT_EXIT = 3  # toolseam_agent/layer.py: the layer holds more than the snapshot may


class ContainerBranching(LocalSnapshots):
    """The ``Branching`` methods of ``ContainerBackend`` (mixed in there)."""

    sandbox: ContainerSandbox
    _workspace: str
    _closed: bool
    _layer_start: str | None = None  # a fork's snapshot, whose layer its child opens with
    _layer_known: Known | None = None  # the layer's files the last snapshot stored, by key
    _exec: AgentExec

    async def snapshot_files(self, root: str,
                             label: str | None, session: str,
                             limit: int = DEFAULT_LIMIT) -> Snapshot:
        container = self._running_container()
        engine = self.sandbox.engine
        known = self._layer_known
        if known is not None and not SnapshotStore().has_snapshot(known.source or ""):
            known = None  # its objects may be gone: every file is sent again
        packed, deleted = await self._pack_layer(container, limit, known)
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
            else:
                def take() -> Snapshot:
                    with engine.get_archive(container, WORKSPACE) as chunks:
                        manifest = keep_manifest(
                            lambda store: capture_archive(chunks, store, limit), label,
                            self.name, session, layer, limit)
                    return Snapshot.of(manifest)
                snap = await asyncio.to_thread(take)
        finally:
            await self._drop_workspace_file(packed)
        taken[0].known.source = snap.id  # the next snapshot sends only what changed since
        self._layer_known = taken[0].known
        return snap

    async def restore_files(self, root: str,
                            snapshot_id: str) -> Restored:
        container = self._running_container()
        if self.sandbox.mode.shares_host_dir:
            done = await asyncio.to_thread(self._restore, self._workspace, snapshot_id,
                                           self._give_to())
            done.written += await self.restore_layer(SnapshotStore().load(snapshot_id))
            return done
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
        files += await self.restore_layer(manifest)
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

    # --- the writable layer outside /workspace (layer.py, decision 440) --------------------
    async def _pack_layer(self, container: str, limit: int, known: Known | None
                          ) -> tuple[str, list[str]]:
        """The layer packed by the sandbox's root into a file in /workspace: its name there,
        and the image's names the layer deleted."""
        engine = self.sandbox.engine
        names = await in_engine_thread(lambda: layer_names(
            engine, container, self.sandbox.hardening.read_only_root))
        plan, packed = token_name() + ".json", token_name() + ".tar"
        await self._put_workspace_file(container, plan, pack_plan(names, limit, known))
        try:
            await self._agent_as_root(["--layer-pack", f"{WORKSPACE}/{plan}",
                                       f"{WORKSPACE}/{packed}"], "pack its writable layer",
                                      limit)
        except SnapshotLimitError:
            await self._drop_workspace_file(plan)
            raise
        return packed, names.deleted

    async def restore_layer(self, manifest: Manifest) -> int:
        """The sandbox's layer outside /workspace made the snapshot's (the jobs ended
        already); the files written."""
        container = self._running_container()
        engine = self.sandbox.engine
        sandbox = self.sandbox
        now: LayerNames = await in_engine_thread(lambda: layer_names(
            engine, container, sandbox.hardening.read_only_root))
        from_image = await in_engine_thread(lambda: image_names_to_fetch(
            engine, container, now, manifest))
        labels = {OWNER_LABEL: owner_label(), SESSION_LABEL: sandbox.session_id}
        store = SnapshotStore()
        name = token_name() + ".tar"
        with tempfile.TemporaryFile(prefix="toolseam-layer-") as archive:
            with store.lock(exclusive=False):  # every object checked before the sandbox
                written = await in_engine_thread(lambda: apply_archive(
                    manifest, store, now, engine, sandbox.image, sandbox.hardening, labels,
                    from_image, archive))
            archive.seek(0)
            await self._put_workspace_file(container, name, archive)
        try:
            await self._agent_as_root(["--layer-apply", f"{WORKSPACE}/{name}"],
                                      "put its writable layer back")
        finally:
            await self._drop_workspace_file(name)
        return written

    def _give_to(self) -> int | None:
        """The uid what the host makes in a rootless engine's bind mount is given to."""
        owner = socket_owner(self.sandbox.engine.endpoint)
        return owner if os.geteuid() == 0 and owner not in (None, 0) else None

    async def _put_workspace_file(self, container: str, name: str, data: bytes | IO[bytes]
                                  ) -> None:
        """A new 0600 file ``name`` at the top of /workspace, the sandbox's root's."""
        if self.sandbox.mode.shares_host_dir:
            def write() -> None:
                top = os.open(self._workspace, _DIR_FLAGS)
                try:
                    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, 0o600, dir_fd=top)
                finally:
                    os.close(top)
                with os.fdopen(fd, "wb") as out:
                    if isinstance(data, bytes):
                        out.write(data)
                    else:
                        shutil.copyfileobj(data, out, 1 << 20)
                    give_to = self._give_to()
                    if give_to is not None:
                        os.fchown(out.fileno(), give_to, -1)
            await asyncio.to_thread(write)
            return
        engine = self.sandbox.engine

        def put() -> None:
            if isinstance(data, bytes):
                engine.put_archive(container, WORKSPACE, one_file_archive(name, data))
                return
            with tempfile.TemporaryFile(prefix="toolseam-layer-") as outer:
                with tarfile.open(fileobj=outer, mode="w") as tar:
                    info = tarfile.TarInfo(name)
                    info.mode, info.size = 0o600, os.fstat(data.fileno()).st_size
                    tar.addfile(info, data)
                engine.put_archive(container, WORKSPACE, outer)
        await in_engine_thread(put)

    @contextlib.contextmanager
    def _workspace_file(self, container: str, name: str) -> Iterator[IO[bytes]]:
        """The regular file ``name`` at the top of /workspace, read (never through a link)."""
        if self.sandbox.mode.shares_host_dir:
            top = os.open(self._workspace, _DIR_FLAGS)
            try:
                # O_NONBLOCK: a fifo a command put in its place must not hang the host
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=top)
            finally:
                os.close(top)
            with os.fdopen(fd, "rb") as source:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise CouldNotRunError(f"snapshot: the sandbox's {name} is not a file",
                                           retryable=False)
                yield source
            return
        with self.sandbox.engine.get_archive(container, f"{WORKSPACE}/{name}") as chunks, \
                inner_file(chunks, name) as source:
            yield source

    async def _drop_workspace_file(self, name: str) -> None:
        if self.sandbox.mode.shares_host_dir:
            def drop() -> None:
                top = os.open(self._workspace, _DIR_FLAGS)
                try:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=top)
                finally:
                    os.close(top)
            await asyncio.to_thread(drop)
            return
        await self._as_root(f"rm -f -- {WORKSPACE}/{name}", "remove its layer's file")

    async def _agent_as_root(self, args: list[str], what: str, limit: int = DEFAULT_LIMIT
                             ) -> None:
        """The staged agent's ``args`` role (``toolseam_agent/layer.py``) as the sandbox's
        root."""
        status = await self._exec.start(SpawnRequest(
            job=f"toolseam-layer-{secrets.token_hex(4)}",
            argv=[*bundle_command(AGENT_MOUNT), *args], cwd="/",
            env={"PATH": _PATH, "LC_ALL": "C"}, forget_when_done=True, deadline_ms=600_000))
        if status.exit_code == _LIMIT_EXIT:
            raise SnapshotLimitError("/ (outside the workspace)", limit)
        if status.exit_code != 0:
            err = "".join(c.text for c in status.chunks if c.stream == "stderr").strip()
            raise CouldNotRunError(f"snapshot: could not {what} in the {self.name} sandbox "
                                   f"(exit {status.exit_code}: {err[-600:]})", retryable=False)

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

