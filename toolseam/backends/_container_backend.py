"""The backend both container engines present: a ``ContainerSandbox`` composed with the
agent's exec and file parts. Podman and docker differ only in the ``Engine`` they pass in."""

from __future__ import annotations

import asyncio
import dataclasses
import os

from ..policy.environment import CONTAINER_BASE_ENV
from ..policy.limits import SandboxLimits
from ..seam.errors import ConfigurationError, CouldNotRunError
from ..seam.models import SandboxInfo
from ._channel import AgentChannel
from ._container_sandbox import ContainerSandbox, Engine, Hardening
from ._parts import AgentExec, AgentFiles, ComposedBackend
from ._pull import PULL_POLICIES, PullCallback, PullPolicy

DEFAULT_IMAGE = "localhost/toolseam-sandbox:latest"


class ContainerBackend(ComposedBackend):
    """One warm container per session. A configured container backend that cannot start fails
    the session (``CouldNotRunError``); it never falls back to the host."""

    def __init__(self, engine: Engine, engine_name: str, image: str, workspace: str,
                 hardening: Hardening | None, limits: SandboxLimits | None = None,
                 pull: PullPolicy = "missing", auth: dict[str, str] | None = None,
                 on_pull_progress: PullCallback | None = None) -> None:
        if pull not in PULL_POLICIES:
            raise ConfigurationError(f"pull policy must be one of {', '.join(PULL_POLICIES)}, "
                                     f"got {pull!r}")
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
                                        on_pull_progress=on_pull_progress)
        self._opening = asyncio.Lock()
        self._workspace_id: tuple[int, int] | None = None

    def _agent(self) -> AgentChannel:
        channel = self.sandbox.channel
        if channel is None:
            raise CouldNotRunError(f"the {self.name} sandbox is not running", retryable=True)
        return channel

    def _check_sandbox(self) -> None:
        """The workspace is a bind mount: it pins the directory the sandbox started with. If the
        host's workspace path now names another directory (renamed away, recreated), the
        sandbox would go on writing into the old one — fail closed instead."""
        if self._workspace_id is not None and _identity(self.sandbox.workspace) != self._workspace_id:
            raise CouldNotRunError(f"the workspace {self.sandbox.workspace} was renamed, removed or "
                                   "replaced since the sandbox started", retryable=False)

    def _sandbox_gone(self) -> bool:
        channel = self.sandbox.channel
        return self._info is not None and (channel is None or not channel.alive)

    async def _explain(self, failure: CouldNotRunError) -> CouldNotRunError:
        channel = self.sandbox.channel
        if channel is not None and not channel.alive:
            return await self.sandbox.explain(failure)
        return failure

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


def _identity(path: str) -> tuple[int, int] | None:
    """Which directory a path names now (device, inode); None when it names nothing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
