"""The node actor: one per Ray node, hosting every toolseam session of that node as an
ordinary local backend through its ``RemoteServer`` (``node_remote.py``; memory per sandbox is
what it is locally; one worker process per node, not per sandbox) — ``RayBackend``'s,
``RayPool``'s claims and ``integrations/ray_sandbox.py``'s Ray-shaped sandboxes alike.

Every session answers only the holder of its secret (compared in constant time against its
key): another job of the cluster can find this actor by name and call it, but cannot drive,
read or end a session it was not handed. A session whose holder stops renewing it for its
orphan timeout is closed (its containers removed) — a driver killed with SIGKILL loses nothing
before that, and leaves nothing after.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import time
from typing import Any

from ..backends import engine_for
from ..backends.containers.janitor import janitor
from ..seam.errors import HostError
from .direct import Answer, NodeServer, refused
from .identity import KV_NAMESPACE, kv_key
from .node_config import NodeConfig, own_workdir, sweep_dead_roots
from .node_observe import NodeTelemetry
from .node_operator import NodeOperatorView
from .node_pool import NodePools
from .node_remote import REMOTE, REMOTE_LIVE, NodeRemote


class NodeSessions(NodePools, NodeOperatorView, NodeRemote):
    """The node actor's body (made a Ray actor class in ``actors.py``)."""

    def __init__(self) -> None:
        self._pools_init()
        self._operator_init()
        self.config = NodeConfig.from_env()
        import ray  # only ever made inside a Ray worker
        self.node_id = ray.get_runtime_context().get_node_id()
        self.where = f"node {self.config.name} ({self.node_id[:12]}, {self.config.describe()})"
        self._reaper: asyncio.Task[None] | None = None
        self._direct: NodeServer | None = None
        self._direct_at: tuple[str, int] | None = None
        self._node_key: bytes | None = None  # what this actor proves to drivers (identity.py)
        self.actor_id = ray.get_runtime_context().get_actor_id() or ""
        self.telemetry = NodeTelemetry(self.node_id, self.config.name, self.config.engine)

    async def bind_key(self, key: bytes) -> Answer:
        """The node key, from the driver that created this actor (its first call; identity.py).
        Once bound it stays: a later, different key is refused."""
        if self._node_key is None and isinstance(key, bytes) and len(key) == 32:
            self._node_key = key
        if self._node_key is None or not hmac.compare_digest(self._node_key, key):
            return refused(HostError(f"{self.where} holds another node key"))
        return ("ok", None)

    def _identity(self) -> tuple[bytes, str] | None:
        return None if self._node_key is None else (self._node_key, self.actor_id)

    async def ready(self) -> dict[str, Any]:
        """Who this node is; the first call also removes what a previous actor of this machine
        left (containers whose owning process is gone — the janitor's rule) and starts the
        orphan reaper."""
        if self._reaper is None:
            self._reaper = asyncio.ensure_future(self._reap())
            with contextlib.suppress(Exception):  # an engine that is down answers at open
                await asyncio.to_thread(self._janitor)
            await asyncio.to_thread(sweep_dead_roots, self._workdir())
            await self._listen()
        return {"node_id": self.node_id, "name": self.config.name, "engine": self.config.engine,
                "where": self.where, "pid": os.getpid(),
                "direct": self._direct_at}

    async def _listen(self) -> None:
        """The direct path for tool calls (direct.py), on the node's Ray address; a node that
        cannot listen serves every call through Ray."""
        import ray
        host = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        server = NodeServer(self.call_held, self._key_for, self._identity)
        try:
            self._direct_at = (host, await server.start(host))
            self._direct = server
        except OSError:
            self._direct_at = None
            return
        # where a driver that did not create this actor asks it to prove its key; anyone can
        # write this entry, and a wrong one only makes the proof fail (identity.py)
        from ray.experimental import internal_kv
        await asyncio.to_thread(internal_kv._internal_kv_put, kv_key(self.actor_id),
                                f"{host}:{self._direct_at[1]}", namespace=KV_NAMESPACE)

    def _janitor(self) -> None:
        if not self.config.contained:
            return
        kind = self.config.kind
        janitor(engine_for(kind.name, self.config.options.get("endpoint"),
                           **kind.variant_options(self.config.engine)))

    def _key_for(self, sid: str) -> bytes | None:
        """A session's key, for a direct connection's proofs (direct.py); None: no session."""
        return self._remote_key(sid)

    async def call_held(self, sid: str, method: str, args: tuple[Any, ...],
                        trace: Any = None) -> Answer:
        """A call on the direct port of session ``sid``, whose holder proved its key
        (direct.py): a remote session's request, or a Ray-shaped sandbox's call; ``trace``:
        the caller's span's context, when it traces (a ``TraceContext`` the codec validated)."""
        if method == REMOTE:  # a remote session's request, spanned by its op (node_remote.py)
            return await self.remote_direct(sid, args, trace)
        if method == REMOTE_LIVE:  # a step of a remote session's streamed request
            return await self.remote_live_direct(sid, args, trace)
        return refused(HostError(f"{method!r} is not a seam call"))

    async def stats(self) -> dict[str, Any]:
        """Counts, this process's memory and CPU seconds (for the benchmark); no session is
        named."""
        import psutil
        me = psutil.Process()
        info, cpu = me.memory_full_info(), me.cpu_times()
        return {"rss": info.rss, "uss": info.uss,
                "remote_sessions": 0 if self._remote_server is None else self._remote_server.sessions,
                "cpu_s": cpu.user + cpu.system,
                "warm": sum(pool.warm for pool in self._pools.values())}

    # --- orphans -------------------------------------------------------------------------
    async def _reap(self) -> None:
        """End the sessions of what nobody renewed for its orphan timeout, or past its end."""
        while True:
            await asyncio.sleep(1.0)
            with contextlib.suppress(Exception):  # a remote session's close never stops this
                await self._reap_remote(time.monotonic())

    def _workdir(self) -> str:
        return own_workdir(self.config.workdir)
