"""``RemoteServer``: hosts any local backend's sessions for remote clients, below the seam.

A session is made by an ``open`` request naming a backend by its kind and options
(``HostedSpec``: the one name table, ``backends/__init__.py``) and keyed by its id and a
per-session secret the client chose: the server keeps only a one-way key of the secret and
compares in constant time, and answers "no such session" and "not yours" the same way, so
another client of the same server can neither drive nor probe a session it was not given.
Only the operations of the one table (``ops.py``) are called, each on a backend that declares
its capability; every failure is an answer through the one error map, never an exception
out of the server. A session lives as long as the connection that opened it (its
transport's ``owner``): a client that dies leaves nothing running.

A session may open from a snapshot (a fork's child, ``branch``): the client pushes the snapshot
first (``snapshots.py``), and the hosted kind's own ``branch_backend`` makes its sandbox in a
private workspace of this server's, removed when the session ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ...seam.capabilities import Branching, branching, supports
from ...seam.errors import ConfigurationError, HostError
from ...seam.protocol import BuiltinExec, WorkspaceTransfer
from .. import create_backend
from ..agentlink.errors import error_answer
from ..snapshots import SnapshotStore, new_branch_workspace, remove_branch_workspace
from . import ops, snapshots, workspace
from .egress import EVENTS, NOT_CAPTURED, SEND, ServerEgress
from .handshake import derived_key
from .spec import HostedSpec
from .transport import Answer, OnEvent, Request

SESSION_LABEL = b"toolseam remote session key v1"
# What a spec becomes on this server, and what to do once its session ended (a Ray node makes
# its own engine's backend in a directory of its own, which goes with the session).
Hosting = Callable[[HostedSpec], tuple[BuiltinExec, Callable[[], None] | None]]


def create_hosted(spec: HostedSpec) -> tuple[BuiltinExec, None]:
    """The default hosting: the name table's backend of that kind and options."""
    return create_backend(spec.kind, **spec.options), None


@dataclass
class _Session:
    key: bytes
    backend: BuiltinExec
    owner: object
    capabilities: frozenset[str]
    calls: set[asyncio.Task[Any]] = field(default_factory=set)
    egress: ServerEgress = field(default_factory=ServerEgress)
    exported: set[str] = field(default_factory=set)  # objects of the snapshots it took
    branch_workspace: str | None = None  # opened from a snapshot: this server's private dir
    after: Callable[[], None] | None = None  # the hosting's own end of it

    async def end(self) -> None:
        self.egress.close()
        try:
            await self.backend.close()
        finally:
            if self.branch_workspace is not None:
                await asyncio.to_thread(remove_branch_workspace, self.branch_workspace)
            if self.after is not None:
                await asyncio.to_thread(self.after)


class RemoteServer:
    """The sessions of one server process. ``handle`` is what a transport's listener calls for
    each request of a proven peer; ``drop`` when that peer's connection ends."""

    def __init__(self, spool: str, hosting: Hosting = create_hosted) -> None:
        self._hosting = hosting
        self._sessions: dict[str, _Session] = {}
        self._opening: set[str] = set()
        self._arrivals: dict[str, snapshots.Arrivals] = {}  # snapshots pushed, by session id
        self._spool = spool  # a private directory for workspace transfers

    def _session(self, sid: str, secret: str) -> _Session:
        session = self._sessions.get(sid)
        if session is None or not hmac.compare_digest(session.key,
                                                      derived_key(secret, SESSION_LABEL)):
            raise HostError(f"no session {sid[:8]}… on this server answers this secret")
        return session

    @property
    def sessions(self) -> int:
        """How many sessions are open here (no id named: a node's figures)."""
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
            if name == "open":
                return ("ok", await self._open(sid, secret, kwargs.get("spec"), owner,
                                               kwargs.get("branch")))
            if name in snapshots.CARRIER_OPS:
                return ("ok", self._carry(sid, secret, name, kwargs, owner))
            session = self._session(sid, secret)
            if name == "close":
                return ("ok", await self._close(sid, session))
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
                    branch: object = None) -> tuple[Any, list[str]]:
        if sid in self._sessions or sid in self._opening:
            raise HostError(f"session {sid[:8]}… exists on this server")
        try:
            spec = HostedSpec.model_validate(given)
        except ValidationError as exc:
            fields = ", ".join(".".join(map(str, e["loc"])) or "(top level)" for e in exc.errors())
            raise ConfigurationError(f"hosted: not a backend spec (bad or missing {fields})"
                                     ) from None
        backend, after = self._hosting(spec)
        self._opening.add(sid)  # a second open of the id while this one waits is refused
        branch_workspace: str | None = None
        try:
            if branch is not None:
                backend, branch_workspace = await _branched(backend, branch)
                if after is not None:  # the template's own directory: the branch has its own
                    await asyncio.to_thread(after)
                    after = None
            capabilities = ops.declared_capabilities(backend)
            info = await backend.open()
        except BaseException:
            await asyncio.shield(backend.close())
            if branch_workspace is not None:
                await asyncio.to_thread(remove_branch_workspace, branch_workspace)
            if after is not None:
                await asyncio.to_thread(after)
            raise
        finally:
            self._opening.discard(sid)
            self._drop_arrivals(sid)
        self._sessions[sid] = _Session(derived_key(secret, SESSION_LABEL), backend, owner,
                                       capabilities, branch_workspace=branch_workspace,
                                       after=after)
        return info, sorted(capabilities)

    def _drop_arrivals(self, sid: str) -> None:
        arrivals = self._arrivals.pop(sid, None)
        if arrivals is not None:
            arrivals.close()

    async def _call(self, session: _Session, name: str, args: tuple[Any, ...],
                    kwargs: dict[str, Any], emit: OnEvent | None) -> Any:
        op = ops.BY_NAME.get(name)
        if op is None:
            raise HostError(f"{name!r} is not a seam operation")
        if op.capability not in ops.REQUIRED and op.capability.__name__ not in session.capabilities:
            raise HostError(f"this server's {session.backend.name} backend has no {name}")
        method = getattr(session.backend, name)
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

    async def _close(self, sid: str, session: _Session) -> Any:
        """End the session; what its backend could not bring home (``copy_back_error``, as an
        error answer), or None."""
        self._sessions.pop(sid, None)
        self._drop_arrivals(sid)
        await session.end()
        failure = (session.backend.copy_back_error
                   if isinstance(session.backend, WorkspaceTransfer) else None)
        return None if failure is None else error_answer(failure)

    async def drop(self, owner: object) -> None:
        """The connection ``owner`` ended: close every session it opened (their calls first)."""
        for sid, session in list(self._sessions.items()):
            if session.owner == owner:  # a connection, or a Ray transport's id
                self._sessions.pop(sid, None)
                for task in list(session.calls):
                    task.cancel()
                with contextlib.suppress(Exception):
                    await session.end()
        for sid, arrivals in list(self._arrivals.items()):
            if arrivals.owner == owner:
                self._drop_arrivals(sid)

    async def close(self) -> None:
        for owner in {session.owner for session in self._sessions.values()}:
            await self.drop(owner)


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
