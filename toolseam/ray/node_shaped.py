"""The node actor's side of ``toolseam.ray.create`` (Ray's own sandbox shape): each such
sandbox is a ``Toolkit`` over the node's engine, hosted by the one node actor like every other
session (its secret, its orphan timeout), plus a wall-clock ``ttl_seconds``.

Unlike the seam's calls these raise: Ray-shaped code catches exceptions from ``ray.get``
(``FileNotFoundError`` for a missing file; ``SandboxError`` kinds for the sandbox itself).

``exec``, ``read_file`` and ``write_file`` also come on the node's direct port
(node_shaped_direct.py, decision 340).
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import shutil
import time
from collections import OrderedDict
from typing import Any

from ..seam.errors import CouldNotRunError, HostError
from ..session.toolkit import Toolkit
from .node_session import NodeSession, session_root
from .node_shaped_direct import ProvenKey, ShapedDirectCalls, key_of
from .shaped_types import (
    ExecResult,
    SandboxCreationError,
    SandboxExecError,
    SandboxNotFoundError,
    SandboxStatus,
    SandboxTimeoutError,
)

ENDED_KEPT = 4096  # ended sandboxes still answering get_status() -> TERMINATED


class ShapedSandboxes(ShapedDirectCalls):
    """``_after``: the caller passes the creation's ObjectRef, so Ray runs a call only once
    the creation is over (an async actor's calls are not run in the order sent), and a
    failed creation fails the call with its own error.

    Mixed into ``NodeSessions`` (node.py), which provides the sessions table, the secret
    check and the node's engine configuration."""

    _sessions: dict[str, Any]
    config: Any
    where: str
    node_id: str

    def _workdir(self) -> str:  # node.py
        raise NotImplementedError

    def _session(self, sid: str, secret: str | ProvenKey) -> Any:  # node.py: checked
        raise NotImplementedError

    def _shaped_init(self) -> None:
        self._pending: dict[str, tuple[bytes, asyncio.Future[None]]] = {}
        # ended sandboxes: the hash of their secret, and the failure that ended a creation
        self._ended: OrderedDict[str, tuple[bytes, SandboxCreationError | None]] = OrderedDict()
        self._direct_init()

    async def sb_open(self, sid: str, secret: str, image: str | None, limits: Any,
                      env: dict[str, str] | None, workdir: str | None,
                      ttl_seconds: float | None, orphan_timeout: float) -> None:
        if sid in self._sessions or sid in self._pending:
            raise SandboxCreationError(f"sandbox {sid[:8]}… exists on {self.where}")
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[sid] = (key_of(secret), ready)
        root = session_root(self._workdir(), sid)
        workspace = os.path.join(root, "workspace")
        try:
            os.mkdir(workspace, 0o755)
            backend = self.config.make(workspace, image, limits)
            toolkit = Toolkit(backend, env_extra=env or {})
            await toolkit.open()
            if workdir:  # commands start there, relative paths are from there
                workdir = posixpath.join(toolkit.base_dir, workdir)
                await toolkit.sandbox.exec(["mkdir", "-p", workdir])
            session = NodeSession(key_of(secret), backend, root, orphan_timeout)
            session.toolkit = toolkit
            session.workdir = workdir or toolkit.base_dir
            session.expires = (time.monotonic() + ttl_seconds
                               if ttl_seconds and ttl_seconds > 0 else None)
            self._sessions[sid] = session
            ready.set_result(None)
        except BaseException as exc:  # noqa: BLE001 - every failure ends the creation
            shutil.rmtree(root, ignore_errors=True)
            failure = SandboxCreationError(f"{self.where}: {_reason(exc)}")
            self._remember_end(sid, key_of(secret), failure)
            ready.set_exception(failure)
            ready.exception()  # retrieved: nobody else may be waiting
            raise failure from None
        finally:
            self._pending.pop(sid, None)

    async def _shaped(self, sid: str, secret: str | ProvenKey) -> Any:
        """The sandbox's session, once its (maybe still running) creation is over."""
        pending = self._pending.get(sid)
        if pending is not None and pending[0] == key_of(secret):
            await asyncio.shield(pending[1])
        ended = self._ended.get(sid)
        if ended is not None and ended[0] == key_of(secret) and ended[1] is not None:
            raise ended[1]  # its creation failed: say why again
        try:
            session = self._session(sid, secret)
        except HostError:
            raise SandboxNotFoundError(f"sandbox {sid[:8]}… on {self.where}: no sandbox "
                                       "answers this handle (deleted, expired or never made)"
                                       ) from None
        if session.toolkit is None:
            raise SandboxNotFoundError(f"session {sid[:8]}… is not a Ray-shaped sandbox")
        return session

    async def sb_exec(self, sid: str, secret: str | ProvenKey, command: str | list[str],
                      timeout: float | None, cwd: str | None, env: dict[str, str] | None,
                      shell: str | None, _after: Any = None) -> ExecResult:
        session = await self._shaped(sid, secret)
        argv = [shell or "/bin/bash", "-c", command] if isinstance(command, str) else command
        session.calls += 1
        session.served += 1
        began = time.perf_counter()
        try:
            result = await session.toolkit.sandbox.exec(
                argv, cwd=posixpath.join(session.workdir, cwd or "."), env=env, timeout=timeout)
        except CouldNotRunError as exc:
            raise SandboxExecError(f"{self.where}: {exc.reason}") from None
        finally:
            session.calls -= 1
            session.seen = time.monotonic()
        # measured here, in seconds: the command's own count is whole milliseconds (0 for a
        # quick command); this is the command as the sandbox ran it, its spawn included
        took = time.perf_counter() - began
        if result.timed_out:
            raise SandboxTimeoutError(f"{argv[0]}: killed after its timeout of {timeout} s")
        code = result.exit_code if result.exit_code is not None else 128 + (result.signal or 0)
        return ExecResult(code, result.stdout, result.stderr, took)

    async def sb_read_file(self, sid: str, secret: str | ProvenKey, path: str,
                           _after: Any = None) -> bytes:
        session = await self._shaped(sid, secret)
        try:
            data: bytes = await session.toolkit.sandbox.read_bytes(
                posixpath.join(session.workdir, path), limit=1 << 31)
        except CouldNotRunError as exc:
            raise SandboxExecError(f"{self.where}: {exc.reason}") from None
        return data

    async def sb_write_file(self, sid: str, secret: str | ProvenKey, path: str,
                            content: str | bytes, _after: Any = None) -> None:
        session = await self._shaped(sid, secret)
        try:
            await session.toolkit.sandbox.write_bytes(posixpath.join(session.workdir, path),
                                                      content)
        except CouldNotRunError as exc:
            raise SandboxExecError(f"{self.where}: {exc.reason}") from None

    async def sb_status(self, sid: str, secret: str) -> SandboxStatus:
        ended = self._ended.get(sid)
        if ended is not None and ended[0] == key_of(secret):
            return SandboxStatus.TERMINATED if ended[1] is None else SandboxStatus.ERROR
        pending = self._pending.get(sid)
        if pending is not None and pending[0] == key_of(secret):
            return SandboxStatus.PENDING
        await self._shaped(sid, secret)
        return SandboxStatus.RUNNING

    async def sb_delete(self, sid: str, secret: str, _after: Any = None) -> None:
        ended = self._ended.get(sid)
        if ended is not None and ended[0] == key_of(secret):
            return  # deleting twice (or what never came up) is fine, as Ray's
        session = await self._shaped(sid, secret)
        self._sessions.pop(sid, None)
        await self._end_shaped(sid, session)

    def _remember_end(self, sid: str, hashed: bytes,
                      failure: SandboxCreationError | None = None) -> None:
        self._ended[sid] = (hashed, failure)
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    async def _end_shaped(self, sid: str, session: Any) -> None:
        self._remember_end(sid, session.hash)
        try:
            await session.toolkit.close()
        except Exception:  # noqa: BLE001 - an image-only sandbox has nothing to bring back
            pass
        finally:
            shutil.rmtree(session.root, ignore_errors=True)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, CouldNotRunError):
        return exc.reason
    return f"{type(exc).__name__}: {exc}"
