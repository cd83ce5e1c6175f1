"""``RayBackend``: the seam, forwarded to the node actor that hosts the session.

The caller's side holds the session's handle (node, session id, secret) and the workspace's
copy baseline; the node holds the sandbox. The workspace travels as in copy mode: a tar of
the base dir at open (none for an image-only workspace), the sandbox's workspace back at
``sync``/``close``, applied by ``WorkspaceCopy`` — the same copy-back rule as a remote engine's.
Tool calls go on the session's direct connection to its node actor (direct.py), the rest —
and every call where that connection cannot be made — through Ray actor calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import secrets
import shutil
import tarfile
import tempfile
import uuid
from typing import Any, Literal

from ..backends.containers.workspace_sync.policy import DEFAULT_COPY_LIMIT
from ..backends.containers.workspace_sync.tar_sync import WorkspaceCopy
from ..observability.across import outgoing
from ..policy.limits import SandboxLimits
from ..seam.capabilities import Egress, ResourceUsage, SandboxKill, SandboxUsage
from ..seam.errors import ConfigurationError, CouldNotRunError, SessionClosedError
from ..seam.models import (
    ByteContent,
    ChangeSet,
    CommitResult,
    DirListing,
    FileListing,
    FileStat,
    GlobMatch,
    GrepListing,
    JobStatus,
    PageRequest,
    PathRef,
    SandboxInfo,
    SpawnRequest,
    SyncReport,
    TextContent,
    TextPage,
    WriteResult,
)
from ..seam.protocol import OutputCallback, WorkspaceTransfer
from . import cluster
from ._wire import decode, pack_call, unpack_answer
from .direct import DirectLink, Dropped
from .egress import NOT_CAPTURED, CallerEnd, Serve
from .handshake import session_key
from .placement import Placement
from .streaming import caller_live

HANDLE_PREFIX = "toolseam-ray:"
DEFAULT_ORPHAN_TIMEOUT_S = 600.0
DROP_PROBE_S = 5.0  # a dropped direct connection: how long the node actor may take to answer
KILL_WAIT_S = 30.0  # toolseam ps --kill: the node's engine removing a container can take a while


class RayBackend:
    """``RayBackend(workspace, image=…, resources={…}, strategy="spread", address=…)``: one
    sandbox on a node of a Ray cluster, run by that node's own engine."""

    name = "ray"
    capabilities = frozenset({Egress, WorkspaceTransfer, ResourceUsage, SandboxKill})
    # not seam.capabilities.DurableSessions: a Ray session outlives its driver by its handle
    durable_instead = ("a Ray session outlives its driver by its own handle: "
                       "RayBackend(orphan_timeout=…), backend.handle, RayBackend.attach(handle)")

    def __init__(self, workspace: str | None = None, *, image: str | None = None,
                 resources: dict[str, float] | None = None,
                 strategy: Literal["spread", "pack"] = "spread", address: str | None = None,
                 node: str | None = None, limits: SandboxLimits | None = None,
                 orphan_timeout: float = DEFAULT_ORPHAN_TIMEOUT_S,
                 copy_limit: int | None = None, direct: bool = True) -> None:
        if strategy not in ("spread", "pack"):
            raise ConfigurationError(f"strategy must be 'spread' or 'pack', got {strategy!r}")
        if orphan_timeout <= 0:
            raise ConfigurationError(f"orphan_timeout must be positive, got {orphan_timeout}")
        self.workspace = os.path.abspath(workspace) if workspace else None
        self.image = image
        self.placement = Placement(dict(resources or {}), strategy, node)
        self.address = address
        self.limits = limits
        self.network = limits.network if limits is not None else "none"
        self.orphan_timeout = orphan_timeout
        self._copy = (WorkspaceCopy(self.workspace, copy_limit or DEFAULT_COPY_LIMIT)
                      if self.workspace else None)
        self.session_id = uuid.uuid4().hex
        self._secret = secrets.token_urlsafe(32)
        self.node_id: str | None = None
        self.where = "a Ray node"
        self._actor: Any = None
        self._ray: Any = None
        self._info: SandboxInfo | None = None
        self._opening = asyncio.Lock()
        self._closed = False
        self._over: CouldNotRunError | None = None
        self._copy_back_error: CouldNotRunError | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self.direct = direct  # tool calls on a direct connection to the node (direct.py)
        self._link: DirectLink | None = None
        self._egress: CallerEnd | None = None  # egress mode: the caller's end (egress.py)
        self._egress_at: tuple[str, int] = ("", 0)

    # --- handles -------------------------------------------------------------------------
    @property
    def handle(self) -> str:
        """Where the session lives and the secret that drives it: keep it as a password."""
        if self.node_id is None:
            raise SessionClosedError("the session is not open yet: it has no handle")
        return f"{HANDLE_PREFIX}{self.node_id}:{self.session_id}:{self._secret}"

    @classmethod
    def attach(cls, handle: str, *, address: str | None = None,
               orphan_timeout: float = DEFAULT_ORPHAN_TIMEOUT_S) -> RayBackend:
        """The session ``handle`` names, driven from this process (its jobs go on). The
        workspace stays in the sandbox: ``download`` what you need."""
        parts = handle.removeprefix(HANDLE_PREFIX).split(":")
        if not handle.startswith(HANDLE_PREFIX) or len(parts) != 3 or not all(parts):
            raise ConfigurationError("not a toolseam Ray session handle")
        made = cls(address=address, node=parts[0], orphan_timeout=orphan_timeout)
        made.session_id, made._secret = parts[1], parts[2]
        made._attaching = True
        return made

    _attaching = False

    # --- lifecycle -----------------------------------------------------------------------
    @property
    def info(self) -> SandboxInfo | None:
        return self._info

    async def open(self) -> SandboxInfo:
        if self._info is not None:
            return self._info
        if self._closed:
            raise SessionClosedError("the ray backend was closed")
        async with self._opening:
            if self._info is None:
                self._info = await self._open()
                self._heartbeat = asyncio.ensure_future(self._renew())
                await self._connect_direct()
        return self._info

    async def _open(self) -> SandboxInfo:
        ray = self._ray = cluster.ray_module()
        if ray.is_initialized():  # the usual case: no thread hop per session
            cluster.connect(self.address)
        else:
            await asyncio.to_thread(cluster.connect, self.address)
        node_id, self._actor = await asyncio.to_thread(self.placement.reach, ray)
        self.node_id, self.where = node_id, f"Ray node {node_id[:12]}"
        self.where = await cluster.node_where(node_id, self._ray_call(self._actor.ready.remote()))
        if self._attaching:  # renewed as often as the session's own orphan timeout asks
            answer = await self._ray_call(self._actor.attach.remote(self.session_id, self._secret))
            attached: SandboxInfo
            attached, self.orphan_timeout = decode(answer, self.where)
            return attached.model_copy(update={"local": False})
        else:
            archive = await asyncio.to_thread(self._pack) if self._copy is not None else None
            answer = await self._ray_call(self._actor.open.remote(
                self.session_id, self._secret, self.image, self.limits, archive,
                self.orphan_timeout, outgoing()))
        info: SandboxInfo = decode(answer, self.where)
        opened: SandboxInfo = info.model_copy(update={"local": False})
        return opened

    async def _connect_direct(self) -> None:
        """The session's direct connection, where its node offers one (else Ray calls)."""
        at = cluster.node_direct(self.node_id or "") if self.direct else None
        if at is not None:
            self._link = await DirectLink.connect(at[0], at[1], self.session_id,
                                                  session_key(self._secret))
            if self._link is None:  # unreachable from here: later sessions do not wait for it
                cluster.no_direct(self.node_id or "")

    @property
    def direct_connected(self) -> bool:
        """Tool calls go on a direct connection to the node now (not through Ray)."""
        return self._link is not None and self._link.alive

    def _pack(self) -> bytes:
        assert self._copy is not None
        out = io.BytesIO()
        self._copy.pack(out)
        return out.getvalue()

    async def _renew(self) -> None:
        """Tell the node this session is held, so its orphan timeout does not end it."""
        while True:
            await asyncio.sleep(self.orphan_timeout / 3)
            with contextlib.suppress(Exception):
                await self._actor.touch.remote(self.session_id, self._secret)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self._link is not None:
            self._link.close()
        if self._egress is not None:
            await self._egress.close()
        if self._info is None or self._over is not None:
            return
        try:
            answer = await self._ray_call(self._actor.close.remote(
                self.session_id, self._secret, self._copy is not None, outgoing()))
            archive = decode(answer, self.where)
            if archive is not None:
                await asyncio.to_thread(self._apply, archive)
        except CouldNotRunError as failure:
            self._copy_back_error = failure
        except Exception as exc:  # noqa: BLE001 - close never raises; Toolkit.close reports
            self._copy_back_error = CouldNotRunError(f"{self.where}: {exc}", retryable=False,
                                                     cause="copy_back_failed")

    async def open_egress(self, serve: Serve, ca_pem: str | None,
                          ports_for: Any = None) -> dict[str, object]:
        """Egress mode (``egress.py``): the sandbox's connections come to this process's
        proxy (``serve``) from the node, each with the session's egress token. Captured
        connections are not offered (``capture`` says so)."""
        await self.open()
        end = self._egress or CallerEnd(serve)
        if self._egress is None:
            host = str(self._ray.util.get_node_ip_address())
            self._egress_at = await end.start(host)
            self._egress = end
        answer = await self._ray_call(self._actor.egress.remote(
            self.session_id, self._secret, self._egress_at, end.token, ca_pem))
        where: dict[str, object] = dict(decode(answer, self.where))
        where["capture"] = NOT_CAPTURED
        return where

    # --- observability: toolseam ps, the session's report ---------------------------------
    async def resource_usage(self) -> SandboxUsage:
        """``seam.capabilities.ResourceUsage``: the sandbox's usage as its node's engine
        measures it; nothing measured when the session is not open or its node is gone."""
        if self._info is None or self._closed or self._over is not None:
            return SandboxUsage()
        try:
            answer = decode(await self._ray_call(self._actor.usage.remote(
                self.session_id, self._secret)), self.where)
        except (CouldNotRunError, SessionClosedError):
            return SandboxUsage()
        return usage_of(answer)

    def kill_sandbox(self) -> None:
        """``seam.capabilities.SandboxKill`` (``toolseam ps --kill``, from its thread): the
        node ends the sandbox with everything in it, and this session's calls then answer
        ``sandbox_lost``; its close still ends the session on the node."""
        if self._info is None or self._closed or self._over is not None:
            return
        answer = self._ray.get(self._actor.kill_sandbox.remote(self.session_id, self._secret),
                               timeout=KILL_WAIT_S)
        decode(answer, self.where)

    @property
    def copy_back_error(self) -> CouldNotRunError | None:
        return self._copy_back_error

    @property
    def closed(self) -> bool:
        return self._closed

    # --- calls ---------------------------------------------------------------------------
    async def _ray_call(self, ref: Any) -> Any:
        """Await one actor call; a lost node or actor is the session's end, saying the call
        may have run there (it was sent) — never a success and never asked again."""
        try:
            return await ref
        except asyncio.CancelledError:
            self._ray.cancel(ref)  # an async actor call is cancelled in the node's loop
            raise
        except cluster.ray_failures(self._ray) as exc:
            raise self._lost(exc) from None

    def _lost(self, exc: BaseException) -> CouldNotRunError:
        """The session's end when its node or actor is gone under a call."""
        if self._over is None:
            self._over = CouldNotRunError(
                f"{self.where} was lost ({type(exc).__name__}); the call may have run "
                "there; this session is over (its sandbox went with the node): start a "
                "new one", retryable=False, cause="sandbox_lost")
            cluster.forget_actor(self.node_id or "", lost=_node_died(exc))
        return self._over

    async def _call(self, method: str, *args: Any) -> Any:
        if self._closed:
            raise SessionClosedError("the ray backend was closed")
        if self._info is None:
            await self.open()
        if self._over is not None:
            raise self._over
        link = self._link
        trace = outgoing()  # the node's spans continue the caller's trace (decision 390)
        if link is not None and link.alive:
            try:
                return decode(await link.call(method, args, trace), self.where)
            except Dropped:
                raise await self._dropped() from None
        answer = await self._ray_call(self._actor.call_packed.remote(
            pack_call(self.session_id, self._secret, method, args, trace)))
        return decode(unpack_answer(answer), self.where)

    async def _dropped(self) -> CouldNotRunError:
        """The direct connection ended under a call. Ray says whether the node actor is still
        there: gone (or silent for ``DROP_PROBE_S``), the session is over as on the Ray path;
        there, only this call failed (it may have run) and the next goes through Ray."""
        self._link = None
        probe = self._actor.ready.remote()
        try:
            await asyncio.wait_for(self._ray_call(probe), DROP_PROBE_S)
        except TimeoutError:
            return self._lost(TimeoutError("no answer from its node actor"))
        except CouldNotRunError as over:
            return over
        return CouldNotRunError(f"the direct connection to {self.where} dropped; the call may "
                                "have run there", retryable=False)

    async def start(self, request: SpawnRequest, on_output: OutputCallback | None = None
                    ) -> JobStatus:
        if on_output is not None and request.stream:  # live: a streaming call (streaming.py)
            return await self._start_streaming(request, on_output)
        status, chunks = await self._call("start", request)
        if on_output is not None:  # the node's chunks, in their order, before the status
            for chunk in chunks:
                on_output(chunk)
        result: JobStatus = status
        return result

    async def _start_streaming(self, request: SpawnRequest, on_output: OutputCallback
                               ) -> JobStatus:
        result: JobStatus = await caller_live(self._call, request, on_output, self.where)
        return result

    async def wait(self, job: str, wait_ms: int | None) -> JobStatus:
        result: JobStatus = await self._call("wait", job, wait_ms)
        return result

    async def kill(self, job: str) -> JobStatus:
        result: JobStatus = await self._call("kill", job)
        return result

    async def release(self, job: str) -> None:
        if not self._closed:
            await self._call("release", job)

    async def stat(self, ref: PathRef) -> FileStat:
        result: FileStat = await self._call("stat", ref)
        return result

    async def read_text(self, ref: PathRef, offset: int | None = None, limit: int | None = None,
                        refuse_above_bytes: int | None = None) -> TextContent:
        result: TextContent = await self._call("read_text", ref, offset, limit,
                                               refuse_above_bytes)
        return result

    async def read_page(self, ref: PathRef, page: PageRequest) -> TextPage:
        result: TextPage = await self._call("read_page", ref, page)
        return result

    async def list_dir(self, ref: PathRef, cap: int) -> DirListing:
        result: DirListing = await self._call("list_dir", ref, cap)
        return result

    async def read_bytes(self, ref: PathRef, refuse_above_bytes: int | None = None
                         ) -> ByteContent:
        result: ByteContent = await self._call("read_bytes", ref, refuse_above_bytes)
        return result

    async def write(self, ref: PathRef, data: bytes, keep_bom: bool = False) -> WriteResult:
        result: WriteResult = await self._call("write", ref, data, keep_bom)
        return result

    async def commit(self, change: ChangeSet) -> CommitResult:
        result: CommitResult = await self._call("commit", change)
        return result

    async def list_files(self, ref: PathRef, match: GlobMatch | None = None) -> FileListing:
        result: FileListing = await self._call("list_files", ref, match)
        return result

    async def grep(self, ref: PathRef, pattern: str, include: GlobMatch | None = None,
                   deadline_ms: int | None = None) -> GrepListing:
        result: GrepListing = await self._call("grep", ref, pattern, include, deadline_ms)
        return result

    # --- the workspace -------------------------------------------------------------------
    async def sync(self) -> SyncReport:
        """Bring the sandbox's changes home to the base dir now (the copy-back rule)."""
        if self._copy is None:
            return SyncReport()
        await self._call_checked()
        answer = await self._ray_call(self._actor.sync.remote(self.session_id, self._secret))
        archive: bytes = decode(answer, self.where)
        return await asyncio.to_thread(self._apply, archive)

    def _apply(self, archive: bytes) -> SyncReport:
        assert self._copy is not None
        with self._copy.spool([archive], "the sandbox's workspace") as spool:
            return self._copy.apply(spool, source=f"the sandbox on {self.where}")

    async def _call_checked(self) -> None:
        if self._closed:
            raise SessionClosedError("the ray backend was closed")
        await self.open()
        if self._over is not None:
            raise self._over

    async def upload(self, local: str, dest: str) -> None:
        """Copy a file or directory of this machine into the sandbox's workspace as ``dest``."""
        if not os.path.lexists(local):
            raise ConfigurationError(f"upload: {local} does not exist")
        await self._call_checked()
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            tar.add(local, arcname="upload")
        answer = await self._ray_call(self._actor.upload.remote(
            self.session_id, self._secret, out.getvalue(), dest))
        decode(answer, self.where)

    async def download(self, src: str, local: str) -> None:
        """Copy a workspace file or directory to ``local`` here (which must not exist)."""
        if os.path.lexists(local):
            raise ConfigurationError(f"download: {local} exists")
        await self._call_checked()
        answer = await self._ray_call(self._actor.download.remote(
            self.session_id, self._secret, src))
        archive: bytes = decode(answer, self.where)
        parent = os.path.dirname(os.path.abspath(local))
        with tempfile.TemporaryDirectory(dir=parent) as spool:
            with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
                tar.extractall(spool, filter="data")
            shutil.move(os.path.join(spool, "download"), local)


def usage_of(figures: Any) -> SandboxUsage:
    """A node's ``usage`` answer as ``SandboxUsage``; a figure that is not a number is not
    measured (a node actor may not be ours: nothing but numbers is taken)."""
    def number(value: Any, kind: type[Any]) -> Any:
        return kind(value) if isinstance(value, int | float) and not isinstance(value, bool) \
            else None

    cpu, memory, peak, pids = (tuple(figures) + (None,) * 4)[:4] \
        if isinstance(figures, tuple | list) else (None,) * 4
    return SandboxUsage(cpu_seconds=number(cpu, float), memory_bytes=number(memory, int),
                        memory_peak_bytes=number(peak, int), pids=number(pids, int))


def _node_died(exc: BaseException) -> bool:
    """Ray says the actor's node died (not only the actor's process)."""
    return "node" in type(exc).__name__.lower() or "its node has died" in str(exc)
