"""``toolseam.SandboxPool``: the container wing's warm pool (``backends/containers/pool/warm.py``)
with what needs the session layer — a ``Toolkit`` on a handed-out sandbox, and hand-outs that
start from a snapshot (``snapshot=``: ``pool_workspaces.py``, docs/pool.md). Kept here so the
backends never import the session (the import contract, ``.importlinter``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any, Self

from ..backends.containers.backend import ContainerBackend
from ..backends.containers.host_dirs import check_pool_base_dir
from ..backends.containers.modes.bind import socket_owner
from ..backends.containers.pool.warm import BackendFactory, ContainerPool
from ..backends.snapshots import Snapshot
from ..observability.hook import pool_claim
from ..policy.limits import SandboxLimits
from ..policy.settings import Settings, parse_settings
from ..seam.errors import ConfigurationError
from .pool_workspaces import WarmWorkspaces, checked_snapshot
from .toolkit import Toolkit, open_toolkit

__all__ = ["SandboxPool"]

_SNAPSHOT_DOC = """
    ``snapshot=snap`` (a ``toolseam.Snapshot`` or its id; a wrong one is a
    ``ConfigurationError`` naming it, here): every hand-out starts with exactly the snapshot's
    files. Without a ``base_dir`` each gets a private workspace made the snapshot's tree before
    it was asked for (``size`` of them kept ready), removed when its session closes; with one,
    that directory is made the snapshot's tree first. A sandbox and its workspace serve one
    session and are discarded after it (decision 435): nothing one session changed reaches
    the next hand-out.
"""


class SandboxPool(ContainerPool):
    __doc__ = (ContainerPool.__doc__ or "") + _SNAPSHOT_DOC

    def __init__(self, backend_class: BackendFactory, *, snapshot: Snapshot | str | None = None,
                 size: int = 4, refill_concurrency: int = 4, refill: bool = True,
                 **backend_options: Any) -> None:
        start = None if snapshot is None else checked_snapshot(snapshot)  # before anything
        super().__init__(backend_class, size=size, refill_concurrency=refill_concurrency,
                         refill=refill, **backend_options)
        self.snapshot: Snapshot | None = start
        self._workspaces = None if start is None else \
            WarmWorkspaces(start, size, refill, self._files_owner())
        self._private: list[tuple[ContainerBackend, str]] = []  # handed-out workspaces

    def _files_owner(self) -> int | None:
        """Root binding for a rootless engine: its user is the sandbox's root, so a warm
        workspace's files are given to it (as a bind-mode restore's are, decision 403)."""
        if os.geteuid() != 0:
            return None
        sandbox = self._class(os.getcwd(), **self._options).sandbox  # the pool's mode chosen
        if not sandbox.mode.shares_host_dir:
            return None
        owner = socket_owner(sandbox.engine.endpoint)
        return owner if owner not in (None, 0) else None

    @property
    def warm_workspaces(self) -> int:
        """Private workspaces holding the snapshot's tree, ready to hand out (0 without one)."""
        return 0 if self._workspaces is None else self._workspaces.ready_count

    async def start(self) -> Self:
        await super().start()
        if self._workspaces is not None:
            self._workspaces.start()
        return self

    async def wait_full(self) -> None:
        """Until ``size`` sandboxes are warm — and, with a snapshot, ``size`` workspaces hold
        its tree; raises the failure if one could not start or be filled."""
        await super().wait_full()
        if self._workspaces is not None:
            await self._workspaces.wait_full()

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            if self._workspaces is not None:
                await self._workspaces.close()
            private, self._private = self._private, []
            for _, path in private:  # a session still open then: its sandbox is gone too
                await WarmWorkspaces.remove(path)

    async def backend(self, base_dir: str | os.PathLike[str] | None = None
                      ) -> ContainerBackend:
        """A warm sandbox with ``base_dir`` as its workspace (a pool with a snapshot: that
        directory made the snapshot's tree first; without one, a private workspace holding
        it, removed once the backend is closed and the pool hands out again, or closes)."""
        backend, _ = await self._hand_out(base_dir)
        return backend

    async def _hand_out(self, base_dir: str | os.PathLike[str] | None
                        ) -> tuple[ContainerBackend, str | None]:
        if self._workspaces is None:
            if base_dir is None:
                raise ConfigurationError("a hand-out needs a base_dir (the host directory the "
                                         "sandbox sees as /workspace) unless the pool was "
                                         "made with snapshot=")
            return await super().backend(base_dir), None
        await self._sweep()
        if base_dir is not None:
            workspace = os.path.abspath(os.path.expanduser(os.fspath(base_dir)))
            check_pool_base_dir(workspace)  # said before the snapshot is written there
            await self._workspaces.restore_into(workspace)
            return await super().backend(workspace), None
        private = await self._workspaces.take()
        try:
            backend = await super().backend(private)
        except BaseException:
            await asyncio.shield(WarmWorkspaces.remove(private))
            raise
        self._private.append((backend, private))
        return backend, private

    async def _sweep(self) -> None:
        """Remove the private workspaces of hand-outs whose sandbox has closed."""
        done = [(b, p) for b, p in self._private if b.closed]
        self._private = [(b, p) for b, p in self._private if not b.closed]
        for _, path in done:
            await WarmWorkspaces.remove(path)

    async def toolkit(self, base_dir: str | os.PathLike[str] | None = None, *,
                      settings: Settings | Mapping[str, Any] | None = None,
                      **toolkit_kwargs: Any) -> Toolkit:
        """An open ``Toolkit`` on a warm sandbox with ``base_dir`` as its workspace (at
        ``/workspace`` inside; a pool with a snapshot: see ``backend``, the private workspace
        removed when the ``Toolkit`` closes); ``toolkit_kwargs`` are the Toolkit's other
        parameters (``tools``, ``env_extra``, ``on_output`` …). ``settings.limits``, when set,
        must be the pool's: a sandbox's limits are fixed when it starts."""
        for taken in ("backend", "backend_options", "snapshot"):
            if taken in toolkit_kwargs:
                raise ConfigurationError(f"pool.toolkit: {taken} is the pool's")
        if settings is not None and not isinstance(settings, Settings):
            settings = parse_settings(dict(settings))
        if settings is not None and not settings.limits.is_default and \
                settings.limits != (self.limits or SandboxLimits()):
            raise ConfigurationError(
                "settings.limits differ from the pool's: a pooled sandbox's limits are fixed "
                "when it starts; give them to the pool (SandboxPool(..., limits=...))")
        with pool_claim(self.pool_id, self.ready_count):
            backend, private = await self._hand_out(base_dir)
        try:
            return await open_toolkit(backend, settings=settings, private_workspace=private,
                                      **toolkit_kwargs)
        except BaseException:
            if private is not None:
                await asyncio.shield(WarmWorkspaces.remove(private))
            raise
