"""The node actor's ``RemoteServer`` (``backends/remote/server.py``): the node's own engine
hosts the sessions of ``RayTransport`` clients (``transport.py``), every seam operation and
capability the remote backend forwards included — no Ray-specific forwarder.

The node, not the caller, decides what runs here (``node_config.py``): a spec's kind must be
the node's engine kind, its ``image`` and ``limits`` are taken, and the backend works in a
private directory of the node's, removed with the session. A request crosses as the codec's
bytes and is decoded as data; an answer goes back with the events a ``stream`` request
emitted. A transport's sessions end when it closes (``remote_drop``), or when it has not been heard
from for its orphan timeout (a driver killed: its transport renews a lease, ``remote_touch``,
every third of it) — nothing of a dead driver stays running.

After its open, a session's requests may come on the node's direct port instead
(``direct.py``: its handshake proves the session's key before anything is decoded), as the
call ``REMOTE`` whose arguments are the request and the transport's id. A streamed request
(``start`` with live output, the egress event stream) is a long poll on either route
(``streaming.py``): ``begin`` answers its first batch of events, each ``next`` the following
one, the last with the answer; ``cancel`` ends it.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

from ..backends.agentlink.errors import error_answer
from ..backends.remote.codec import dumps, loads
from ..backends.remote.handshake import derived_key
from ..backends.remote.kept_answers import ARRIVAL_S, KEPT_S, KeptAnswers
from ..backends.remote.server import SESSION_LABEL, RemoteServer
from ..backends.remote.spec import PLACED, HostedSpec
from ..policy.limits import SandboxLimits
from ..seam.errors import ConfigurationError, HostError
from ..seam.models import TraceContext
from ..seam.protocol import BuiltinExec
from .direct import Answer, refused, trace_context
from .node_config import WORKSPACE_DIR, NodeConfig, own_workdir, session_root
from .node_observe import NodeTelemetry
from .streaming import Batch, LiveStarts

REMOTE = "remote"  # a remote request on the direct port
REMOTE_LIVE = "remote_live"  # a step of a streamed remote request on the direct port
DEFAULT_ORPHAN_TIMEOUT_S = 600.0


class ReadAs:
    """An answer that reads, wherever its ref is read, as ``reader(data)`` (its unpickling):
    a caller's own shape of the remote wire's answer (a Ray-shaped sandbox's ``ExecResult``)
    with no actor of the caller's between it and the node (decision 511). The node never
    calls ``reader``: it came with the request, as a Ray argument (which the node reads as
    it reads any), and goes back with the answer."""

    __slots__ = ("data", "reader")

    def __init__(self, reader: Callable[[Any], Any], data: Any) -> None:
        self.reader, self.data = reader, data

    def __reduce__(self) -> tuple[Callable[[Any], Any], tuple[Any]]:
        return (self.reader, (self.data,))


class NodeRemote:
    """A mixin of the node actor (``node.py``)."""

    config: NodeConfig
    where: str
    node_id: str
    telemetry: NodeTelemetry
    _remote_server: RemoteServer | None = None
    _leases: dict[str, tuple[float, float]] | None = None  # owner -> (timeout, last heard)
    _streams: LiveStarts | None = None  # streamed requests in progress (streaming.py)
    _stream_owners: dict[tuple[str, str], str] | None = None  # (session, stream) -> owner
    _ends: dict[str, float] | None = None  # owner -> when its sessions end whatever is heard
    _counted = 0  # the open sessions last reported to the node's telemetry

    @functools.cached_property
    def _answers(self) -> KeptAnswers:  # tokened direct requests' answers, for remote_collect
        return KeptAnswers()

    def _warm_pool(self, pool_id: object) -> Any:  # node_pool.py
        raise NotImplementedError

    def _heard(self, owner: str, timeout: float | None = None) -> None:
        if self._leases is None:
            self._leases = {}
        known = self._leases.get(owner)
        kept = timeout if isinstance(timeout, int | float) and timeout > 0 else (
            known[0] if known is not None else DEFAULT_ORPHAN_TIMEOUT_S)
        self._leases[owner] = (float(kept), time.monotonic())

    async def remote_touch(self, owner: str, timeout: float, ttl: float | None = None) -> None:
        """The transport ``owner`` is alive; its sessions end ``timeout`` seconds after the
        last word from it — and, given ``ttl``, that many seconds from now whatever is heard
        (a Ray-shaped sandbox's ``ttl_seconds``)."""
        self._heard(str(owner), timeout)
        if isinstance(ttl, int | float) and ttl > 0:
            self._ends = self._ends or {}
            self._ends[str(owner)] = time.monotonic() + ttl

    async def _reap_remote(self, now: float) -> None:
        """End the sessions of transports not heard from for their orphan timeout, or past
        their end."""
        for owner, (timeout, seen) in list((self._leases or {}).items()):
            if (now - seen > timeout or now > (self._ends or {}).get(owner, now)
                    ) and self._leases is not None:
                self._leases.pop(owner, None)
                (self._ends or {}).pop(owner, None)
                await self._drop_owner(owner)

    async def _hosted(self, spec: HostedSpec, copied: str | None
                      ) -> tuple[BuiltinExec, Callable[[], None]]:
        """The node's own engine's backend for one session, in a private directory (or the
        caller's copied workspace); with ``pool``, a warm sandbox of that ``RayPool``'s share
        here (``node_pool.py``): a claim is an ordinary session of this server."""
        kind = self.config.kind.name
        if spec.kind not in (kind, PLACED):  # placed: this node's own engine
            raise ConfigurationError(f"{self.where} runs {kind} sandboxes, not {spec.kind}")
        # "lifetime": a durable session's, put there by the RemoteServer, never by a caller
        unknown = sorted(set(spec.options) - {"image", "limits", "lifetime", "pool"})
        if unknown:
            raise ConfigurationError(f"{self.where} decides its backend's options itself; a "
                                     f"Ray session may give image, limits and pool, not "
                                     f"{', '.join(unknown)}")
        image, limits = spec.options.get("image"), spec.options.get("limits")
        chosen = (image if isinstance(image, str) else None,
                  SandboxLimits.model_validate(limits) if limits is not None else None)
        pool = self._warm_pool(spec.options.get("pool"))
        root = session_root(own_workdir(self.config.workdir), os.urandom(8).hex())
        try:
            workspace = copied or os.path.join(root, WORKSPACE_DIR)  # the caller's copy, or new
            if copied is None:
                os.mkdir(workspace, 0o755)
            backend = (await pool.backend(workspace) if pool is not None else
                       self.config.make(workspace, *chosen, spec.options.get("lifetime")))
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return backend, lambda: shutil.rmtree(root, ignore_errors=True)

    def _server(self) -> RemoteServer:
        if self._remote_server is None:
            spool = os.path.join(own_workdir(self.config.workdir), "remote-spool")
            os.makedirs(spool, mode=0o700, exist_ok=True)
            self._remote_server = RemoteServer(spool, self._hosted, node=self.node_id)
        return self._remote_server

    async def remote_call(self, payload: bytes, owner: str, orphan_timeout: float | None = None,
                          _after: Any = None, reader: Callable[[bytes], Any] | None = None
                          ) -> bytes | ReadAs:
        """One remote request as bytes, ``(request, trace)``: the request and its caller's
        trace context (None when it does not trace); its answer as bytes, or as a ``ReadAs``
        of them with ``reader``. ``_after``: an ObjectRef Ray resolves first (a request sent
        before another's answer came, in order)."""
        self._heard(str(owner), orphan_timeout)
        try:
            request, came = loads(payload)
            trace = trace_context(came)
        except Exception as exc:  # noqa: BLE001 - a malformed payload is an answer too
            answer = dumps(("err", error_answer(HostError(
                f"not a remote call ({type(exc).__name__})"))))
        else:
            answer = dumps(await self._handled(trace, request, None, str(owner)))
        return answer if reader is None else ReadAs(reader, answer)

    async def _handled(self, trace: TraceContext | None, request: Any, emit: Any, owner: str
                       ) -> Answer:
        """The server's answer to one request, spanned when its caller traces; the node's
        count of open sessions follows what it did."""
        try:
            return await self.telemetry.remote(
                trace, request, lambda: self._server().handle(request, emit, owner))
        finally:
            self._count_sessions()

    def _count_sessions(self) -> None:
        """``toolseam.sessions.open`` of this node: the server's open sessions, reported as
        they change (decision 390)."""
        now = 0 if self._remote_server is None else self._remote_server.open_sessions
        if now != self._counted:
            self.telemetry.sessions_changed(now - self._counted)
            self._counted = now

    async def remote_refs(self, reader: Callable[[Any], Any], items: tuple[Any, ...]
                          ) -> tuple[ReadAs, ...]:
        """One ``ReadAs(reader, item)`` per item, each a return of its own (asked with
        ``num_returns``): the refs a Ray-shaped sandbox's direct calls come back as, made
        ahead in a batch — an actor call costs less than a Ray task of the caller's, and
        starts no worker (decision 511). The caller's own values: nothing of the node's."""
        return tuple(ReadAs(reader, item) for item in items)

    async def remote_drop(self, owner: str, _after: Any = None) -> None:
        """The transport ``owner`` closed: end every session it opened here."""
        if self._leases is not None:
            self._leases.pop(str(owner), None)
        await self._drop_owner(str(owner))

    async def _drop_owner(self, owner: str) -> None:
        """End the sessions and streams of the transport ``owner``."""
        for (sid, stream), held_by in list((self._stream_owners or {}).items()):
            if held_by == owner:
                self._end_stream(sid, stream)
        try:
            await self._server().drop(owner)
        finally:
            self._count_sessions()

    async def remote_live(self, payload: bytes, owner: str, orphan_timeout: float | None = None
                          ) -> bytes:
        """A step of a streamed request through Ray: ``(step, stream id, session, secret,
        request, trace)``; its batch ``(events, answer or None)`` as bytes."""
        self._heard(str(owner), orphan_timeout)
        try:
            step, stream, sid, secret, request, trace = loads(payload)
            key = self._remote_key(str(sid))
            if key is None or not hmac.compare_digest(key, derived_key(str(secret),
                                                                       SESSION_LABEL)):
                raise HostError(f"no session {str(sid)[:8]}… on this server answers this secret")
            batch = await self._stream_step(str(sid), str(step), str(stream), request, str(owner),
                                            trace_context(trace))
        except Exception as exc:  # noqa: BLE001 - a refusal is an answer too
            batch = ([], ("err", error_answer(exc)))
        return dumps(batch)

    async def _stream_step(self, sid: str, step: str, stream: str, request: Any, owner: str,
                           trace: TraceContext | None = None) -> Batch:
        """``begin`` (the session's own ``request``), ``next`` or ``cancel`` of a stream of
        session ``sid``, whose holder proved its key."""
        if self._streams is None:
            self._streams = LiveStarts(lambda exc: ("err", error_answer(exc)))
            self._stream_owners = {}
        assert self._stream_owners is not None
        if step == "cancel":
            self._end_stream(sid, stream)
            return [], ("ok", None)
        if step == "begin":
            if not (isinstance(request, tuple) and request[:1] == (sid,)):
                raise HostError("a streamed request names another session than its own")
            self._streams.begin_call(sid, stream, lambda emit: self._handled(
                trace, request, emit, owner))
            self._stream_owners[(sid, stream)] = owner
        elif step != "next":
            raise HostError(f"{step!r} is not a step of a streamed request")
        batch = await self._streams.next(sid, stream)
        if batch[1] is not None:
            self._stream_owners.pop((sid, stream), None)
        return batch

    def _end_stream(self, sid: str, stream: str) -> None:
        if self._streams is not None and self._stream_owners is not None:
            self._stream_owners.pop((sid, stream), None)
            self._streams.cancel(sid, stream)

    def _remote_key(self, sid: str) -> bytes | None:
        """A remote session's key, for the direct port's proofs; None: no such session."""
        return None if self._remote_server is None else self._remote_server.key_for(sid)

    async def remote_direct(self, sid: str, args: tuple[Any, ...], trace: Any = None
                            ) -> Answer:
        """A request of the session the direct connection proved (``sid``), nobody else's;
        ``trace``: its caller's span's context (direct.py carries it beside the call). With a
        third argument, a token: the answer is kept for ``remote_collect`` too (a caller that
        stopped waiting for it hands it to Ray; a ref read in another process reads it)."""
        if not (len(args) in (2, 3) and isinstance(args[0], tuple) and args[0][:1] == (sid,)
                and isinstance(args[0][1], str)):
            return refused(HostError("a direct request names another session than its "
                                    "connection's"))
        self._heard(str(args[1]))
        handled = self._handled(trace, args[0], None, str(args[1]))
        if len(args) == 2:  # nobody collects it: awaited here, no task of its own
            return ("ok", await handled)
        call = asyncio.ensure_future(handled)
        self._answers.keep(str(args[2]), derived_key(args[0][1], SESSION_LABEL), call)
        return ("ok", await asyncio.shield(call))  # the connection may go; the call goes on

    async def remote_collect(self, sid: str, secret: str, token: str,
                             reader: Callable[[bytes], Any] | None = None) -> bytes | ReadAs:
        """The answer of session ``sid``'s direct request ``token``, waited for, as bytes (or
        a ``ReadAs`` of them, given ``reader``) — only for the holder of its secret."""
        answer = await self._answers.collect(str(token), derived_key(str(secret), SESSION_LABEL))
        if answer is None:
            answer = ("err", error_answer(HostError(
                f"{self.where}: the answer of call {str(token)[:8]}… of session {str(sid)[:8]}… "
                f"is not kept (its request did not come within {ARRIVAL_S:g} s, it ended over "
                f"{KEPT_S:g} s ago, or it is not yours)")))
        return dumps(answer) if reader is None else ReadAs(reader, dumps(answer))

    async def remote_live_direct(self, sid: str, args: tuple[Any, ...], trace: Any = None
                                 ) -> Answer:
        """A step of a streamed request of the session the direct connection proved:
        ``(step, stream id, request or None, owner)``."""
        if len(args) != 4:
            return refused(HostError("a streamed step is (step, stream, request, owner)"))
        self._heard(str(args[3]))
        try:
            return ("ok", await self._stream_step(sid, str(args[0]), str(args[1]), args[2],
                                                  str(args[3]), trace))
        except Exception as exc:  # noqa: BLE001 - a refusal is an answer too
            return ("ok", ([], ("err", error_answer(exc))))
