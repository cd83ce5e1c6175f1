"""The node actor's side of ``RayPool``: a warm ``SandboxPool`` of the node's own engine per
cluster pool, and claims from it that become ordinary sessions of the node (their secret, their
orphan timeout, the workspace in as a tar, back by the copy-back rule).

A host-engine node keeps no warm sandboxes (a host session opens in milliseconds): a claim
there opens one as ``open`` does.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from typing import Any

from ..backends.containers.pool.warm import ContainerPool
from ..seam.errors import CouldNotRunError, HostError
from ._wire import Answer, encode
from .node_session import NodeSession, extract_archive, secret_hash, session_root


class NodePools:
    """Mixed into ``NodeSessions`` (node.py)."""

    config: Any
    where: str
    _sessions: dict[str, Any]

    def _pools_init(self) -> None:
        self._pools: dict[str, Any] = {}

    def _workdir(self) -> str:  # node.py
        raise NotImplementedError

    async def pool_start(self, pool_id: str, image: str | None, limits: Any,
                         size: int, refill: bool = True) -> dict[str, Any]:
        """Begin warming ``size`` sandboxes; says whether the image was here already."""
        if not self.config.contained or pool_id in self._pools:
            return {"warm": 0, "has_image": True, "where": self.where}
        backend_class, options = self.config.container_factory(image, limits)
        options["workspace_mode"] = "copy"  # the node dir is a staging area only
        pool = ContainerPool(backend_class, size=max(1, size), refill=refill, **options)
        probe = backend_class(os.getcwd(), **options).sandbox
        has_image = await asyncio.to_thread(probe.engine.image_exists, probe.image)
        self._pools[pool_id] = pool
        await pool.start()
        return {"warm": pool.warm, "has_image": has_image, "where": self.where}

    async def pool_status(self, pool_id: str) -> dict[str, int]:
        pool = self._pools.get(pool_id)
        return {"warm": 0, "starting": 0} if pool is None else {
            "warm": pool.warm, "starting": pool.starting}

    async def pool_wait(self, pool_id: str) -> None:
        pool = self._pools.get(pool_id)
        if pool is not None:
            await pool.wait_full()

    async def pool_claim(self, pool_id: str, sid: str, secret: str, archive: bytes | None,
                         orphan_timeout: float, image: str | None, limits: Any) -> Answer:
        """A warm sandbox of the pool with this workspace, as a session of this node."""
        pool = self._pools.get(pool_id)
        if pool is None and self.config.contained:
            return encode(HostError(f"no pool {pool_id[:8]}… on {self.where}"))
        if sid in self._sessions:
            return encode(HostError(f"session {sid[:8]}… exists on {self.where}"))
        root = session_root(self._workdir(), sid)
        workspace = os.path.join(root, "workspace")
        try:
            os.mkdir(workspace, 0o755)
            if archive:
                await asyncio.to_thread(extract_archive, archive, workspace)
            if pool is None:
                backend = self.config.make(workspace, image, limits)
                info = await backend.open()
            else:
                backend = await pool.backend(workspace)
                info = await backend.open()
        except CouldNotRunError as exc:
            shutil.rmtree(root, ignore_errors=True)
            return encode(CouldNotRunError(f"{self.where}: {exc.reason}", exc.retryable))
        except Exception as exc:  # noqa: BLE001 - every failure is an answer
            shutil.rmtree(root, ignore_errors=True)
            return encode(exc)
        self._sessions[sid] = NodeSession(secret_hash(secret), backend, root, orphan_timeout)
        return ("ok", info)

    async def pool_close(self, pool_id: str) -> None:
        pool = self._pools.pop(pool_id, None)
        if pool is not None:
            await pool.close()
