"""The node actor: one per Ray node, hosting every toolseam session of that node as an
ordinary local backend (so memory per sandbox is what it is locally; one worker process per
node, not per sandbox).

Every session answers only the holder of its secret (compared in constant time against its
hash): another job of the cluster can find this actor by name and call it, but cannot drive,
read or end a session it was not handed. A session whose holder stops renewing it for its
orphan timeout is closed (its containers removed) — a driver killed with SIGKILL loses nothing
before that, and leaves nothing after.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import os
import shutil
import tempfile
import time
from typing import Any, cast

from ..backends import engine_for
from ..backends.containers.janitor import janitor
from ..seam.capabilities import ResourceUsage, SandboxKill, supports
from ..seam.errors import CouldNotRunError, HostError
from ..seam.models import OutputChunk
from ..seam.protocol import WorkspaceTransfer
from ._wire import Answer, encode, pack_answer, unpack_call
from .direct import NodeServer
from .egress import NodeRelay
from .identity import KV_NAMESPACE, kv_key
from .node_config import NodeConfig
from .node_observe import NodeTelemetry
from .node_operator import NodeOperatorView
from .node_pool import NodePools
from .node_remote import REMOTE, REMOTE_LIVE, NodeRemote
from .node_session import (
    WORKSPACE_DIR,
    NodeSession,
    extract_archive,
    own_workdir,
    pack_dir,
    secret_hash,
    session_root,
    sweep_dead_roots,
)
from .node_shaped import ShapedSandboxes
from .node_shaped_direct import SHAPED_DIRECT, ProvenKey, key_of
from .streaming import LIVE_CALLS, LiveStarts

# The seam's methods a holder may call by name; nothing else of a backend is reachable.
SEAM_CALLS = frozenset({"start", "wait", "kill", "release", "stat", "read_text", "read_page",
                        "list_dir", "read_bytes", "write", "commit", "list_files", "grep"})


class NodeSessions(ShapedSandboxes, NodePools, NodeOperatorView, NodeRemote):
    """The node actor's body (made a Ray actor class in ``cluster.py``)."""

    def __init__(self) -> None:
        self._shaped_init()
        self._pools_init()
        self._operator_init()
        self.config = NodeConfig.from_env()
        import ray  # only ever made inside a Ray worker
        self.node_id = ray.get_runtime_context().get_node_id()
        self.where = f"node {self.config.name} ({self.node_id[:12]}, {self.config.describe()})"
        self._sessions: dict[str, NodeSession] = {}
        self._live = LiveStarts()
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
            return encode(HostError(f"{self.where} holds another node key"))
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
                "where": self.where, "pid": os.getpid(), "sessions": len(self._sessions),
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

    # --- sessions ------------------------------------------------------------------------
    def _session(self, sid: str, secret: str | ProvenKey) -> NodeSession:
        session = self._sessions.get(sid)
        # the same answer for "no such session" and "not yours": nothing to probe with
        if session is None or not hmac.compare_digest(session.hash, key_of(secret)):
            raise HostError(f"no session {sid[:8]}… on {self.where} answers this handle")
        session.seen = time.monotonic()
        return session

    async def open(self, sid: str, secret: str, image: str | None, limits: Any,
                   archive: bytes | None, orphan_timeout: float, trace: Any = None) -> Answer:
        """A new session's sandbox on this node (``trace``: its caller's span's context)."""
        return await self.telemetry.answer(trace, "open", sid, self._open(
            sid, secret, image, limits, archive, orphan_timeout))

    async def _open(self, sid: str, secret: str, image: str | None, limits: Any,
                    archive: bytes | None, orphan_timeout: float) -> Answer:
        if sid in self._sessions:
            return encode(HostError(f"session {sid[:8]}… exists on {self.where}"))
        root = session_root(self._workdir(), sid)
        workspace = os.path.join(root, WORKSPACE_DIR)
        try:
            os.mkdir(workspace, 0o755)
            if archive:
                await asyncio.to_thread(extract_archive, archive, workspace)
            backend = self.config.make(workspace, image, limits)
            info = await backend.open()
        except CouldNotRunError as exc:
            shutil.rmtree(root, ignore_errors=True)
            return encode(CouldNotRunError(f"{self.where}: {exc.reason}", exc.retryable,
                                           exc.cause))
        except Exception as exc:  # noqa: BLE001 - every failure is an answer, never a Ray error
            shutil.rmtree(root, ignore_errors=True)
            return encode(exc)
        self._sessions[sid] = NodeSession(secret_hash(secret), backend, root, orphan_timeout)
        self.telemetry.session_opened()
        return ("ok", info)

    async def egress(self, sid: str, secret: str, caller: tuple[str, int], token: str,
                     ca_pem: str | None) -> Answer:
        """Egress mode for a session (``egress.py``): its backend's agent listens inside, and
        each connection goes to the caller's proxy at ``caller`` with ``token``."""
        try:
            session = self._session(sid, secret)
            open_egress = getattr(session.backend, "open_egress", None)
            if open_egress is None:
                raise HostError(f"{self.where}: its backend has no agent channel for egress")
            relay = NodeRelay((str(caller[0]), int(caller[1])), str(token),
                              functools.partial(self._held, sid))
            return ("ok", await open_egress(relay.serve, ca_pem, None))
        except Exception as exc:  # noqa: BLE001 - every failure is an answer, never a Ray error
            return encode(exc)

    async def attach(self, sid: str, secret: str) -> Answer:
        try:
            session = self._session(sid, secret)
            # open is idempotent: the info of the running sandbox; the orphan timeout tells
            # the new holder how often to renew
            return ("ok", (await session.backend.open(), session.orphan_timeout))
        except Exception as exc:  # noqa: BLE001
            return encode(exc)

    def _held(self, sid: str) -> bool:
        """The session is open and its holder renewed it lately (two renewals may be missed:
        the holder renews every third of its orphan timeout) — an egress relay's condition."""
        session = self._sessions.get(sid)
        return session is not None and (
            session.calls > 0 or time.monotonic() - session.seen < session.orphan_timeout * 0.75)

    def _key_for(self, sid: str) -> bytes | None:
        """A session's key, for a direct connection's proofs (direct.py); None: no session."""
        session = self._sessions.get(sid)
        return self._remote_key(sid) if session is None else session.hash

    async def call(self, sid: str, secret: str, method: str, args: tuple[Any, ...],
                   trace: Any = None) -> Answer:
        try:
            self._session(sid, secret)
        except HostError as exc:
            return encode(exc)
        return await self.call_held(sid, method, args, trace)

    async def call_held(self, sid: str, method: str, args: tuple[Any, ...],
                        trace: Any = None) -> Answer:
        """A seam call of session ``sid``, whose holder proved its key (a Ray call's secret
        checked by ``call``, a direct connection's proofs by direct.py); ``trace``: the
        caller's span's context, when it traces (a ``TraceContext`` the codec validated)."""
        if method == REMOTE:  # a remote session's request, spanned by its op (node_remote.py)
            return await self.remote_direct(sid, args, trace)
        if method == REMOTE_LIVE:  # a step of a remote session's streamed request
            return await self.remote_live_direct(sid, args, trace)
        return await self.telemetry.answer(trace, method, sid, self._call_held(sid, method, args))

    async def _call_held(self, sid: str, method: str, args: tuple[Any, ...]) -> Answer:
        if method in SHAPED_DIRECT:  # a Ray-shaped sandbox's call on the direct port
            key = self._key_for(sid)
            if key is None:
                return encode(HostError(
                    f"no sandbox {sid[:8]}… on {self.where} answers this handle"))
            return await self.shaped_call(sid, ProvenKey(key), method, args)
        if method not in SEAM_CALLS and method not in LIVE_CALLS:
            return encode(HostError(f"{method!r} is not a seam call"))
        session = self._sessions.get(sid)
        if session is None:
            return encode(HostError(f"no session {sid[:8]}… on {self.where} answers this handle"))
        session.seen = time.monotonic()
        if session.toolkit is not None:  # its toolkit owns the backend's jobs
            return encode(HostError(f"session {sid[:8]}… is a Ray-shaped sandbox"))
        if session.killed:
            return encode(CouldNotRunError(f"{self.where}: the sandbox was ended from outside "
                                           "(toolseam ps --kill)", False, "sandbox_lost"))
        session.calls += 1
        session.served += 1
        try:
            if method == "start":
                chunks: list[OutputChunk] = []
                request = args[0]
                status = await session.backend.start(
                    request, chunks.append if getattr(request, "stream", False) else None)
                return ("ok", (status, chunks))
            if method in LIVE_CALLS:  # a streamed start's long poll (streaming.py)
                return ("ok", await self._live.call(sid, session.backend, method, args))
            return ("ok", await getattr(session.backend, method)(*args))
        except Exception as exc:  # noqa: BLE001
            return encode(exc)
        finally:
            session.calls -= 1
            session.seen = time.monotonic()

    async def call_packed(self, payload: bytes) -> bytes:
        """``call`` as Ray carries it (a session without the direct path, direct.py): its
        arguments and answer as bytes (_wire.py)."""
        try:
            sid, secret, method, args, trace = unpack_call(payload)
        except Exception as exc:  # noqa: BLE001 - a malformed payload is an answer too
            return pack_answer(encode(HostError(f"not a toolseam call ({type(exc).__name__})")))
        return pack_answer(await self.call(sid, secret, method, args, trace))

    async def touch(self, sid: str, secret: str) -> Answer:
        try:
            self._session(sid, secret)
            return ("ok", None)
        except HostError as exc:
            return encode(exc)

    async def sync(self, sid: str, secret: str) -> Answer:
        """The sandbox's workspace as a tar whose first entry is the workspace directory."""
        try:
            session = self._session(sid, secret)
            if isinstance(session.backend, WorkspaceTransfer):
                await session.backend.sync()
            return ("ok", await asyncio.to_thread(pack_dir, session.workspace))
        except Exception as exc:  # noqa: BLE001
            return encode(exc)

    async def upload(self, sid: str, secret: str, archive: bytes, dest: str) -> Answer:
        """``archive`` holds one entry (file or dir) named ``upload``; it lands as ``dest``."""
        try:
            session = self._session(sid, secret)
            with tempfile.TemporaryDirectory(dir=self._workdir()) as spool:
                await asyncio.to_thread(extract_archive, archive, spool)
                local = os.path.join(spool, "upload")
                if isinstance(session.backend, WorkspaceTransfer):
                    await session.backend.upload(local, dest)
                else:  # the host backend: its workspace is the node dir itself
                    target = os.path.join(session.workspace, dest)
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    shutil.move(local, target)
            return ("ok", None)
        except Exception as exc:  # noqa: BLE001
            return encode(exc)

    async def download(self, sid: str, secret: str, src: str) -> Answer:
        try:
            session = self._session(sid, secret)
            with tempfile.TemporaryDirectory(dir=self._workdir()) as spool:
                local = os.path.join(spool, "download")
                if isinstance(session.backend, WorkspaceTransfer):
                    await session.backend.download(src, local)
                else:
                    shutil.copytree(os.path.join(session.workspace, src), local, symlinks=True) \
                        if os.path.isdir(os.path.join(session.workspace, src)) else \
                        shutil.copy2(os.path.join(session.workspace, src), local)
                return ("ok", await asyncio.to_thread(pack_dir, local, "download"))
        except Exception as exc:  # noqa: BLE001
            return encode(exc)

    async def usage(self, sid: str, secret: str) -> Answer:
        """The session's sandbox's usage now (``seam.capabilities.ResourceUsage``) as plain
        figures: CPU seconds, memory now, memory peak, pids (None: not measured)."""
        try:
            backend = self._session(sid, secret).backend
            if not supports(backend, ResourceUsage):
                return ("ok", (None, None, None, None))
            used = await cast(ResourceUsage, backend).resource_usage()
            return ("ok", (used.cpu_seconds, used.memory_bytes, used.memory_peak_bytes,
                           used.pids))
        except Exception as exc:  # noqa: BLE001
            return encode(exc)

    async def kill_sandbox(self, sid: str, secret: str) -> Answer:
        """End the session's sandbox with everything in it (``toolseam ps --kill``, asked by
        its holder): its calls answer ``sandbox_lost`` from now on; its holder's close ends
        the session here."""
        try:
            session = self._session(sid, secret)
            backend = session.toolkit.backend if session.toolkit is not None else session.backend
            if not supports(backend, SandboxKill):
                return encode(HostError(f"{self.where}: its sandboxes cannot be ended from "
                                        "outside"))
            session.killed = True
            await asyncio.to_thread(cast(SandboxKill, backend).kill_sandbox)  # an engine's remove blocks
            return ("ok", True)
        except Exception as exc:  # noqa: BLE001
            return encode(exc)

    async def close(self, sid: str, secret: str, bring_back: bool, trace: Any = None) -> Answer:
        """End the session; with ``bring_back`` the workspace comes back as ``sync`` gives it
        (after the sandbox's own copy-back to the node dir)."""
        return await self.telemetry.answer(trace, "close", sid,
                                           self._close(sid, secret, bring_back))

    async def _close(self, sid: str, secret: str, bring_back: bool) -> Answer:
        try:
            session = self._session(sid, secret)
        except HostError as exc:
            return encode(exc)
        del self._sessions[sid]
        self._live.cancel(sid)
        self.telemetry.session_ended()
        try:
            await session.backend.close()
            failure = getattr(session.backend, "copy_back_error", None)
            if failure is not None:
                return encode(CouldNotRunError(f"{self.where}: {failure.reason}", False,
                                               "copy_back_failed"))
            if bring_back:
                return ("ok", await asyncio.to_thread(pack_dir, session.workspace))
            return ("ok", None)
        except Exception as exc:  # noqa: BLE001
            return encode(exc)
        finally:
            shutil.rmtree(session.root, ignore_errors=True)

    async def stats(self) -> dict[str, Any]:
        """Counts, this process's memory and CPU seconds (for the benchmark); no session is
        named."""
        import psutil
        me = psutil.Process()
        info, cpu = me.memory_full_info(), me.cpu_times()
        return {"sessions": len(self._sessions), "rss": info.rss, "uss": info.uss,
                "remote_sessions": 0 if self._remote_server is None else self._remote_server.sessions,
                "cpu_s": cpu.user + cpu.system,
                "warm": sum(pool.warm for pool in self._pools.values())}

    # --- orphans -------------------------------------------------------------------------
    async def _reap(self) -> None:
        """End what nobody renewed for its orphan timeout, and Ray-shaped sandboxes past
        their ttl_seconds (even in a call: ttl is wall-clock, as Ray's)."""
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            with contextlib.suppress(Exception):  # a remote session's close never stops this
                await self._reap_remote(now)
            for sid, session in list(self._sessions.items()):
                orphaned = session.calls == 0 and now - session.seen > session.orphan_timeout
                expired = session.expires is not None and now > session.expires
                if not (orphaned or expired):
                    continue
                self._sessions.pop(sid, None)
                self._live.cancel(sid)
                if session.toolkit is not None:
                    await self._end_shaped(sid, session)
                    continue
                self.telemetry.session_ended()
                with contextlib.suppress(Exception):
                    await session.backend.close()
                shutil.rmtree(session.root, ignore_errors=True)

    def _workdir(self) -> str:
        return own_workdir(self.config.workdir)
