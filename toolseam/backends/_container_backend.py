"""The backend both container engines present: a ``ContainerSandbox`` composed with the
agent's exec and file parts. Podman and docker differ only in the ``Engine`` they pass in."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import posixpath
import tarfile
import tempfile
from collections.abc import Mapping
from typing import Any, Literal

from ..policy.environment import CONTAINER_BASE_ENV
from ..policy.limits import SandboxLimits
from ..seam.errors import ConfigurationError, CouldNotRunError
from ..seam.models import SandboxInfo, SyncReport
from ._container_sandbox import (
    GO_MODE_SYMLINK,
    WORKSPACE,
    WORKSPACE_MODES,
    ContainerSandbox,
    Engine,
    Hardening,
    WorkspaceMode,
)
from ._pull import PULL_POLICIES, PullCallback, PullPolicy
from ._workspace_copy import DEFAULT_COPY_LIMIT
from .agentlink.channel import AgentChannel
from .agentlink.parts import AgentExec, AgentFiles
from .composed import ComposedBackend

# A public, widely cached base any engine can pull: the agent brings its own runtime, so the
# image needs no python; Debian slim has bash and the usual tools commands expect.
DEFAULT_IMAGE = "docker.io/library/debian:bookworm-slim"


class ContainerBackend(ComposedBackend):
    """One warm container per session. A configured container backend that cannot start fails
    the session (``CouldNotRunError``); it never falls back to the host."""

    def __init__(self, engine: Engine, engine_name: str, image: str, workspace: str,
                 hardening: Hardening | None, limits: SandboxLimits | None = None,
                 pull: PullPolicy = "missing", auth: dict[str, str] | None = None,
                 on_pull_progress: PullCallback | None = None,
                 workspace_mode: WorkspaceMode = "auto", copy_limit: int | None = None,
                 agent_bundles: Mapping[str, str] | None = None,
                 copy_keep_group_write: bool = False) -> None:
        if pull not in PULL_POLICIES:
            raise ConfigurationError(f"pull policy must be one of {', '.join(PULL_POLICIES)}, "
                                     f"got {pull!r}")
        if workspace_mode not in WORKSPACE_MODES:
            raise ConfigurationError(f"workspace_mode must be one of {', '.join(WORKSPACE_MODES)}, "
                                     f"got {workspace_mode!r}")
        if copy_limit is not None and copy_limit <= 0:
            raise ConfigurationError(f"copy_limit must be a positive number of bytes, got {copy_limit}")
        super().__init__(AgentFiles(self._agent), AgentExec(self._agent))
        self.name = engine_name
        hardening = hardening or Hardening()
        if limits is not None:
            hardening = dataclasses.replace(
                hardening, memory=limits.memory, cpus=limits.cpus, pids_limit=limits.pids,
                network=limits.network, tmpfs_size=limits.tmpfs_size)
        self.sandbox = ContainerSandbox(engine, engine_name, image, workspace, hardening,
                                        dict(CONTAINER_BASE_ENV),
                                        enforce_limits=limits is not None and not limits.is_default,
                                        pull_policy=pull, registry_auth=auth,
                                        on_pull_progress=on_pull_progress,
                                        mode=resolve_mode(workspace_mode, engine),
                                        copy_limit=copy_limit or DEFAULT_COPY_LIMIT,
                                        keep_group_write=copy_keep_group_write,
                                        agent_bundles=dict(agent_bundles or {}))
        self._opening = asyncio.Lock()
        self._workspace_id: tuple[int, int] | None = None

    def _agent(self) -> AgentChannel:
        channel = self.sandbox.channel
        if channel is None:
            raise CouldNotRunError(f"the {self.name} sandbox is not running", retryable=True)
        return channel

    @property
    def copy_back_error(self) -> CouldNotRunError | None:
        """Set when close could not bring the sandbox's changes home (the container is kept)."""
        return self.sandbox.copy_back_error

    @property
    def workspace_mode(self) -> Literal["bind", "copy"]:
        return self.sandbox.mode

    async def sync(self) -> SyncReport:
        """Bring the sandbox's changes home to the base dir now (copy mode; bind mode shares
        the directory, so there is nothing to bring). Also done at close."""
        self._check_open()
        return await self.sandbox.sync()

    async def upload(self, local: str, dest: str) -> None:
        """Copy a host file or directory into the sandbox's workspace as ``dest`` (relative to
        it, or absolute below it). An upload is the sandbox's own: copy mode brings it home
        only if the sandbox changes it."""
        self._check_open()
        target = self._sandbox_path(dest)
        if not os.path.lexists(local):
            raise ConfigurationError(f"upload: {local} does not exist")
        parent, name = posixpath.split(target)
        sandbox = self.sandbox
        container = sandbox.container
        assert container is not None

        def put() -> None:
            copy = sandbox.copy
            with tempfile.NamedTemporaryFile(prefix="toolseam-upload-") as archive:
                if copy is not None:
                    copy.pack_upload(local, name, archive)
                else:
                    with tarfile.open(fileobj=archive, mode="w") as tar:
                        tar.add(local, arcname=name)
                archive.flush()
                sandbox.engine.put_archive(container, parent, archive)
                if copy is not None:
                    copy.remember_uploaded(archive.name, posixpath.relpath(parent, WORKSPACE)
                                           if parent != WORKSPACE else "")
        await asyncio.to_thread(put)

    async def download(self, src: str, local: str) -> None:
        """Copy a file or directory of the sandbox's workspace to ``local`` on the host
        (which must not exist yet); written beside it first, then renamed into place. A
        source that is, or lies below, a symbolic link is refused: podman's archive API
        follows links (``o4 -> /etc`` would deliver the container's ``/etc``), docker's
        follows all but the last."""
        self._check_open()
        source = self._sandbox_path(src)
        if os.path.lexists(local):
            raise ConfigurationError(f"download: {local} already exists")
        sandbox = self.sandbox
        container = sandbox.container
        assert container is not None

        def get() -> None:
            found = _no_link_on_the_way(sandbox.engine, container, src, source)
            parent = os.path.dirname(os.path.abspath(local))
            with tempfile.TemporaryDirectory(prefix=".toolseam-download-", dir=parent) as work:
                with sandbox.engine.get_archive(container, source) as chunks, \
                        tempfile.TemporaryFile() as spool:
                    for chunk in chunks:
                        spool.write(chunk)
                    spool.seek(0)
                    with tarfile.open(fileobj=spool) as tar:
                        first = tar.next()
                        # the archive must be what the stat saw: a link swapped in meanwhile
                        # comes as a link (docker) or as another kind of entry
                        if first is None or first.issym() or first.islnk() or \
                                first.isdir() != bool(found["mode"] & GO_MODE_DIR):
                            raise ConfigurationError(f"download: {src} changed into a link or "
                                                     "another kind of file while it was read")
                        tar.extractall(work, filter="data")
                os.rename(os.path.join(work, posixpath.basename(source)), local)
        await asyncio.to_thread(get)

    def _sandbox_path(self, path: str) -> str:
        full = posixpath.normpath(posixpath.join(WORKSPACE, path))
        if not full.startswith(WORKSPACE + "/"):
            raise ConfigurationError(f"{path!r} is not below the sandbox's workspace {WORKSPACE}")
        if self.sandbox.container is None:
            raise CouldNotRunError(f"the {self.name} sandbox is not running", retryable=True)
        return full

    def _check_sandbox(self) -> None:
        """The workspace is a bind mount: it pins the directory the sandbox started with. If the
        host's workspace path now names another directory (renamed away, recreated), the
        sandbox would go on writing into the old one — fail closed instead."""
        if self.sandbox.mode == "copy":
            return  # the sandbox has its own copy; the base dir is only written at sync
        if self._workspace_id is not None and _identity(self.sandbox.workspace) != self._workspace_id:
            raise CouldNotRunError(f"the workspace {self.sandbox.workspace} was renamed, removed or "
                                   "replaced since the sandbox started", retryable=False)

    def _sandbox_gone(self) -> bool:
        if self.sandbox.mode == "copy":
            return self.sandbox.exited  # a dropped attach stream is not a dead sandbox
        channel = self.sandbox.channel
        return self._info is not None and (channel is None or not channel.alive)

    async def _explain(self, failure: CouldNotRunError) -> CouldNotRunError:
        channel = self.sandbox.channel
        if channel is not None and not channel.alive:
            if self.sandbox.mode == "copy":
                return await self.sandbox.after_drop(failure)
            return await self.sandbox.explain(failure)
        return failure

    async def _reconnect(self) -> None:
        channel = self.sandbox.channel
        if self.sandbox.mode == "copy" and self._info is not None and (
                channel is None or not channel.alive):
            await self.sandbox.reattach()
            if self.sandbox.exited:
                raise self._session_over(await self.sandbox.explain(None))

    async def open(self) -> SandboxInfo:
        self._check_open()
        async with self._opening:
            if self._info is None:
                # None when missing: the engine will say what is wrong with it
                self._workspace_id = _identity(self.sandbox.workspace)
                try:
                    self._info = await self.sandbox.start()
                except BaseException:
                    await self.sandbox.stop()
                    raise
        return self._info

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.sandbox.stop()


GO_MODE_DIR = 1 << 31  # os.ModeDir


def _no_link_on_the_way(engine: Engine, container: str, given: str, source: str
                        ) -> dict[str, Any]:
    """The engine's stat of ``source`` after checking that neither it nor any directory on
    the way below the workspace is a symbolic link."""
    parts = posixpath.relpath(source, WORKSPACE).split("/")
    found: dict[str, Any] | None = None
    for depth in range(1, len(parts) + 1):
        path = posixpath.join(WORKSPACE, *parts[:depth])
        found = engine.path_stat(container, path)
        if found is None:
            raise ConfigurationError(f"download: {given} does not exist in the sandbox")
        if int(found.get("mode", 0)) & GO_MODE_SYMLINK:
            what = "is" if depth == len(parts) else f"lies below {'/'.join(parts[:depth])}, which is"
            raise ConfigurationError(f"download: {given} {what} a symbolic link in the sandbox "
                                     f"(to {found.get('linkTarget') or '?'}); name the file or "
                                     "directory itself")
    assert found is not None
    return found


def resolve_mode(requested: WorkspaceMode, engine: Engine) -> Literal["bind", "copy"]:
    """``auto``: bind mounts for an engine on a unix socket (it runs on this machine and sees
    its filesystem), a copy for one reached over the network (``tcp://``, ``https://``,
    ``ssh://``) — such an engine may be anywhere. ``bind`` or ``copy`` overrides, e.g. ``copy`` for a local
    engine in a private mount namespace, ``bind`` for a TCP engine on this very machine."""
    if requested != "auto":
        return requested
    return "bind" if engine.address.is_local else "copy"


def _identity(path: str) -> tuple[int, int] | None:
    """Which directory a path names now (device, inode); None when it names nothing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
