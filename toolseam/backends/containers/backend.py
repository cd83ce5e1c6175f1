"""The backend both container engines present: a ``ContainerSandbox`` composed with the
agent's exec and file parts, its workspace mode (``MODES``) and its lifetime (``LIFETIMES``)
chosen once from the options (``containers/options.py``) — the one place a mode meets a
lifetime. Podman and docker differ only in the ``Engine`` they pass in."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import posixpath
import shlex
import tarfile
import tempfile
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from ...policy.environment import CONTAINER_BASE_ENV
from ...policy.limits import SandboxLimits
from ...seam.capabilities import (
    Branching,
    DurableSessions,
    EngineShell,
    ResourceUsage,
    SandboxKill,
    SandboxRootOwner,
    SandboxUsage,
    ShellAccess,
)
from ...seam.errors import ConfigurationError, CouldNotRunError
from ...seam.handle import SessionHandle
from ...seam.lifetime import EPHEMERAL, BackendLifetime, Durable, Ephemeral
from ...seam.models import SandboxInfo, SyncReport
from ...seam.protocol import WorkspaceTransfer
from ..agentlink.channel import AgentChannel
from ..agentlink.durable import DurableChannel, DurableMethods, the_durable
from ..agentlink.parts import AgentExec, AgentFiles
from ..composed import ComposedBackend
from ..snapshots.fork_base import FORK_BASES, ForkBase, fork_parent, overlay_paths_plain
from ..snapshots.manifest import Manifest
from .branching import ContainerBranching
from .engine.protocol import GO_MODE_SYMLINK, Engine, in_engine_thread
from .engine.sdk import SdkEngine
from .fork_image import ForkImage, fork_image_fits, layer_key, tmp_part
from .fork_overlay import ChildOverlay
from .labels import POOL_LABEL, WORKSPACE
from .layer import LayerNames
from .lifetimes.durable import DurableLifetime
from .lifetimes.ephemeral import EphemeralLifetime
from .modes.bind import BindMode, socket_owner
from .modes.copy import CopyMode
from .options import DEFAULT_IMAGE, ContainerOptions
from .sandbox import ContainerLifetime, ContainerSandbox, WorkspaceMode, WorkspaceModeImpl, fresh_session_id
from .usage import NOT_MEASURED, usage_from_stats

__all__ = ["DEFAULT_IMAGE", "LIFETIMES", "MODES", "ContainerBackend", "resolve_mode"]

# The workspace modes, by name, and the lifetimes, by the backend's ``lifetime`` option
# (seam/lifetime.py): a third of either is one new module (containers/modes/,
# containers/lifetimes/) and one row here; every mode works with every lifetime, composed in
# ``ContainerSandbox`` (docs/architecture.md).
MODES: dict[str, Callable[[ContainerOptions], WorkspaceModeImpl]] = {
    "bind": lambda options: BindMode(options.setid_files, *(
        (options.provisioning.mounts,) if options.provisioning else ())),
    "copy": lambda options: CopyMode(options.copy_bytes, options.copy_keep_group_write,
                                     options.setid_files),
}
LIFETIMES: dict[type, Callable[[Any], ContainerLifetime]] = {
    Ephemeral: EphemeralLifetime,
    Durable: DurableLifetime,
}


class ContainerBackend(ContainerBranching, DurableMethods, ComposedBackend):
    """One warm container per session. A configured container backend that cannot start fails
    the session (``CouldNotRunError``); it never falls back to the host."""

    fork_base: ForkBase | None = None  # kept from this session's last fork (decision 513)
    capabilities: ClassVar[frozenset[type]] = ComposedBackend.capabilities | {
        DurableSessions, Branching, EngineShell, SandboxKill, ResourceUsage, SandboxRootOwner,
        WorkspaceTransfer}

    agent_writes_resolv_conf = True  # composed.py: a container's own resolv.conf

    def __init__(self, engine: Engine, engine_name: str, workspace: str,
                 options: ContainerOptions) -> None:
        super().__init__(AgentFiles(self._agent), AgentExec(self._agent))
        self.name = engine_name
        self.options = options
        self._engine, self._workspace = engine, workspace
        self._opening = asyncio.Lock()
        mode = MODES[resolve_mode(options.workspace_mode, engine)](options)
        lifetime = LIFETIMES[type(options.lifetime)](options.lifetime)
        pooled = options.provisioning
        self.sandbox = ContainerSandbox(
            engine, engine_name, options.image, workspace, options.sandbox_hardening,
            dict(CONTAINER_BASE_ENV), mode, lifetime,
            enforce_limits=self.options.enforce_limits, pull_policy=self.options.pull,
            registry_auth=self.options.auth, on_pull_progress=self.options.on_pull_progress,
            agent_bundles=dict(self.options.agent_bundles),
            awaiting_workspace=pooled is not None,
            extra_labels={POOL_LABEL: pooled.pool_id} if pooled else {},
            session_id=options.session_id or fresh_session_id())
        self.liveness = mode.liveness(self.sandbox)

    @property
    def network(self) -> str:  # type: ignore[override]
        """The sandbox's network mode (the engine's network is ``limits.engine_network``)."""
        return self.sandbox.hardening.limits.network

    def _agent(self) -> AgentChannel:
        channel = self.sandbox.channel
        if channel is None:
            raise CouldNotRunError(f"the {self.name} sandbox is not running", retryable=True)
        return channel

    async def resource_usage(self) -> SandboxUsage:
        """``seam.capabilities.ResourceUsage``: the container's cgroup, as its engine reports
        it (``usage.py``); nothing measured before the start or after the end."""
        container = self.sandbox.container
        if container is None or self._closed:
            return NOT_MEASURED
        try:
            stats = await in_engine_thread(lambda: self.sandbox.engine.stats(container))
        except CouldNotRunError:
            return NOT_MEASURED
        return usage_from_stats(stats)

    def sandbox_root_uid(self) -> int | None:
        """``seam.capabilities.SandboxRootOwner``: the engine socket's owner, where the engine
        is on this machine (rootless podman maps the container's root to it)."""
        return socket_owner(self.sandbox.engine.endpoint)

    def kill_sandbox(self) -> None:
        """``seam.capabilities.SandboxKill``: the engine removes the container (its pid
        namespace goes with it); the session finds it gone at its next answer."""
        container = self.sandbox.container
        if container is not None and not self._closed:
            self.sandbox.engine.remove(container)

    @property
    def copy_back_error(self) -> CouldNotRunError | None:
        """Set when close could not bring the sandbox's changes home (the container is kept)."""
        return self.sandbox.copy_back_error

    @property
    def closed(self) -> bool:
        """Whether the session ended (its sandbox is gone: a sandbox serves one session)."""
        return self._closed

    @property
    def workspace_mode(self) -> Literal["bind", "copy"]:
        return self.sandbox.mode.name

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
            raise ConfigurationError(f"upload: {local} does not exist on this host (an "
                                     "upload's source is this machine's; its dest the sandbox's)")
        parent, name = posixpath.split(target)
        sandbox = self.sandbox
        container = sandbox.container
        assert container is not None

        def put() -> None:
            with tempfile.NamedTemporaryFile(prefix="toolseam-upload-") as archive:
                sandbox.mode.pack_upload(local, name, archive)
                archive.flush()
                sandbox.engine.put_archive(container, parent, archive)
                sandbox.mode.uploaded(archive.name, posixpath.relpath(parent, WORKSPACE)
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
            raise ConfigurationError(f"download: {local} already exists on this host (a "
                                     "download's target must be a new path here)")
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

    def shell_access(self, user: str | None = None) -> ShellAccess | None:
        """The engine's command line for a login shell in the container (``EngineShell``)."""
        container = self.sandbox.container
        if container is None:
            return None
        tool = "docker -H" if self.sandbox.engine_name.startswith("docker") else "podman --url"
        who = f" --user {shlex.quote(user)}" if user else ""
        return ShellAccess(container, f"{tool} {shlex.quote(self.sandbox.engine.endpoint)} "
                                      f"exec -it{who} {container} bash -l")

    def _sandbox_path(self, path: str) -> str:
        full = posixpath.normpath(posixpath.join(WORKSPACE, path))
        if not full.startswith(WORKSPACE + "/"):
            raise ConfigurationError(f"{path!r} is not below the sandbox's workspace {WORKSPACE}")
        if self.sandbox.container is None:
            raise CouldNotRunError(f"the {self.name} sandbox is not running", retryable=True)
        return full

    async def open(self) -> SandboxInfo:
        self._check_open()
        async with self._opening:
            if self._info is None:
                try:
                    self._info = await self.sandbox.start()
                    if self._layer_start is not None:  # a fork's child (branch_backend)
                        await self._open_layer(self._layer_start)
                        self._layer_start = None
                except BaseException:
                    self._info = None
                    await self.sandbox.stop()
                    raise
        return self._info

    async def _open_layer(self, start: Manifest) -> None:
        """A fork's child's layer made the snapshot's at its open: on the fork's start image
        only ``/tmp`` is left to write (a tmpfs no commit sees); else the whole layer."""
        if self._base_names is not None:
            start = tmp_part(start)
            if not _image_layer(start):
                container = self._running_container()
                await self._apply_restore(container, start, LayerNames([], [], []), None,
                                          None, [])
        elif not _image_layer(start):  # a new container's layer is the image's
            await self.restore_layer(start, diff=False)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.sandbox.stop()
        finally:
            if self.fork_base is not None:  # kept for a next fork that will not come
                await asyncio.shield(asyncio.to_thread(FORK_BASES.let_go, self))

    # --- branches (seam/capabilities.py: Branching; the snapshots: branching.py) -----------
    def branch_backend(self, workspace: str, snapshot_id: str) -> tuple[ContainerBackend, None]:
        """A new sandbox of this engine and these options, in copy mode (decision 401); not
        open. On an engine of this machine its ``/workspace`` is an overlay over the fork's
        base, restored once for all the fork's children (decision 507); elsewhere
        ``workspace`` is made the snapshot's tree first and copied in."""
        overlay = self._overlay_owner()
        if overlay is None:
            self.prefill_branch(workspace, snapshot_id)
        engine = self._engine
        assert isinstance(engine, SdkEngine)
        child = type(self).__new__(type(self))
        ContainerBackend.__init__(
            child, SdkEngine(engine.dialect, engine.endpoint, engine.tls), self.name, workspace,
            dataclasses.replace(self.options, workspace_mode="copy", provisioning=None,
                                lifetime=EPHEMERAL))
        manifest = self.fork_manifest(snapshot_id)
        if overlay is not None:
            # an open session keeps the base for its next fork (its close lets it go); a
            # template never opened (the remote server's) would never let it go
            holder = self if self._info is not None and not self._closed else None
            base = FORK_BASES.acquire(holder, manifest, *overlay, layer=layer_key(manifest))
            image = self._fork_image(base, manifest)
            mode = CopyMode(self.options.copy_bytes, self.options.copy_keep_group_write,
                            self.options.setid_files, ChildOverlay(base, image))
            child.sandbox.mode = mode
            child.liveness = mode.liveness(child.sandbox)
            child._base_names = None if image is None else image.names
        child._layer_start = manifest  # its writable layer, put back when it opens
        return child, None

    def _fork_image(self, base: ForkBase, manifest: Manifest) -> ForkImage | None:
        """The fork's start image on this engine, when the parent's layer outside /tmp can be
        one (decision 512): made once per fork, while its base is restored."""
        snapshot_id = manifest.id
        names = self._names_at[1] if self._names_at and self._names_at[0] == snapshot_id \
            else None
        if not fork_image_fits(manifest, names):
            return None
        assert names is not None
        engine = self._engine
        assert isinstance(engine, SdkEngine)
        key = (engine.endpoint, self.sandbox.image, layer_key(manifest))
        return base.image_for(key, lambda: ForkImage(
            SdkEngine(engine.dialect, engine.endpoint, engine.tls), self.sandbox.image,
            self.sandbox.hardening, manifest, names))

    def _overlay_owner(self) -> tuple[int | None, bool] | None:
        """``(uid, rootless)``: the uid the fork's base is given to (None: this process's)
        and whether the engine is rootless, when this session's children can be overlays
        (decision 507); else None. They can when the engine is on this
        machine and sees its directories (bind mode, or a child that is an overlay itself:
        a session the caller put in copy mode on a local socket may have an engine that does
        not), and its sandbox's root is a uid this process can give files to — its own, or
        any when it is root."""
        mode = self.sandbox.mode
        if not self.sandbox.engine.address.is_local or not (
                mode.shares_host_dir or getattr(mode, "overlay", None) is not None):
            return None
        root = socket_owner(self.sandbox.engine.endpoint)
        if root is None:
            return None
        owner = None if root == os.geteuid() else root
        if owner is not None and os.geteuid() != 0:
            return None  # a rootful engine's user that is not root: container root could
            # not change files this process owns, and it cannot give them away
        if not overlay_paths_plain(fork_parent(owner)):
            return None
        return owner, root != 0

    # --- sessions that outlive their client (seam/capabilities.py: DurableSessions) -------
    @property
    def lifetime(self) -> BackendLifetime:
        return self.options.lifetime

    @classmethod
    def from_handle(cls, handle: SessionHandle, options: dict[str, Any]) -> ContainerBackend:
        """The engine's kind (``PodmanBackend``, ``DockerBackend``) for the handle's
        container; ``options`` include the kind's variant's (``rootless``)."""
        if handle.network in ("bridge", "egress") and "limits" not in options:
            options = {**options, "limits": SandboxLimits(network=handle.network)}
        kind: Any = cls  # a subclass: it takes the workspace first, then keywords
        made: ContainerBackend = kind(handle.workspace, image=handle.image or "",
                                      endpoint=handle.endpoint,
                                      workspace_mode=handle.workspace_mode,
                                      lifetime=Durable.attaching(handle), **options)
        return made

    def durable_channel(self) -> DurableChannel:
        return the_durable(self.sandbox.channel)

    def durable_handle(self, session_id: str, secret: str) -> SessionHandle:
        sandbox, mode = self.sandbox, self._durable_mode()
        return SessionHandle(backend=self.name, endpoint=sandbox.engine.endpoint,
                             socket=mode.address,
                             sandbox=sandbox.container or "", workspace_mode=mode.name,
                             workspace=sandbox.workspace, image=sandbox.image,
                             session_id=session_id, secret=secret,
                             network=self.network)

    def _durable_mode(self) -> WorkspaceModeImpl:
        if not isinstance(self.options.lifetime, Durable):
            raise ConfigurationError(f"this {self.name} backend was built to end with its "
                                     "client (lifetime=Ephemeral): it has no handle and cannot "
                                     "detach")
        return self.sandbox.mode

    async def detach(self) -> None:
        await self._durable_mode().detach(self.sandbox)
        self._closed = True

    async def keep_backend_state(self) -> None:
        await self._durable_mode().keep_state(self.sandbox)  # copy mode's baseline


GO_MODE_DIR = 1 << 31  # os.ModeDir


def _image_layer(manifest: Manifest) -> bool:
    """Whether a snapshot's layer outside /workspace is what a new container of the image
    has: nothing but an empty ``/tmp`` of a new tmpfs's mode and no deleted name of the image — a
    parent that wrote nothing outside (the default read-only root with an empty /tmp). Its
    fork's children then skip the layer's restore: an upload and a run as the sandbox's root
    each (decision 507)."""
    return not manifest.layer_deleted and all(
        e.path == "tmp" and e.kind == "dir" and e.mode == 0o1777 for e in manifest.layer)


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
