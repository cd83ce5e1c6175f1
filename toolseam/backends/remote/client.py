"""``RemoteBackend``: a sandbox hosted by a ``RemoteServer`` elsewhere, reached through a
``Transport`` (``transport.py``) — a backend below the seam like any other.

Its methods are made from the one table of seam operations (``ops.py``), never written one by
one: each row becomes a method with the seam protocol's own signature and docstring, which
binds its arguments, sends them, and raises what the server's answer carries through the one
error map (``agentlink/errors.py:map_seam_error``). Its capabilities are the hosted backend's:
the class of each instance is chosen once, at construction, from what the hosted kind declares
(``ops.declared_capabilities``), and the server confirms them at open — a mismatch is refused,
never papered over.

Branching crosses too (decision 445): a snapshot lands in this user's store
(``snapshots.py``), a restore pushes it to the server first, and a fork's child is a new
session of the same server (``Transport.another``) opened from the snapshot by the hosted
kind's own ``branch_backend``; its files live on the server, so ``keep()`` has no home here.

A session may outlive its client (``lifetime=Durable(...)``, ``durable.py``): the server keeps
it when the client's connection ends, and ``from_handle`` (``Toolkit.attach``) attaches to it
from another process through a transport made again from the handle's address.

A server that goes away (crashed, killed, its machine lost) ends the session: the call in
flight and every later one raise ``CouldNotRunError(cause="sandbox_lost")`` saying the call
may have run there. Nothing is retried: a call that ran twice is worse than one that failed.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import secrets
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from ...seam.capabilities import DurableSessions, SandboxUsage
from ...seam.errors import (
    BackendUnavailable,
    ConfigurationError,
    CouldNotRunError,
    SessionClosedError,
)
from ...seam.handle import AttachError, SessionHandle
from ...seam.lifetime import EPHEMERAL, BackendLifetime, Durable, Ephemeral
from ...seam.models import SandboxInfo
from .. import BACKEND_NAMES, backend_class, backend_kind
from ..agentlink.errors import map_seam_error
from ..containers.workspace_sync.policy import DEFAULT_COPY_LIMIT
from ..containers.workspace_sync.tar_sync import WorkspaceCopy
from ..snapshots import Restored, Snapshot
from ..snapshots.capture import Known
from . import copied, ops, snapshots, workspace
from .durable import Reconnectable, RemoteDurability, transport_at, wire_secret
from .egress import ClientEgress
from .spec import PLACED, HostedSpec
from .transport import OnEvent, Request, Transport, TransportLost

KILL_WAIT_S = 30.0  # toolseam ps --kill: an engine removing a container can take a while


class RemoteBackend(RemoteDurability):
    """``RemoteBackend(transport=UnixTransport(directory), hosted=HostedSpec(kind="host",
    options={"workspace": "/srv/ws"}))``: the hosted backend's sessions, driven from here.
    ``lifetime``: ``Ephemeral`` (default) or ``Durable`` — a session the server keeps past
    its client (``seam/lifetime.py``; the hosted kind must keep durable sessions)."""

    name = "remote"

    def __new__(cls, *, transport: Transport, hosted: HostedSpec, branch: str | None = None,
                lifetime: BackendLifetime = EPHEMERAL, workspace: str | None = None,
                copy_limit: int | None = None) -> RemoteBackend:
        if cls is RemoteBackend:  # the class with the hosted kind's capabilities, chosen once
            cls = remote_class(expected_capabilities(hosted.kind))
        return super().__new__(cls)

    # seam.capabilities: what supports() reads. The class a name finds declares the kind's
    # one class-level fact, that its sessions can outlive their client (``from_handle``);
    # an instance is of the class made for its hosted kind's capabilities (``remote_class``)
    capabilities: frozenset[type] = frozenset({DurableSessions})
    capability_names: frozenset[str] = frozenset()  # an instance's, as the wire names them
    network: str | None = None  # seam.capabilities.Egress: the hosted options' network

    def __init__(self, *, transport: Transport, hosted: HostedSpec, branch: str | None = None,
                 lifetime: BackendLifetime = EPHEMERAL, workspace: str | None = None,
                 copy_limit: int | None = None) -> None:
        """``branch``: a snapshot id of this user's store the session opens from (a fork's
        child, made by ``branch_backend``). ``workspace``: a directory of this machine copied
        to the server at open, the hosted backend's workspace there, and brought home at
        ``sync`` and ``close`` by the copy-back rule (``copied.py``; ``copy_limit`` bytes at
        most either way)."""
        if not isinstance(lifetime, Ephemeral | Durable):
            raise ConfigurationError("remote backend: lifetime must be toolseam.seam.lifetime's "
                                     f"Ephemeral() or Durable(...), got {type(lifetime).__name__}")
        durable = isinstance(lifetime, Durable)
        if durable and "DurableSessions" not in self.capability_names:
            raise ConfigurationError(f"remote backend: lifetime=Durable(...), but the hosted "
                                     f"{hosted.kind} backend keeps no session past its client")
        if durable and branch is not None:
            raise ConfigurationError("remote backend: a fork's child ends with its client; "
                                     "it cannot be built durable")
        if workspace is not None and (durable or branch is not None):
            raise ConfigurationError("remote backend: workspace= is copied home by this client; "
                                     "a durable session or a fork's child keeps its files on "
                                     "the server (upload and download them)")
        if workspace is not None and "workspace" in hosted.options:
            raise ConfigurationError("remote backend: workspace= is this machine's directory, "
                                     "copied there; the hosted options name none")
        self._copy = (None if workspace is None else
                      WorkspaceCopy(workspace, copy_limit or DEFAULT_COPY_LIMIT))
        self.transport, self.hosted, self.branch = transport, hosted, branch
        self._lifetime = lifetime
        adopt = lifetime.adopt if isinstance(lifetime, Durable) else None
        # an attach continues the session its server kept under the same id
        self.session_id = adopt.sandbox if adopt is not None else uuid.uuid4().hex
        self._secret = (wire_secret(lifetime.secret) if isinstance(lifetime, Durable)
                        else secrets.token_urlsafe(32))
        self._hosted_handle: SessionHandle | None = None
        self._kept: dict[str, Any] = {}  # what a durable open answered: jobs, kept state
        self._info: SandboxInfo | None = None
        self._opening = asyncio.Lock()
        self._closed = False
        self._over: CouldNotRunError | None = None
        self._copy_back_error: CouldNotRunError | None = None
        self._egress: ClientEgress | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        network = hosted.options.get("network")  # what the toolkit checks its settings against
        self.network = network if isinstance(network, str) else None

    @property
    def info(self) -> SandboxInfo | None:
        return self._info

    # --- lifecycle -----------------------------------------------------------------------
    async def open(self) -> SandboxInfo:
        """Open the hosted backend's sandbox on the server (idempotent)."""
        if self._info is not None:
            return self._info
        self._check_open()
        async with self._opening:
            if self._info is None:
                opening: dict[str, Any] = {"spec": self.hosted.model_dump(),
                                           **self._lifetime_opening()}
                if self.branch is not None:  # the snapshot first, then the open from it
                    await snapshots.push(self._send, self.branch)
                    opening["branch"] = self.branch
                if self._copy is not None:  # the base dir, and the copy-back's baseline
                    opening["workspace"] = await asyncio.to_thread(copied.packed, self._copy)
                info, held, *durable = await self._opened(opening)
                missing = self.capability_names - frozenset(held)
                if missing or (self.hosted.kind != PLACED
                               and frozenset(held) != self.capability_names):
                    await self.close()
                    raise CouldNotRunError(
                        f"{self.transport.where}: its {info.backend} backend has "
                        f"{sorted(held)}, this client expected "
                        f"{sorted(self.capability_names)} "
                        + ("(it cannot give " + ", ".join(sorted(missing)) + ")" if missing
                           else "(another toolseam version?)"),
                        retryable=False, cause="refused")
                self._loop = asyncio.get_running_loop()
                if isinstance(self._lifetime, Durable):
                    self._durable_opened(durable[0] if durable else None)
                # paths and processes are this machine's only when the server's are
                local = info.local and self.transport.same_machine
                self._info = info.model_copy(update={"local": local})
        assert self._info is not None
        return self._info

    # --- sessions that outlive their client (durable.py) -----------------------------------
    @classmethod
    def from_handle(cls, handle: SessionHandle, options: dict[str, Any]) -> RemoteBackend:
        """A backend (not open) that attaches to the session the handle's server kept, through
        a transport made from the handle's address — or ``options["transport"]``, one the
        caller made to the same server."""
        if handle.hosted is None:
            raise AttachError("protocol", "session handle: a remote session's handle names "
                              "the session its server hosts (hosted); this one has none")
        stray = sorted(set(options) - {"transport"})
        if stray:
            raise ConfigurationError(f"backend_options: attaching to a remote session takes "
                                     f"transport alone, not {', '.join(stray)}")
        try:
            kind = backend_kind(handle.hosted.backend).name
        except BackendUnavailable as exc:
            raise AttachError("unsupported", f"session handle: {exc}") from None
        given = options.get("transport")
        transport = given if given is not None else transport_at(handle.endpoint or "")
        return RemoteBackend(transport=transport, hosted=HostedSpec(kind=kind),
                             lifetime=Durable.attaching(handle))

    async def _opened(self, opening: dict[str, Any]) -> Any:
        """The server's answer to ``open``; an attach whose server cannot be reached is
        ``AttachError("gone")`` naming it."""
        try:
            return await self._send("open", opening)
        except CouldNotRunError as exc:
            if "attach" in opening and exc.cause == "engine_unreachable":
                raise AttachError("gone", f"{exc.reason}: the server that kept the session "
                                  "is gone, and the session with it") from None
            where = self.transport.where
            if exc.reason.startswith(where):
                raise
            raise CouldNotRunError(f"{where}: {exc.reason}", exc.retryable,  # which server
                                   exc.cause) from None

    async def close(self) -> None:
        """End the session on the server (its jobs killed, its sandbox down; a copied
        workspace brought home). Idempotent; never raises: what could not be brought home is
        ``copy_back_error``."""
        await self._end_session("close")

    async def _end_session(self, request: str) -> None:
        """This client's part ends by ``request`` (``close``, or a durable ``detach``): its
        egress, the request when the server can still answer it, then the transport."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._egress is not None:
                await self._egress.close()
            if self._info is not None and self._over is None:
                self._ended(await self._send(request, {}))
        except CouldNotRunError as failure:  # a copy that could not come home
            if request == "close" and self._copy is not None:
                self._copy_back_error = _as_copy_back(failure)
            elif request != "close":
                raise
        except Exception:
            if request != "close":
                raise
        finally:
            await self.transport.close()  # the server ends (or detaches) it at this end anyway

    def _ended(self, answer: Any) -> None:
        """What ``close`` answered: the hosted backend's copy-back failure, or the copied
        workspace to bring home (applied here by the copy-back rule)."""
        if not (isinstance(answer, tuple | list) and len(answer) == 2):
            return
        if answer[0] == "failed" and isinstance(answer[1], dict):
            self._copy_back_error = _as_copy_back(map_seam_error(answer[1]))
        elif answer[0] == "workspace" and self._copy is not None:
            copied.applied(self._copy, answer[1], self.transport.where)

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError("the remote backend was closed")

    # --- one request ---------------------------------------------------------------------
    async def _send(self, name: str, kwargs: dict[str, Any], on_event: OnEvent | None = None
                    ) -> Any:
        if self._over is not None:
            raise self._over
        request = (self.session_id, self._secret, name, (), kwargs)
        try:
            answer = await (self.transport.call(request) if on_event is None
                            else self.transport.stream(request, on_event))
        except TransportLost as lost:
            if not lost.sent and self._info is None:  # never reached: the session never was
                raise CouldNotRunError(str(lost), retryable=True,
                                       cause="engine_unreachable") from None
            if not lost.server_gone:  # the route dropped, the server and the session are there
                raise CouldNotRunError(f"{lost}; the call may have run there",
                                       retryable=False) from None
            raise self._lost(lost) from None
        if not (isinstance(answer, tuple) and len(answer) == 2 and answer[0] in ("ok", "err")):
            raise CouldNotRunError(f"{self.transport.where} answered what is not a toolseam "
                                   "answer", retryable=False, cause="agent_failed")
        if answer[0] == "err":
            raise (map_seam_error(answer[1]) if isinstance(answer[1], dict) else
                   CouldNotRunError(f"{self.transport.where} answered a malformed error",
                                    retryable=False, cause="agent_failed"))
        return answer[1]

    def _lost(self, lost: TransportLost) -> CouldNotRunError:
        if self._over is None:
            self._over = CouldNotRunError(
                f"{lost}; the call may have run there; this session is over (its sandbox went "
                "with its server): start a new one", retryable=False, cause="sandbox_lost")
        return self._over

    async def _operate(self, op: ops.SeamOp, arguments: dict[str, Any]) -> Any:
        """One row of the table, its arguments bound by the protocol's signature."""
        if op.name == "release" and self._closed:
            return None  # the session's close released every job
        if op.shape == "usage":  # measured only while open; never opens the session
            if self._info is None or self._closed or self._over is not None:
                return SandboxUsage()
            return _usage(await self._send(op.name, arguments))
        self._check_open()
        if self._info is None:
            await self.open()
        if op.name == "sync" and self._copy is not None:  # the server's copy, brought home
            archive = await self._send("sync", {})
            return await asyncio.to_thread(copied.applied, self._copy, archive,
                                           self.transport.where)
        if op.shape == "stream":
            on_output = arguments.pop("on_output", None)
            wanted = on_output is not None and getattr(arguments.get("request"), "stream", False)
            return await self._send(op.name, arguments, on_output if wanted else None)
        if op.shape == "upload":
            archive, dest = await workspace.upload_args(arguments["local"], arguments["dest"])
            return await self._send(op.name, {"archive": archive, "dest": dest})
        if op.shape == "egress":  # the sandbox's connections to this process's proxy
            if self._egress is None:
                self._egress = ClientEgress(self._send, arguments["serve"])
                await asyncio.sleep(0)  # its event stream is asked for before the listener
            return await self._send(op.name, {"ca_pem": arguments["ca_pem"]})
        if op.shape == "download":
            local = arguments["local"]
            if workspace.exists(local):
                raise ConfigurationError(f"download: {local} exists")
            archive = await self._send(op.name, {"src": arguments["src"]})
            return await workspace.download_result(archive, local)
        if op.shape == "snapshot":  # into this user's store
            return Snapshot.of(await snapshots.fetch(self._send,
                                                     await self._send(op.name, arguments)))
        if op.shape == "restore":  # this user's snapshot, on the server first
            await snapshots.push(self._send, arguments["snapshot_id"])
            done = await self._send(op.name, arguments)
            return Restored(int(done["written"]), int(done["removed"]), Known())
        return await self._send(op.name, arguments)


def _as_copy_back(found: Exception) -> CouldNotRunError:
    return (found if isinstance(found, CouldNotRunError) else
            CouldNotRunError(str(found), retryable=False, cause="copy_back_failed"))


def _usage(figures: Any) -> SandboxUsage:
    """The server's figures, each of its type or None — never a guess."""
    given = figures if isinstance(figures, dict) else {}

    def number(name: str, kind: type | tuple[type, ...]) -> Any:
        value = given.get(name)
        return value if isinstance(value, kind) and not isinstance(value, bool) else None
    seconds = number("cpu_seconds", (float, int))
    return SandboxUsage(cpu_seconds=None if seconds is None else float(seconds),
                        memory_bytes=number("memory_bytes", int),
                        memory_peak_bytes=number("memory_peak_bytes", int),
                        pids=number("pids", int))


Method = Callable[..., Coroutine[Any, Any, Any]]


def _forwarder(op: ops.SeamOp) -> Method:
    """The client's method for one row: the protocol's signature and words, its body one
    ``_operate``."""
    declared = getattr(op.capability, op.name)
    signature = inspect.signature(declared)

    async def forward(self: RemoteBackend, *args: Any, **kwargs: Any) -> Any:
        arguments = signature.bind(self, *args, **kwargs).arguments
        arguments.pop("self")
        return await self._operate(op, arguments)

    forward.__name__, forward.__qualname__ = op.name, f"RemoteBackend.{op.name}"
    forward.__doc__ = declared.__doc__
    forward.__signature__ = signature  # type: ignore[attr-defined]
    return forward


def expected_capabilities(kind: str) -> frozenset[str]:
    """What a client of a ``kind`` session declares: the kind's own; for ``PLACED`` (the
    server's engine, known once placed) what every local kind has — a server that cannot give
    one of them is refused at open, naming it (decision 493)."""
    if kind != PLACED:
        return ops.declared_capabilities(backend_class(kind))
    kinds = {backend_kind(name).name for name in BACKEND_NAMES if backend_kind(name).local}
    return frozenset.intersection(*(ops.declared_capabilities(backend_class(kind))
                                    for kind in sorted(kinds)))


def _kill_sandbox(self: RemoteBackend) -> None:
    """``SandboxKill`` (``toolseam ps --kill``, from its thread): the server ends the sandbox
    with everything in it, and this session's calls then fail; its close still ends the
    session there. Sent on a transport of its own to the same server (the session's address),
    so it waits for no event loop of the session's."""
    if self._info is None or self._closed or self._over is not None:
        return
    if not isinstance(self.transport, Reconnectable):
        raise ConfigurationError(f"{self.transport.where} cannot be reached from another "
                                 "thread: its sandbox is ended by closing the session")
    transport = transport_at(self.transport.durable_address())
    request: Request = (self.session_id, self._secret, "kill_sandbox", (), {})

    async def kill() -> Any:
        try:
            return await asyncio.wait_for(transport.call(request), KILL_WAIT_S)
        finally:
            await transport.close()

    answer = asyncio.run(kill())
    if answer[:1] == ("err",) and isinstance(answer[1], dict):
        raise map_seam_error(answer[1])


def _copy_back_error(self: RemoteBackend) -> CouldNotRunError | None:
    """What the hosted backend's close could not bring home (WorkspaceTransfer)."""
    return self._copy_back_error


def _branch_backend(self: RemoteBackend, workspace: str, snapshot_id: str
                    ) -> tuple[RemoteBackend, None]:
    """Branching: a new session of the same server and hosted kind, opened from the snapshot
    there (its files are the server's; ``workspace``, a directory here, stays empty). The
    child is the remote client itself (a subclass's constructor, ``RayBackend``'s, takes
    other arguments)."""
    return RemoteBackend(transport=self.transport.another(), hosted=self.hosted,
                         branch=snapshot_id), None


def _branch_home(self: RemoteBackend, root: str) -> None:
    """Branching: none here — the session's files are the server's, so ``keep()`` cannot
    bring a branch home on this machine (snapshot it and restore that instead)."""
    return None


def _home_stamps(self: RemoteBackend) -> None:
    return None


async def _ready_branch_home(self: RemoteBackend) -> None:
    return None  # no home here (``_branch_home``)


async def _keep_directly(self: RemoteBackend, home: object) -> None:
    return None  # never called: a remote branch has no home here


@functools.cache
def remote_class(capabilities: frozenset[str]) -> type[RemoteBackend]:
    """The client class for a hosted backend with ``capabilities``: the rows it answers as
    methods (and a workspace transfer's ``copy_back_error``); one class per set, so a
    capability is a fact of the class, as ``seam.capabilities.supports`` expects."""
    members: dict[str, Any] = {op.name: _forwarder(op) for op in ops.ops_for(capabilities)}
    if "WorkspaceTransfer" in capabilities:
        members["copy_back_error"] = property(_copy_back_error)
    if "SandboxKill" in capabilities:
        members["kill_sandbox"] = _kill_sandbox
    if "Branching" in capabilities:
        members.update(branch_backend=_branch_backend, branch_home=_branch_home,
                       home_stamps=_home_stamps, ready_branch_home=_ready_branch_home,
                       keep_directly=_keep_directly)
    members["capabilities"] = frozenset(ops.CAPABILITIES[name] for name in capabilities)
    members["capability_names"] = capabilities
    members["__doc__"] = RemoteBackend.__doc__
    return type("RemoteBackend", (RemoteBackend,), members)
