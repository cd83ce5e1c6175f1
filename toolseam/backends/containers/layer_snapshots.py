"""The writable layer outside ``/workspace`` in a container's snapshot (``/tmp``, packages a
command installed, the image's files it deleted; ``layer.py``, decision 440): packed by the
sandbox's root into a file in ``/workspace`` and read from there, and put back the same way —
the mixin ``ContainerBranching`` (``branching.py``) builds on, with the helpers both share
for running a command as the sandbox's root."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import secrets
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

from ...seam.errors import CouldNotRunError
from ...seam.models import JobStatus, SpawnRequest
from ..snapshots import DEFAULT_LIMIT, SnapshotStore
from ..snapshots.archive import capture_archive
from ..snapshots.capture import Captured, Known, SnapshotLimitError, SnapshotRaceError
from ..snapshots.manifest import Manifest
from .bundle.staged import bundle_command
from .engine.protocol import in_engine_thread
from .fork_image import on_fork_image
from .labels import AGENT_MOUNT, OWNER_LABEL, SESSION_LABEL, WORKSPACE, owner_label
from .layer import LayerNames, inner_file, layer_names, pack_plan, token_name, workspace_plan
from .layer_restore import ImageSource, apply_archive, image_names_to_fetch, layer_restore
from .modes.bind import socket_owner
from .workspace_restore import DigestOnly, WorkspaceRestore

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


class PackStopped(Exception):
    """A part of a pack past the limit, with a name its root may not read or one that changed
    kind twice (``cause``): which part, and the names of those packed before it."""

    def __init__(self, part: int, cause: CouldNotRunError, packed: list[str]) -> None:
        super().__init__(str(cause))
        self.part, self.cause, self.packed = part, cause, packed


def _still_stored(known: Known | None) -> Known | None:
    """``known`` while the snapshot it came from is in the store (so are its objects); else
    None: every file is sent again."""
    if known is not None and SnapshotStore().has_snapshot(known.source or ""):
        return known
    return None


class LayerSnapshots:
    """The layer's half of ``ContainerBranching`` (mixed in there)."""

    name: str
    sandbox: ContainerSandbox
    _workspace: str
    _closed: bool
    _exec: AgentExec
    _layer_known: Known | None = None  # the layer's files the last snapshot stored, by key
    # a child on its fork's start image: the parent's layer names that image holds
    # (fork_image.py), through which its every diff is read
    _base_names: LayerNames | None = None
    # the layer's names at this session's last snapshot (its id), for a fork of it
    _names_at: tuple[str, LayerNames] | None = None

    async def _layer_plan(self, container: str, limit: int, known: Known | None
                          ) -> tuple[bytes, LayerNames]:
        """What the sandbox's root packs of the layer, and what the engine's diff says of it."""
        engine = self.sandbox.engine
        names = await in_engine_thread(lambda: layer_names(
            engine, container, self.sandbox.hardening.read_only_root))
        if self._base_names is not None:
            names = on_fork_image(self._base_names, names)
        return pack_plan(names, limit, known), names

    def _workspace_plan(self, limit: int, known: Known | None) -> bytes:
        """What the sandbox's root packs of a copy-mode /workspace: files whose stat key is
        ``known`` without their bytes, unchanged directories as one header (decision 467)."""
        return workspace_plan(limit, known, self.sandbox.engine.archive_mtime)

    async def _pack(self, container: str, parts: list[tuple[bytes, str, str]], limit: int
                    ) -> list[str]:
        """The ``(plan, what, place)`` parts packed by ONE run of the sandbox's root (a file
        in /workspace each): their names. A part that fails raises ``PackStopped`` (the names
        of the parts before it, packed, are in it; nothing else of the pack is left)."""
        names = [(token_name() + ".json", token_name() + ".tar") for _ in parts]
        await self._put_workspace_files(container, {
            plan: data for (plan, _), (data, _, _) in zip(names, parts, strict=True)})
        args = [f"{WORKSPACE}/{name}" for pair in names for name in pair]
        try:
            status = await self._agent_status(["--layer-pack", *args])
        except BaseException:
            await self._drop_workspace_file(*(n for pair in names for n in pair))
            raise
        code = -1 if status.exit_code is None else status.exit_code
        if code == 0:
            return [out for _, out in names]
        failed = min(max(code, 0) // 16, len(parts) - 1)
        await self._drop_workspace_file(*(n for plan, out in names[failed:] for n in (plan, out)))
        packed = [out for _, out in names[:failed]]
        _, what, place = parts[failed]
        try:
            self._raise_for(status, what, limit, place, code % 16 if code > 0 else code)
        except (SnapshotLimitError, PackDenied, SnapshotRaceError) as exc:
            raise PackStopped(failed, exc, packed) from exc
        except BaseException:
            await self._drop_workspace_file(*packed)
            raise
        raise AssertionError("a failed pack raises")  # pragma: no cover

    def _read_packed(self, container: str, name: str, store: SnapshotStore, limit: int,
                     known: Known | None) -> Captured:
        """The packed file ``name`` read into ``store`` (``DigestOnly``: hashed only)."""
        with self._workspace_file(container, name) as source:
            return capture_archive(iter(lambda: source.read(1 << 20), b""), store, limit, known)

    async def restore_layer(self, manifest: Manifest, diff: bool = True) -> int:
        """The sandbox's layer outside /workspace made the snapshot's (the jobs ended
        already); the files written. ``diff``: the layer packed first (digests only) and only
        what differs written — skipped when the snapshot's layer holds no file (nothing to
        spare) and for a fork's child, whose layer is the image's."""
        container = self._running_container()
        known = _still_stored(self._layer_known)
        plan, names = await self._layer_plan(container, DEFAULT_LIMIT, known)
        current: Captured | None = None
        drop: list[str] = []
        if diff and any(e.kind == "file" for e in manifest.layer):
            try:
                drop = await self._pack(container, [(plan, "pack its writable layer",
                                                     _OUTSIDE)], DEFAULT_LIMIT)
                current = await in_engine_thread(lambda: self._read_packed(
                    container, drop[0], DigestOnly(), DEFAULT_LIMIT, known))
            except PackStopped:
                current = None  # more than a snapshot may hold, or locked: all of it again
        return await self._apply_restore(container, manifest, names, current, None, drop)

    async def _apply_restore(self, container: str, manifest: Manifest, names: LayerNames,
                             current: Captured | None, workspace: WorkspaceRestore | None,
                             drop: list[str]) -> int:
        """One tar, applied by the sandbox's root: ``workspace``'s part (copy mode) and the
        layer's; ``drop``: pack outputs it removes. Files written."""
        engine = self.sandbox.engine
        sandbox = self.sandbox
        part = layer_restore(manifest, names, current)
        from_image = await in_engine_thread(lambda: image_names_to_fetch(
            engine, container, names, manifest))
        source = ImageSource(engine, sandbox.image, sandbox.hardening,
                             {OWNER_LABEL: owner_label(), SESSION_LABEL: sandbox.session_id},
                             from_image)
        plan = {**part.plan, "drop": drop}
        write = part.write
        if workspace is not None:
            plan["keep_only"] = {**workspace.keep_only, **part.plan.get("keep_only", {})}
            write = [*workspace.write, *part.write]
        store = SnapshotStore()
        name = token_name() + ".tar"
        try:
            with tempfile.TemporaryFile(prefix="toolseam-layer-") as archive:
                with store.lock(exclusive=False):  # every object checked before the sandbox
                    written = await in_engine_thread(lambda: apply_archive(
                        plan, store, write, archive, source))
                archive.seek(0)
                await self._put_workspace_files(container, {name: archive})
            await self._agent_as_root(["--layer-apply", f"{WORKSPACE}/{name}"],
                                      "put its files back")
        except BaseException:
            await self._drop_workspace_file(name, *drop)
            raise
        if current is not None:
            part.kept.source = manifest.id  # kept in place: the snapshot's objects
            self._layer_known = part.kept
        else:
            self._layer_known = None
        return written

    def _give_to(self) -> int | None:
        """The uid what the host makes in a rootless engine's bind mount is given to."""
        owner = socket_owner(self.sandbox.engine.endpoint)
        return owner if os.geteuid() == 0 and owner not in (None, 0) else None

    async def _put_workspace_files(self, container: str, files: dict[str, bytes | IO[bytes]]
                                   ) -> None:
        """New 0600 files at the top of /workspace, the sandbox's root's (one archive)."""
        if self.sandbox.mode.shares_host_dir:
            def write() -> None:
                for name, data in files.items():
                    self._write_host_file(name, data)
            await asyncio.to_thread(write)
            return
        engine = self.sandbox.engine

        def put() -> None:
            with tempfile.TemporaryFile(prefix="toolseam-layer-") as outer:
                with tarfile.open(fileobj=outer, mode="w") as tar:
                    for name, data in files.items():
                        info = tarfile.TarInfo(name)
                        if isinstance(data, bytes):
                            info.mode, info.size = 0o600, len(data)
                            tar.addfile(info, io.BytesIO(data))
                        else:
                            info.mode, info.size = 0o600, os.fstat(data.fileno()).st_size
                            tar.addfile(info, data)
                outer.seek(0)
                engine.put_archive(container, WORKSPACE, outer)
        await in_engine_thread(put)

    def _write_host_file(self, name: str, data: bytes | IO[bytes]) -> None:
        """Bind mode: a new 0600 file ``name`` in the host directory that is /workspace."""
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

    async def _agent_status(self, args: list[str]) -> JobStatus:
        """The staged agent's ``args`` role (``toolseam_agent/layer.py``, ``pack.py``) run as
        the sandbox's root."""
        return await self._exec.start(SpawnRequest(
            job=f"toolseam-layer-{secrets.token_hex(4)}",
            argv=[*bundle_command(AGENT_MOUNT), *args], cwd="/",
            env={"PATH": _PATH, "LC_ALL": "C"}, forget_when_done=True, deadline_ms=600_000))

    async def _agent_as_root(self, args: list[str], what: str, limit: int = DEFAULT_LIMIT,
                             place: str = _OUTSIDE) -> None:
        """The staged agent's ``args`` role as the sandbox's root; ``place``: what a snapshot
        past its limit names."""
        status = await self._agent_status(args)
        if status.exit_code != 0:
            self._raise_for(status, what, limit, place,
                            -1 if status.exit_code is None else status.exit_code)

    def _raise_for(self, status: JobStatus, what: str, limit: int, place: str, code: int
                   ) -> None:
        if code == _LIMIT_EXIT:
            raise SnapshotLimitError(place, limit)
        if code == _RACE_EXIT:
            raise SnapshotRaceError("a name in the sandbox")
        if code == _DENIED_EXIT:
            raise PackDenied(f"snapshot: could not {what} in the {self.name} sandbox: a name "
                             "there is not readable by its root", retryable=False)
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

