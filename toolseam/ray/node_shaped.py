"""The node actor's side of ``toolseam.ray.create`` (Ray's own sandbox shape): each such
sandbox is a ``Toolkit`` over the node's engine, hosted by the one node actor like every other
session (its secret, its orphan timeout), plus a wall-clock ``ttl_seconds``.

Unlike the seam's calls these raise: Ray-shaped code catches exceptions from ``ray.get``
(``FileNotFoundError`` for a missing file; ``SandboxError`` kinds for the sandbox itself).

``exec``, ``read_file`` and ``write_file`` also come on the node's direct port
(``shaped_call``; the caller's side is shaped_direct.py, decision 340): each such call's
outcome is kept under its token until it is collected through Ray (``sb_collect``: a call
still running after the caller's grace, one that failed, or a ref read in another process),
``KEPT_S`` after it ended or once ``KEPT_MAX`` newer ones ended — so a handed-over call is
never lost and never run twice.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import posixpath
import shutil
import time
from collections import OrderedDict
from typing import Any

from ..seam.errors import CouldNotRunError, HostError
from ._wire import Answer, encode
from .shaped_direct import Outcome
from .shaped_types import (
    ExecResult,
    SandboxCreationError,
    SandboxExecError,
    SandboxNotFoundError,
    SandboxStatus,
    SandboxTimeoutError,
)

ENDED_KEPT = 4096  # ended sandboxes still answering get_status() -> TERMINATED
# the direct port's shaped calls: method -> the sandbox method that runs it
SHAPED_DIRECT = {"sb_exec": "sb_exec", "sb_read_file": "sb_read_file",
                 "sb_write_file": "sb_write_file"}
KEPT_S = 60.0  # a direct call's outcome waits this long after it ended for its collect
KEPT_MAX = 1024  # ... and at most this many wait (the oldest ended go first)


class ShapedSandboxes:
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

    def _session(self, sid: str, secret: str) -> Any:  # node.py: the secret checked
        raise NotImplementedError

    def _shaped_init(self) -> None:
        self._pending: dict[str, tuple[bytes, asyncio.Future[None]]] = {}
        # ended sandboxes: the hash of their secret, and the failure that ended a creation
        self._ended: OrderedDict[str, tuple[bytes, SandboxCreationError | None]] = OrderedDict()
        # direct calls by token: (the hash of the sandbox's secret, the call running or ended)
        self._kept: OrderedDict[str, tuple[bytes, asyncio.Task[Any]]] = OrderedDict()

    async def sb_open(self, sid: str, secret: str, image: str | None, limits: Any,
                      env: dict[str, str] | None, workdir: str | None,
                      ttl_seconds: float | None, orphan_timeout: float) -> None:
        from ..session.toolkit import Toolkit
        from .node import _Session, secret_hash, session_root

        if sid in self._sessions or sid in self._pending:
            raise SandboxCreationError(f"sandbox {sid[:8]}… exists on {self.where}")
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[sid] = (secret_hash(secret), ready)
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
            session = _Session(secret_hash(secret), backend, root, orphan_timeout)
            session.toolkit = toolkit
            session.workdir = workdir or toolkit.base_dir
            session.expires = (time.monotonic() + ttl_seconds
                               if ttl_seconds and ttl_seconds > 0 else None)
            self._sessions[sid] = session
            ready.set_result(None)
        except BaseException as exc:  # noqa: BLE001 - every failure ends the creation
            shutil.rmtree(root, ignore_errors=True)
            failure = SandboxCreationError(f"{self.where}: {_reason(exc)}")
            self._remember_end(sid, secret_hash(secret), failure)
            ready.set_exception(failure)
            ready.exception()  # retrieved: nobody else may be waiting
            raise failure from None
        finally:
            self._pending.pop(sid, None)

    async def _shaped(self, sid: str, secret: str) -> Any:
        """The sandbox's session, once its (maybe still running) creation is over."""
        from .node import secret_hash

        pending = self._pending.get(sid)
        if pending is not None and pending[0] == secret_hash(secret):
            await asyncio.shield(pending[1])
        ended = self._ended.get(sid)
        if ended is not None and ended[0] == secret_hash(secret) and ended[1] is not None:
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

    async def sb_exec(self, sid: str, secret: str, command: str | list[str],
                      timeout: float | None, cwd: str | None, env: dict[str, str] | None,
                      shell: str | None, _after: Any = None) -> ExecResult:
        session = await self._shaped(sid, secret)
        argv = [shell or "/bin/bash", "-c", command] if isinstance(command, str) else command
        session.calls += 1
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

    async def shaped_call(self, sid: str, secret: str, method: str,
                          args: tuple[Any, ...]) -> Answer:
        """A shaped call on the direct port: ``args`` is (its token, the call's own
        arguments). The answer is plain values (the caller's unpickler takes no
        other class); a failure answers only that it failed — its caller collects it through
        Ray, which raises it as the Ray path does."""
        from .node import secret_hash

        try:
            token, *call_args = args
            hashed = secret_hash(secret)
            run = getattr(self, SHAPED_DIRECT[method])
        except (KeyError, TypeError, ValueError) as exc:
            return encode(HostError(f"not a shaped call ({type(exc).__name__})"))
        task = asyncio.ensure_future(run(sid, secret, *call_args))
        self._kept[str(token)] = (hashed, task)
        task.add_done_callback(lambda done: self._forget_later(str(token), done))
        try:
            value = await asyncio.shield(task)  # the connection may go; the call goes on
        except Exception:  # noqa: BLE001 - kept for sb_collect, which raises it
            return ("err", "shaped")
        if isinstance(value, ExecResult):
            return ("ok", (value.exit_code, value.stdout, value.stderr, value.duration_seconds))
        return ("ok", value)

    def _forget_later(self, token: str, done: asyncio.Task[Any]) -> None:
        if not done.cancelled():
            done.exception()  # retrieved here: its collect may never come
        asyncio.get_running_loop().call_later(KEPT_S, self._kept.pop, token, None)
        ended = [t for t, (_, task) in self._kept.items() if task.done()]
        for old in ended[:max(0, len(ended) - KEPT_MAX)]:
            del self._kept[old]

    async def sb_outcomes(self, sid: str, secret: str, tokens: list[str]) -> tuple[Any, ...]:
        """One ``Outcome`` per token, each a return of its own (shaped_direct.py: the refs a
        holder's direct calls come back as)."""
        self._session(sid, secret)  # only the sandbox's holder
        return tuple(Outcome(self.node_id, sid, secret, str(token)) for token in tokens)

    async def sb_collect(self, sid: str, secret: str, token: str) -> Any:
        """The outcome of a direct call (``shaped_call``), waited for: its value, or its
        failure raised as the Ray path raises it."""
        from .node import secret_hash

        kept = self._kept.get(token)
        if kept is None or not hmac.compare_digest(kept[0], secret_hash(secret)):
            raise SandboxExecError(f"sandbox {sid[:8]}… on {self.where}: the outcome of this "
                                   f"call is no longer kept (over {KEPT_S:g} s since it ended)")
        try:
            return await asyncio.shield(kept[1])
        finally:
            if kept[1].done():
                self._kept.pop(token, None)

    async def sb_read_file(self, sid: str, secret: str, path: str, _after: Any = None) -> bytes:
        session = await self._shaped(sid, secret)
        try:
            data: bytes = await session.toolkit.sandbox.read_bytes(
                posixpath.join(session.workdir, path), limit=1 << 31)
        except CouldNotRunError as exc:
            raise SandboxExecError(f"{self.where}: {exc.reason}") from None
        return data

    async def sb_write_file(self, sid: str, secret: str, path: str,
                            content: str | bytes, _after: Any = None) -> None:
        session = await self._shaped(sid, secret)
        try:
            await session.toolkit.sandbox.write_bytes(posixpath.join(session.workdir, path),
                                                      content)
        except CouldNotRunError as exc:
            raise SandboxExecError(f"{self.where}: {exc.reason}") from None

    async def sb_status(self, sid: str, secret: str) -> SandboxStatus:
        from .node import secret_hash

        ended = self._ended.get(sid)
        if ended is not None and ended[0] == secret_hash(secret):
            return SandboxStatus.TERMINATED if ended[1] is None else SandboxStatus.ERROR
        pending = self._pending.get(sid)
        if pending is not None and pending[0] == secret_hash(secret):
            return SandboxStatus.PENDING
        await self._shaped(sid, secret)
        return SandboxStatus.RUNNING

    async def sb_delete(self, sid: str, secret: str, _after: Any = None) -> None:
        from .node import secret_hash

        ended = self._ended.get(sid)
        if ended is not None and ended[0] == secret_hash(secret):
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
