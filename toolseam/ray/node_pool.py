"""The node actor's side of ``RayPool``: a warm ``SandboxPool`` of the node's own engine per
cluster pool; a claim is a remote session of the node's ``RemoteServer`` whose hosting takes a
warm sandbox of it (``node_remote.py``: the ``pool`` option) — its secret, its transport's
lease, the workspace copied in and home by the copy-back rule, as any remote session's.

A host-engine node keeps no warm sandboxes (a host session opens in milliseconds): a claim
there opens one as ``open`` does.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from ..backends.containers.pool.warm import ContainerPool
from ..seam.errors import HostError


class NodePools:
    """Mixed into ``NodeSessions`` (node.py)."""

    config: Any
    where: str

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

    def _warm_pool(self, pool_id: object) -> ContainerPool | None:
        """The pool a remote session's ``pool`` option names (``node_remote.py``); None: no
        pool asked, or a host node (which keeps none warm: its sessions open as any)."""
        if pool_id is None:
            return None
        pool = self._pools.get(str(pool_id))
        if pool is None and self.config.contained:
            raise HostError(f"no pool {str(pool_id)[:8]}… on {self.where}")
        return pool

    async def pool_close(self, pool_id: str) -> None:
        pool = self._pools.pop(pool_id, None)
        if pool is not None:
            await pool.close()
