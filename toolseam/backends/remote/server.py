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
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ...seam.errors import ConfigurationError, HostError
from ...seam.protocol import BuiltinExec, WorkspaceTransfer
from .. import create_backend
from ..agentlink.errors import error_answer
from . import ops, workspace
from .egress import EVENTS, NOT_CAPTURED, SEND, ServerEgress
from .handshake import derived_key
from .spec import HostedSpec
from .transport import Answer, OnEvent, Request

SESSION_LABEL = b"toolseam remote session key v1"


@dataclass
class _Session:
    key: bytes
    backend: BuiltinExec
    owner: object
    capabilities: frozenset[str]
    calls: set[asyncio.Task[Any]] = field(default_factory=set)
    egress: ServerEgress = field(default_factory=ServerEgress)


class RemoteServer:
    """The sessions of one server process. ``handle`` is what a transport's listener calls for
    each request of a proven peer; ``drop`` when that peer's connection ends."""

    def __init__(self, spool: str) -> None:
        self._sessions: dict[str, _Session] = {}
        self._opening: set[str] = set()
        self._spool = spool  # a private directory for workspace transfers

    def _session(self, sid: str, secret: str) -> _Session:
        session = self._sessions.get(sid)
        if session is None or not hmac.compare_digest(session.key,
                                                      derived_key(secret, SESSION_LABEL)):
            raise HostError(f"no session {sid[:8]}… on this server answers this secret")
        return session

    async def handle(self, request: Request, emit: OnEvent | None, owner: object) -> Answer:
        try:
            sid, secret, name, args, kwargs = _checked(request)
            if name == "open":
                return ("ok", await self._open(sid, secret, kwargs.get("spec"), owner))
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

    async def _open(self, sid: str, secret: str, given: object, owner: object
                    ) -> tuple[Any, list[str]]:
        if sid in self._sessions or sid in self._opening:
            raise HostError(f"session {sid[:8]}… exists on this server")
        try:
            spec = HostedSpec.model_validate(given)
        except ValidationError as exc:
            fields = ", ".join(".".join(map(str, e["loc"])) or "(top level)" for e in exc.errors())
            raise ConfigurationError(f"hosted: not a backend spec (bad or missing {fields})"
                                     ) from None
        backend = create_backend(spec.kind, **spec.options)
        capabilities = ops.declared_capabilities(backend)
        self._opening.add(sid)  # a second open of the id while this one waits is refused
        try:
            info = await backend.open()
        except BaseException:
            await asyncio.shield(backend.close())
            raise
        finally:
            self._opening.discard(sid)
        self._sessions[sid] = _Session(derived_key(secret, SESSION_LABEL), backend, owner,
                                       capabilities)
        return info, sorted(capabilities)

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
            return await method(*args, **kwargs)
        finally:
            if task is not None:
                session.calls.discard(task)

    async def _close(self, sid: str, session: _Session) -> Any:
        """End the session; what its backend could not bring home (``copy_back_error``, as an
        error answer), or None."""
        self._sessions.pop(sid, None)
        session.egress.close()
        await session.backend.close()
        failure = (session.backend.copy_back_error
                   if isinstance(session.backend, WorkspaceTransfer) else None)
        return None if failure is None else error_answer(failure)

    async def drop(self, owner: object) -> None:
        """The connection ``owner`` ended: close every session it opened (their calls first)."""
        for sid, session in list(self._sessions.items()):
            if session.owner is owner:
                self._sessions.pop(sid, None)
                session.egress.close()
                for task in list(session.calls):
                    task.cancel()
                with contextlib.suppress(Exception):
                    await session.backend.close()

    async def close(self) -> None:
        for owner in {session.owner for session in self._sessions.values()}:
            await self.drop(owner)


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
