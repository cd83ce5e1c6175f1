"""The writable layer outside ``/workspace`` in a container's snapshot (``/tmp``, packages a
command installed, the image's files it deleted; ``layer.py``, decision 440): packed by the
sandbox's root into a file in ``/workspace`` and read from there, and put back the same way —
the mixin ``ContainerBranching`` (``branching.py``) builds on, with the helpers both share
for running a command as the sandbox's root."""

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
from ..snapshots import DEFAULT_LIMIT, SnapshotStore
from ..snapshots.capture import Known, SnapshotLimitError, SnapshotRaceError
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
    workspace_plan,
)
from .modes.bind import socket_owner

if TYPE_CHECKING:
    from ..agentlink.parts import AgentExec
    from .sandbox import ContainerSandbox

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# toolseam_agent/pack.py: more file bytes than the snapshot may hold; a name changed kind
# twice; a name the sandbox's root may not read
_LIMIT_EXIT, _RACE_EXIT, _DENIED_EXIT = 3, 4, 5
_OUTSIDE = "/ (outside the workspace)"  # the layer's place, as a limit error names it


class PackDenied(CouldNotRunError):
    """The sandbox's root may not read everything it was to pack (a directory or file a
    command locked; the sandbox's root has no ``CAP_DAC_OVERRIDE``)."""


class LayerSnapshots:
    """The layer's half of ``ContainerBranching`` (mixed in there)."""

    name: str
    sandbox: ContainerSandbox
    _workspace: str
    _closed: bool
    _exec: AgentExec

    async def _pack_layer(self, container: str, limit: int, known: Known | None
                          ) -> tuple[str, list[str]]:
        """The layer packed by the sandbox's root into a file in /workspace: its name there,
        and the image's names the layer deleted."""
        engine = self.sandbox.engine
        names = await in_engine_thread(lambda: layer_names(
            engine, container, self.sandbox.hardening.read_only_root))
        packed = await self._pack(container, pack_plan(names, limit, known), limit,
                                  "pack its writable layer", _OUTSIDE)
        return packed, names.deleted

    async def _pack_workspace(self, container: str, limit: int, known: Known | None) -> str:
        """A copy-mode /workspace packed by the sandbox's root into a file there, files
        whose stat key is ``known`` without their bytes (decision 467): its name."""
        plan = workspace_plan(limit, known, self.sandbox.engine.archive_mtime)
        return await self._pack(container, plan, limit, "pack its workspace", WORKSPACE)

    async def _pack(self, container: str, plan_bytes: bytes, limit: int, what: str,
                    place: str) -> str:
        plan, packed = token_name() + ".json", token_name() + ".tar"
        await self._put_workspace_file(container, plan, plan_bytes)
        try:
            await self._agent_as_root(["--layer-pack", f"{WORKSPACE}/{plan}",
                                       f"{WORKSPACE}/{packed}"], what, limit, place)
        except SnapshotLimitError:
            await self._drop_workspace_file(plan)
            raise
        return packed

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

    async def _drop_workspace_file(self, *names: str) -> None:
        """Remove toolseam's own files ``names`` from the top of /workspace (one command)."""
        if self.sandbox.mode.shares_host_dir:
            def drop() -> None:
                top = os.open(self._workspace, _DIR_FLAGS)
                try:
                    for name in names:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(name, dir_fd=top)
                finally:
                    os.close(top)
            await asyncio.to_thread(drop)
            return
        paths = " ".join(f"{WORKSPACE}/{name}" for name in names)  # token_name(): no quoting
        await self._as_root(f"rm -f -- {paths}", "remove its layer's file")

    async def _agent_as_root(self, args: list[str], what: str, limit: int = DEFAULT_LIMIT,
                             place: str = _OUTSIDE) -> None:
        """The staged agent's ``args`` role (``toolseam_agent/layer.py``) as the sandbox's
        root; ``place``: what a snapshot past its limit names."""
        status = await self._exec.start(SpawnRequest(
            job=f"toolseam-layer-{secrets.token_hex(4)}",
            argv=[*bundle_command(AGENT_MOUNT), *args], cwd="/",
            env={"PATH": _PATH, "LC_ALL": "C"}, forget_when_done=True, deadline_ms=600_000))
        if status.exit_code == _LIMIT_EXIT:
            raise SnapshotLimitError(place, limit)
        if status.exit_code == _RACE_EXIT:
            raise SnapshotRaceError("a name in the sandbox")
        if status.exit_code == _DENIED_EXIT:
            raise PackDenied(f"snapshot: could not {what} in the {self.name} sandbox: a name "
                             "there is not readable by its root", retryable=False)
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

