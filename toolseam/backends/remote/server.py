"""``RemoteServer``: hosts any local backend's sessions for remote clients, below the seam.

A session is made by an ``open`` request naming a backend by its kind and options
(``HostedSpec``: the one name table, ``backends/__init__.py``) and keyed by its id and a
per-session secret the client chose: the server keeps only a one-way key of the secret and
compares in constant time, and answers "no such session" and "not yours" the same way, so
another client of the same server can neither drive nor probe a session it was not given.
Only the operations of the one table (``ops.py``) are called, each on a backend that declares
its capability; every failure is an answer through the one error map, never an exception
out of the server. A session lives as long as the connection that opened it (its
transport's ``owner``): a client that dies leaves nothing running — unless the session is
durable (``durable.py``): then the hosted session is detached, not ended, and kept for an
attach (``kept.py``) until the hosted kind's own orphan timeout ends it.

A session may open from a snapshot (a fork's child, ``branch``): the client pushes the snapshot
first (``snapshots.py``), and the hosted kind's own ``branch_backend`` makes its sandbox in a
private workspace of this server's, removed when the session ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
from typing import Any, cast

from pydantic import ValidationError

from ...seam.capabilities import Branching, branching, durable_sessions, supports
from ...seam.errors import ConfigurationError, HostError
from ...seam.handle import SessionHandle
from ...seam.models import SandboxInfo
from ...seam.protocol import BuiltinExec, WorkspaceTransfer
from ..agentlink.errors import error_answer
from ..snapshots import SnapshotStore, new_branch_workspace, remove_branch_workspace
from . import copied, ops, snapshots, workspace
from .egress import EVENTS, NOT_CAPTURED, SEND
from .handshake import derived_key
from .hosted import (
    LIFETIME_OPS,
    SESSION_LABEL,
    Adopting,
    HostedSession,
    Hosting,
    adopt_hosted,
    create_hosted,
    durable_answer,
    durable_lifetime,
)
from .kept import KeptSessions
from .server_durable import DurableHosting
from .server_operator import OperatedSessions
from .spec import HostedSpec
from .transport import Answer, OnEvent, Request

__all__ = ["SESSION_LABEL", "Adopting", "Hosting", "RemoteServer", "create_hosted"]

class RemoteServer(DurableHosting, OperatedSessions):
    """The sessions of one server process. ``handle`` is what a transport's listener calls for
    each request of a proven peer; ``drop`` when that peer's connection ends."""

    def __init__(self, spool: str, hosting: Hosting = create_hosted,
                 adopting: Adopting = adopt_hosted, node: str | None = None) -> None:
        self._hosting, self._adopting = hosting, adopting
        self.node = node  # a cluster's node this server runs on: named in each session's info
        self.where = "this server"  # for messages; a listener names its place
        self._kept = KeptSessions(self._forget)
        self._sessions: dict[str, HostedSession] = {}
        self._ending = 0  # sessions out of the table whose end (engine removal) still runs
        self._opening: set[str] = set()
        self._leaving: dict[str, asyncio.Event] = {}
        self._arrivals: dict[str, snapshots.Arrivals] = {}  # snapshots pushed, by session id
        self._spool = spool  # a private directory for workspace transfers

    def _session(self, sid: str, secret: str) -> HostedSession:
        session = self._sessions.get(sid)
        if session is None or not hmac.compare_digest(session.key,
                                                      derived_key(secret, SESSION_LABEL)):
            raise HostError(f"no session {sid[:8]}… on this server answers this secret")
        return session

    @property
    def sessions(self) -> int:
        """How many sessions are open here or still ending (no id named: a node's figures).
        One still ending counts: its container may be there until its end returns."""
        return len(self._sessions) + self._ending

    @property
    def open_sessions(self) -> int:
        """How many sessions are open here (a clients' figure: ``toolseam.sessions.open``)."""
        return len(self._sessions)

    def key_for(self, sid: str) -> bytes | None:
        """An open session's one-way key (``derived_key(secret, SESSION_LABEL)``), for a
        transport whose connection proves it before any request (Ray's direct port); None: no
        such session."""
        session = self._sessions.get(sid)
        return None if session is None else session.key

    async def handle(self, request: Request, emit: OnEvent | None, owner: object) -> Answer:
        try:
            sid, secret, name, args, kwargs = _checked(request)
            if name == "open" and kwargs.get("attach"):
                return ("ok", await self._attach(sid, secret, owner))
            if name == "open":
                return ("ok", await self._open(sid, secret, kwargs.get("spec"), owner,
                                               kwargs.get("branch"), kwargs.get("lifetime"),
                                               kwargs.get("workspace")))
            if name in snapshots.CARRIER_OPS:
                return ("ok", self._carry(sid, secret, name, kwargs, owner))
            session = self._session(sid, secret)
            if name == "close":
                return ("ok", await self._close(sid, session))
            if name == "sync" and session.copied is not None:  # the copy, home (copied.py)
                return ("ok", await copied.synced(
                    session.backend, "WorkspaceTransfer" in session.capabilities,
                    session.copied))
            if name == "kill_sandbox":  # SandboxKill, its own session's (server_operator.py)
                return ("ok", await self._kill_own(sid, session))
            if name in LIFETIME_OPS:
                await self._lifetime_op(sid, session, name, kwargs)
                return ("ok", None)
            if name == EVENTS:  # the egress shape's event stream (egress.py)
                await session.egress.events(emit)
                return ("ok", None)
            if name == SEND:
                await session.egress.receive(dict(kwargs["frame"]))
                return ("ok", None)
            return ("ok", await self._call(session, name, args, kwargs, emit))
        except Exception as exc:  # noqa: BLE001 - every failure is an answer (the one map)
            return ("err", error_answer(exc))

    def _carry(self, sid: str, secret: str, name: str, kwargs: dict[str, Any], owner: object
               ) -> Any:
        """A snapshot's objects out of (a session's own) or into this server's store; a push
        may come before its session opens (a fork's child), keyed by the same id and secret."""
        if name == snapshots.GET:
            return snapshots.read_piece(self._session(sid, secret).exported, kwargs.get("digest"),
                                        kwargs.get("offset"), kwargs.get("length"))
        if sid in self._sessions:
            self._session(sid, secret)
        key = derived_key(secret, SESSION_LABEL)
        arrivals = self._arrivals.get(sid)
        if arrivals is None:
            arrivals = self._arrivals[sid] = snapshots.Arrivals(key, owner)
        elif not hmac.compare_digest(arrivals.key, key):
            raise HostError(f"no session {sid[:8]}… on this server answers this secret")
        if name == snapshots.LACKS:
            return arrivals.lacks(kwargs.get("manifest"))
        arrivals.put(kwargs.get("digest"), kwargs.get("offset"), kwargs.get("data"),
                     kwargs.get("last"))
        return None

    async def _open(self, sid: str, secret: str, given: object, owner: object,
                    branch: object = None, lifetime: object = None, workspace: object = None
                    ) -> tuple[Any, ...]:
        if sid in self._sessions or sid in self._opening or sid in self._kept:
            raise HostError(f"session {sid[:8]}… exists on this server")
        try:
            spec = HostedSpec.model_validate(given)
        except ValidationError as exc:
            fields = ", ".join(".".join(map(str, e["loc"])) or "(top level)" for e in exc.errors())
            raise ConfigurationError(f"hosted: not a backend spec (bad or missing {fields})"
                                     ) from None
        if "lifetime" in spec.options:
            raise ConfigurationError("hosted: lifetime is not a hosted backend's option here; "
                                     "build the RemoteBackend with lifetime=Durable(...)")
        durable = durable_lifetime(lifetime)
        if durable is not None:
            if branch is not None:
                raise ConfigurationError("open: a fork's child ends with its client")
            spec = spec.model_copy(update={"options": {**spec.options, "lifetime": durable}})
        if workspace is not None and (branch is not None or durable is not None):
            raise ConfigurationError("open: a copied workspace is the client's to bring home; "
                                     "a fork's child or a durable session has none")
        copied_root = (None if workspace is None else
                       await asyncio.to_thread(copied.unpacked, workspace, self._spool))
        try:
            backend, after = await self._hosting(
                spec, None if copied_root is None else copied.workspace_of(copied_root))
        except BaseException:
            if copied_root is not None:
                await asyncio.to_thread(copied.removed, copied_root)
            raise
        self._opening.add(sid)  # a second open of the id while this one waits is refused
        branch_workspace: str | None = None
        try:
            if branch is not None:
                backend, branch_workspace = await _branched(backend, branch)
                if after is not None:  # the template's own directory: the branch has its own
                    await asyncio.to_thread(after)
                    after = None
            capabilities = ops.declared_capabilities(backend)
            if durable is not None and "DurableSessions" not in capabilities:
                raise ConfigurationError(f"the {backend.name} backend keeps no session past "
                                         "its client")
            info = await backend.open()
            kept: SessionHandle | None = None
            answer: tuple[Any, ...] = ()
            if durable is not None:
                kept = durable_sessions(backend).durable_handle(sid, durable.secret)
                answer = (durable_answer(backend, kept),)
        except BaseException:
            await asyncio.shield(backend.close())
            if branch_workspace is not None:
                await asyncio.to_thread(remove_branch_workspace, branch_workspace)
            if after is not None:
                await asyncio.to_thread(after)
            if copied_root is not None:
                await asyncio.to_thread(copied.removed, copied_root)
            raise
        finally:
            self._opening.discard(sid)
            self._drop_arrivals(sid)
        self._sessions[sid] = HostedSession(
            derived_key(secret, SESSION_LABEL), backend, owner, capabilities,
            branch_workspace=branch_workspace, after=after, kept=kept,
            orphan_timeout_s=durable.orphan_timeout_s if durable else 0.0, copied=copied_root,
            image=info.image)
        return (self._placed(info), sorted(capabilities), *answer)

    def _placed(self, info: SandboxInfo) -> SandboxInfo:
        """The hosted backend's info, with this server's node where it runs on one."""
        return info if self.node is None else info.model_copy(update={"node": self.node})

    def _drop_arrivals(self, sid: str) -> None:
        arrivals = self._arrivals.pop(sid, None)
        if arrivals is not None:
            arrivals.close()

    async def _call(self, session: HostedSession, name: str, args: tuple[Any, ...],
                    kwargs: dict[str, Any], emit: OnEvent | None) -> Any:
        op = ops.BY_NAME.get(name)
        if op is None:
            raise HostError(f"{name!r} is not a seam operation")
        if op.capability not in ops.REQUIRED and op.capability.__name__ not in session.capabilities:
            raise HostError(f"this server's {session.backend.name} backend has no {name}")
        method = getattr(session.backend, name)
        session.served += 1
        task = asyncio.current_task()
        if task is not None:
            session.calls.add(task)
        try:
            if op.shape == "stream" and emit is not None:
                return await method(*args, on_output=emit, **kwargs)
            if op.shape == "upload":
                return await workspace.upload_here(method, self._spool, *args, **kwargs)
            if op.shape == "download":
                return await workspace.download_here(method, self._spool, *args, **kwargs)
            if op.shape == "egress":  # the client's proxy serves (egress.py); nothing captured
                where = dict(await method(session.egress.serve, kwargs.get("ca_pem"), None))
                return {**where, "capture": NOT_CAPTURED}
            if op.shape == "snapshot":  # its manifest; the client fetches what it lacks
                manifest = SnapshotStore().load((await method(*args, **kwargs)).id)
                session.exported.update(e.digest for e in manifest.entries if e.kind == "file")
                return manifest.dumps()
            if op.shape == "restore":
                done = await method(*args, **kwargs)
                return {"written": done.written, "removed": done.removed}
            if op.shape == "usage":
                return dataclasses.asdict(await method())
            return await method(*args, **kwargs)
        finally:
            if task is not None:
                session.calls.discard(task)

    async def _close(self, sid: str, session: HostedSession) -> Any:
        """End the session: ``("failed", error answer)`` for what its backend could not bring
        home (``copy_back_error``), ``("workspace", tar)`` for a copied workspace, or None."""
        self._sessions.pop(sid, None)
        self._drop_arrivals(sid)
        archive = await self._end(session, bring_back=True)
        failure = (cast(WorkspaceTransfer, session.backend).copy_back_error
                   if "WorkspaceTransfer" in session.capabilities else None)
        if failure is not None:
            return ("failed", error_answer(failure))
        return None if archive is None else ("workspace", archive)

    async def _end(self, session: HostedSession, bring_back: bool = False) -> bytes | None:
        """End a session already out of the table, counted in ``sessions`` until it has."""
        self._ending += 1
        try:
            return await session.end(bring_back)
        finally:
            self._ending -= 1

    async def drop(self, owner: object, ending: bool = False) -> None:
        """The connection ``owner`` ended: close every session it opened (their calls first);
        a durable one is detached and kept instead, unless the server is ``ending``."""
        for sid, session in list(self._sessions.items()):
            if session.owner == owner:  # a connection, or a Ray transport's id
                if session.kept is not None and not ending:
                    with contextlib.suppress(Exception):
                        await self._detach(sid, session)
                    continue
                self._sessions.pop(sid, None)
                for task in list(session.calls):
                    task.cancel()
                with contextlib.suppress(Exception):
                    await self._end(session)
        for sid, arrivals in list(self._arrivals.items()):
            if arrivals.owner == owner:
                self._drop_arrivals(sid)

    async def close(self) -> None:
        """End every session, durable ones and kept ones included: with the server gone,
        nobody could attach to them."""
        for owner in {session.owner for session in self._sessions.values()}:
            await self.drop(owner, ending=True)
        for kept in self._kept.take_all():
            await self._end_kept(kept)
        await self._kept.settled()


async def _branched(template: BuiltinExec, snapshot_id: object) -> tuple[BuiltinExec, str]:
    """The hosted kind's own fork of ``template`` (never opened) from a snapshot in this
    server's store, in a private workspace of this server's; the backend and that workspace."""
    if not isinstance(snapshot_id, str):
        raise HostError("open: a branch is named by a snapshot id")
    if not supports(template, Branching):
        raise ConfigurationError(f"fork: the {template.name} backend cannot open a session "
                                 "from a snapshot")
    workspace_dir = await asyncio.to_thread(new_branch_workspace)
    try:
        backend, _ = await asyncio.to_thread(branching(template).branch_backend, workspace_dir,
                                             snapshot_id)
    except BaseException:
        await asyncio.to_thread(remove_branch_workspace, workspace_dir)
        raise
    return backend, workspace_dir


def _checked(request: object) -> Request:
    """A request's parts, each of its type, or a ``HostError`` saying it is not a request."""
    if not (isinstance(request, tuple) and len(request) == 5):
        raise HostError("not a remote call: a request is (session, secret, operation, args, "
                        "kwargs)")
    sid, secret, name, args, kwargs = request
    if not (isinstance(sid, str) and isinstance(secret, str) and isinstance(name, str)
            and isinstance(args, tuple | list) and isinstance(kwargs, dict)
            and all(isinstance(key, str) for key in kwargs)):
        raise HostError("not a remote call: a part of the request has the wrong type")
    return sid, secret, name, tuple(args), kwargs
