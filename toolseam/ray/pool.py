"""``RayPool``: a warm pool spread over a Ray cluster — a ``SandboxPool`` of its own engine on
every fitting node, sized by that node's CPUs; claims go to the node with the most warm
sandboxes left (nodes that had the image before the pool started first), so a burst spreads.

    async with RayPool(image=…, size=32, address=…) as pool:
        async with await pool.toolkit(base_dir) as tk:   # an open Toolkit, a remote session
            ...
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any, Self, cast

from ..backends.remote import HostedSpec, RemoteBackend
from ..backends.remote.spec import PLACED
from ..policy.limits import SandboxLimits
from ..seam.errors import ConfigurationError, HostError
from ..seam.protocol import BuiltinExec
from ..session.toolkit import open_toolkit
from . import cluster
from .actors import node_actor
from .node_remote import DEFAULT_ORPHAN_TIMEOUT_S
from .placement import Placement
from .transport import RayTransport


class RayPool:
    """``size`` warm sandboxes over the nodes whose resources include ``resources``, each
    node's share in proportion to its CPUs (at least one)."""

    def __init__(self, *, image: str | None = None, size: int = 8,
                 resources: dict[str, float] | None = None, address: str | None = None,
                 limits: SandboxLimits | None = None,
                 orphan_timeout_s: float = DEFAULT_ORPHAN_TIMEOUT_S, refill: bool = True) -> None:
        if size < 1:
            raise ConfigurationError(f"pool size must be at least 1, got {size}")
        self.image, self.size, self.limits = image, size, limits
        self.resources = dict(resources or {})
        self.address, self.orphan_timeout_s, self.refill = address, orphan_timeout_s, refill
        self.pool_id = uuid.uuid4().hex  # also what lets a caller claim: never printed
        self._nodes: dict[str, dict[str, Any]] = {}  # node id -> share, warm, has_image
        self._claims: dict[str, int] = {}
        self._lock = asyncio.Lock()
        self._closed = False

    async def start(self) -> Self:
        if self._nodes:
            return self
        ray = await asyncio.to_thread(cluster.connect, self.address)
        nodes = await asyncio.to_thread(cluster.fitting_nodes, ray, self.resources)
        cpus = {str(n["NodeID"]): max(1.0, float(n["Resources"].get("CPU", 1))) for n in nodes}
        total = sum(cpus.values())
        shares = {node: max(1, round(self.size * c / total)) for node, c in cpus.items()}
        answers = await asyncio.gather(*(
            node_actor(ray, node).pool_start.remote(self.pool_id, self.image,
                                                            self.limits, share, self.refill)
            for node, share in shares.items()))
        for (node, share), answer in zip(shares.items(), answers, strict=True):
            self._nodes[node] = {"share": share, "has_image": answer["has_image"],
                                 "where": answer["where"]}
            self._claims[node] = 0
        return self

    async def wait_full(self) -> None:
        """Until every node's share is warm."""
        await self.start()
        ray = cluster.ray_module()
        await asyncio.gather(*(node_actor(ray, node).pool_wait.remote(self.pool_id)
                               for node in self._nodes))

    def _choose(self) -> str:
        """The node with the most of its share left unclaimed; a node that had the image
        before wins a tie (its refills start without a pull)."""
        return max(self._nodes, key=lambda n: (self._nodes[n]["share"] - self._claims[n],
                                               self._nodes[n]["has_image"], n))

    async def backend(self, base_dir: str | os.PathLike[str] | None = None) -> RemoteBackend:
        """An open remote session on a warm sandbox of the chosen node, with ``base_dir``
        copied there and home by the copy-back rule (none: an empty workspace): the node's
        ``RemoteServer`` hosts it from its pool (``node_pool.py``); a lost node fails the
        claim."""
        if self._closed:
            raise HostError("the Ray pool was closed")
        await self.start()
        async with self._lock:
            node = self._choose()
            self._claims[node] += 1
        options: dict[str, Any] = {"pool": self.pool_id}
        if self.image:
            options["image"] = self.image
        if self.limits is not None:
            options["limits"] = self.limits.model_dump(mode="json")
        made = RemoteBackend(
            transport=RayTransport(Placement({}, node=node, fresh=True), self.address,
                                   orphan_timeout_s=self.orphan_timeout_s),
            hosted=HostedSpec(kind=PLACED, options=options),
            workspace=os.fspath(base_dir) if base_dir is not None else None)
        made.network = self.limits.network if self.limits is not None else "none"
        try:
            await made.open()
        except BaseException:
            await made.close()
            raise
        return made

    async def toolkit(self, base_dir: str | os.PathLike[str] | None = None,
                      **toolkit_kwargs: Any) -> Any:
        """An open ``Toolkit`` on a warm sandbox of the pool."""
        return await open_toolkit(cast(BuiltinExec, await self.backend(base_dir)),
                                  **toolkit_kwargs)

    def claims(self) -> dict[str, int]:
        """Claims per node (by the node's description), for placement checks."""
        return {self._nodes[n]["where"]: c for n, c in self._claims.items()}

    async def close(self) -> None:
        """Remove every sandbox of the pool, warm or handed out, on every node."""
        if self._closed:
            return
        self._closed = True
        ray = cluster.ray_module()
        await asyncio.gather(*(node_actor(ray, node).pool_close.remote(self.pool_id)
                               for node in self._nodes), return_exceptions=True)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.close()
