"""The remote backend's wire through a Ray cluster (``backends/remote/transport.py``): placement
chooses a node, that node's actor hosts a ``RemoteServer`` (``node_remote.py``), and each
request is one actor call carrying the restricted codec's bytes — Ray's own serialization of a
model or a tuple costs 0.3-0.5 ms a time, bytes nothing measurable (decision 310), and the
answer is decoded here as data, never as classes a node names (issue 44).

Once its session is open, a ``call`` goes on the node actor's direct port instead
(``direct.py``, decision 312: an empty Ray call costs 0.9-1.8 ms here, over the budget of
"local + 1 ms"), whose handshake proves the session's key both ways before anything is
decoded; where that port cannot be reached the calls stay on Ray. A ``stream`` request is a
long poll on the same route (``streaming.py``): its events reach the caller while it runs on
the node, batch by batch, every one before the answer; a short command is one round trip. A
lost node or actor under a call is ``TransportLost``: the session's end, never retried.
"""

from __future__ import annotations

import asyncio
import pickle
import uuid
from typing import Any

from ..backends.remote.codec import dumps, loads
from ..backends.remote.handshake import derived_key
from ..backends.remote.server import SESSION_LABEL
from ..backends.remote.transport import Answer, OnEvent, Request, TransportLost
from ..observability.across import outgoing
from ..seam.errors import ConfigurationError, CouldNotRunError
from ..seam.models import TraceContext
from . import cluster
from .direct import DirectLink, Dropped
from .node_remote import DEFAULT_ORPHAN_TIMEOUT_S, REMOTE, REMOTE_LIVE
from .placement import Placement, released
from .streaming import Batch, follow

DROP_PROBE_S = 5.0  # a dropped direct connection: how long the node actor may take to answer


class RayTransport:
    """``RayTransport(Placement(resources={…}), address=…)``: the sessions of one client on the
    node placement chooses, at the first call."""

    same_machine = False

    def __init__(self, placement: Placement, address: str | None = None,
                 direct: bool = True, orphan_timeout_s: float = DEFAULT_ORPHAN_TIMEOUT_S
                 ) -> None:
        """``orphan_timeout_s``: how long the node keeps this transport's sessions after the
        last word from it (renewed every third of it while this process lives)."""
        self.placement, self.address = placement, address
        self.owner = uuid.uuid4().hex  # this transport's sessions on the node, ended at close
        self.where = "a Ray node (not placed yet)"
        self.node_id: str | None = None
        self._actor: Any = None
        self._ray: Any = None
        self._placing = asyncio.Lock()
        self._closed = False
        self._direct = direct
        self.orphan_timeout_s = orphan_timeout_s
        self._renewing: asyncio.Task[None] | None = None
        self._link: DirectLink | None = None
        self._opened: str | None = None  # the session whose open this transport carried

    async def _placed(self) -> Any:
        if self._actor is not None:
            return self._actor
        if self._closed:
            raise TransportLost(f"{self.where}: the transport was closed", sent=False)
        async with self._placing:
            if self._actor is None:
                try:
                    ray = self._ray = cluster.ray_module()
                    if ray.is_initialized():  # the usual case: no thread hop per session
                        cluster.connect(self.address)
                    else:
                        await asyncio.to_thread(cluster.connect, self.address)
                    node_id, actor = await asyncio.to_thread(self.placement.reach, ray)
                    self.where = await cluster.node_where(node_id, _ready(actor))
                except CouldNotRunError as exc:
                    if self.placement.node is None:  # none fits: a refusal, said as such
                        raise
                    raise TransportLost(f"no Ray node for this session: {exc}",
                                        sent=False) from None
                self.node_id, self._actor = node_id, actor
                self._renewing = asyncio.ensure_future(self._renew())
        return self._actor

    async def _ray_call(self, call: Any, *args: Any) -> Any:
        """One call of the node actor's (``remote_call`` or ``remote_live``) carrying bytes;
        its answer decoded as data."""
        actor = await self._placed()
        ref = getattr(actor, call).remote(*args, self.owner, self.orphan_timeout_s)
        try:
            payload = await ref
        except asyncio.CancelledError:
            self._ray.cancel(ref)  # an async actor call is cancelled in the node's loop
            raise
        except cluster.ray_failures(self._ray) as exc:
            cluster.forget_actor(self.node_id or "", lost=True)
            raise TransportLost(f"{self.where} was lost ({type(exc).__name__})") from None
        try:
            return loads(payload) if isinstance(payload, bytes) else None
        except (pickle.UnpicklingError, EOFError, ValueError) as exc:
            raise CouldNotRunError(f"{self.where} answered what is not a toolseam answer "
                                   f"({exc})", retryable=False, cause="agent_failed") from None

    @property
    def direct_connected(self) -> bool:
        """Calls go on the node's direct port now (not through Ray)."""
        return self._link is not None and self._link.alive

    async def call(self, request: Request) -> Answer:
        trace = outgoing()  # the node's spans continue the caller's trace (decision 390)
        link = await self._linked(request) if self._direct else None
        if link is not None:
            try:
                answer = await link.call(REMOTE, (request, self.owner), trace)
            except Dropped:
                raise await self._dropped() from None
            return answer[1] if answer[:1] == ("ok",) else answer
        answer = await self._ray_call("remote_call", dumps((request, trace)))
        answer = answer if isinstance(answer, tuple) else ()  # refused by the client
        if request[2] == "open" and answer[:1] == ("ok",):
            self._opened = request[0]
        return answer

    async def _linked(self, request: Request) -> DirectLink | None:
        """The direct connection of the session this transport opened, made at its first call
        after the open; None where the node has no direct port or it cannot be reached."""
        if self._link is not None:
            return self._link if self._link.alive else None
        if self._opened is None or request[0] != self._opened or self.node_id is None:
            return None
        at = cluster.node_direct(self.node_id)
        if at is None:
            return None
        self._link = await DirectLink.connect(at[0], at[1], request[0],
                                              derived_key(request[1], SESSION_LABEL))
        if self._link is None:  # unreachable from here: later sessions do not wait for it
            cluster.no_direct(self.node_id)
        return self._link

    async def _dropped(self) -> TransportLost:
        """The direct connection ended under a call: the node actor gone (or silent for
        ``DROP_PROBE_S``) is the session's end, as on the Ray path; there, only this call
        failed (it may have run) and the next goes through Ray."""
        gone: tuple[type[BaseException], ...] = (TimeoutError, *cluster.ray_failures(self._ray))
        try:
            await asyncio.wait_for(self._actor.ready.remote(), DROP_PROBE_S)
        except gone as exc:
            cluster.forget_actor(self.node_id or "", lost=True)
            return TransportLost(f"{self.where} was lost ({type(exc).__name__})")
        return TransportLost(f"the direct connection to {self.where} dropped",
                             server_gone=False)

    async def stream(self, request: Request, on_event: OnEvent) -> Answer:
        """A long poll of the node (``streaming.py``): each batch of events to ``on_event``
        as it comes, while the call runs there; then its answer."""
        stream, trace = uuid.uuid4().hex, outgoing()
        return await follow(lambda: self._stream_step("begin", stream, request, trace),
                            lambda: self._stream_step("next", stream, request),
                            lambda: self._stream_step("cancel", stream, request), on_event)

    async def _stream_step(self, step: str, stream: str, request: Request,
                           trace: TraceContext | None = None) -> Batch:
        """One step of a streamed request, on the route the session's calls take (its
        ``begin`` with the caller's trace context)."""
        link = await self._linked(request) if self._direct else None
        given = request if step == "begin" else None
        if link is not None:
            try:
                answer = await link.call(REMOTE_LIVE, (step, stream, given, self.owner), trace)
            except Dropped:
                raise await self._dropped() from None
            batch = answer[1] if answer[:1] == ("ok",) else ([], answer)
        else:
            batch = await self._ray_call("remote_live", dumps((step, stream, request[0],
                                                                request[1], given, trace)))
        if not (isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[0], list)):
            return [], ()  # refused by the client as "not a toolseam answer"
        return batch

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.orphan_timeout_s / 3)
            try:
                await self._actor.remote_touch.remote(self.owner, self.orphan_timeout_s)
            except Exception:  # noqa: BLE001 - a lost node says so at the next call
                return

    async def close(self) -> None:
        """End this client's sessions on the node (as a socket's end does). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.node_id is not None and self.placement.node is None:
            released(self.node_id)  # chosen by spread or pack: its place is free
        if self._renewing is not None:
            self._renewing.cancel()
        if self._link is not None:
            self._link.close()
        if self._actor is not None:
            try:
                await self._actor.remote_drop.remote(self.owner)
            except cluster.ray_failures(self._ray):
                pass  # the node is gone, and its sessions with it

    def another(self) -> RayTransport:
        """A fork's child: wherever the same placement puts it (another node, with spread)."""
        return RayTransport(Placement(dict(self.placement.resources), self.placement.strategy),
                            self.address, self._direct, self.orphan_timeout_s)

    # --- a durable session's handle (backends/remote/durable.py, decision 477) --------------
    def durable_address(self) -> str:
        """``ray:NODE[@CLUSTER]``: the node this transport reached (and the cluster's address
        when one was given), so an attach from another driver reaches the same node actor."""
        if self.node_id is None:
            raise ConfigurationError("a Ray transport has an address once it reached its node")
        return f"ray:{self.node_id}" + (f"@{self.address}" if self.address else "")

    @classmethod
    def at_address(cls, rest: str) -> RayTransport:
        """The transport to the node a handle's ``ray:NODE[@CLUSTER]`` names: placed on that
        node alone (one that is gone is named by the attach's error, never replaced)."""
        node, _, address = rest.partition("@")
        if not (16 <= len(node) <= 128 and all(c in "0123456789abcdef" for c in node)):
            raise ConfigurationError(f"session handle: ray:{rest} does not name a Ray node")
        return cls(Placement({}, node=node), address or None)


async def _ready(actor: Any) -> Any:
    """The actor's ``ready`` answer (asked only when ``node_where`` awaits it)."""
    return await actor.ready.remote()
