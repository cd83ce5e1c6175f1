"""The parts a backend is composed of, on the host end of the agent wire.

``AgentExec`` is the exec part for any backend whose processes an agent owns (all of them: the
host runs the agent in a private pid namespace, containers run it inside the sandbox).
``FileMethods`` writes the seam's file methods once, each as a row of ``ops.TABLE`` and its
arguments; ``LocalFiles`` runs a row's agent code in this process (host backend) and
``AgentFiles`` sends it over the channel (container backends).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from toolseam_agent import walk as agent_walk
from toolseam_agent import wire
from toolseam_agent.errors import FsError

from ...seam.errors import FileOpError
from ...seam.models import (
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
    SpawnRequest,
    TextContent,
    TextPage,
    WriteResult,
)
from ...seam.protocol import ExecRequest, OutputCallback
from . import ops
from .channel import AgentChannel, job_status
from .errors import from_fs_error
from .ops import M


class AgentExec:
    """Jobs run by the sandbox agent at the other end of a channel."""

    def __init__(self, channel: Callable[[], AgentChannel]) -> None:
        self._channel = channel
        # The environment last sent on which channel, and its id there: the agent keeps it,
        # so a session's (often 2 KiB) environment crosses the channel once, not per command.
        self._env_sent: tuple[AgentChannel, dict[str, str], int] | None = None
        self._env_ids = itertools.count(1)

    def _spec(self, channel: AgentChannel, request: SpawnRequest) -> wire.Spec:
        spec: wire.Spec = {
            "argv": request.argv, "cwd": request.cwd, "deadline_ms": request.deadline_ms,
            "grace_ms": request.grace_ms, "stream": request.stream,
            "output_limit": request.output_limit}
        if isinstance(request, ExecRequest):  # the raw exec API's fields (toolseam_agent/spawn_as.py)
            if request.stdin_file is not None:
                spec["stdin_file"] = request.stdin_file
            if request.user is not None:
                spec["user"], spec["env_given"] = request.user, request.env_given
            if request.keep_detached:
                spec["keep_detached"] = True
        sent = self._env_sent
        if sent is not None and sent[0] is channel and sent[1] == request.env:
            spec["env_id"] = sent[2]
        else:
            env_id = next(self._env_ids)
            spec["env"], spec["env_id"] = request.env, env_id
            self._env_sent = (channel, dict(request.env), env_id)
        return spec

    async def start(self, request: SpawnRequest, on_output: OutputCallback | None = None
                    ) -> JobStatus:
        channel = self._channel()
        if on_output is not None:
            channel.listen(request.job, on_output)
        spec = self._spec(channel, request)
        try:
            status = job_status(await channel.call(wire.START, job=request.job, spec=spec,
                                                   wait_ms=request.wait_ms,
                                                   forget=request.forget_when_done))
        except FileOpError as exc:  # the spawn failed in its cwd: name the cwd
            raise FileOpError(exc.code, request.cwd, exc.detail) from None
        if request.forget_when_done and status.state == "exited":
            channel.unlisten(request.job)
        return status

    async def wait(self, job: str, wait_ms: int | None) -> JobStatus:
        return job_status(await self._channel().call(wire.WAIT, job=job, wait_ms=wait_ms))

    async def kill(self, job: str) -> JobStatus:
        return job_status(await self._channel().call(wire.KILL, job=job))

    async def release(self, job: str) -> None:
        channel = self._channel()
        channel.unlisten(job)
        await channel.call(wire.RELEASE, job=job)


WALK_SLICE_S = 0.005  # how long a host walk holds the event loop before letting others run


async def _walk_on_loop(steps: agent_walk.Steps) -> dict[str, Any]:
    """Run a stepwise walk (glob, grep) on the event loop thread, in slices of ``WALK_SLICE_S``.

    Not in a worker thread: measured here (docs/benchmarks.md), the same walk in a thread ran
    at random up to 30 % slower than on the loop thread, and a thread cannot be stopped — a
    cancelled call now stops its walk at the next slice, and every directory it held is closed.
    """
    deadline = time.monotonic() + WALK_SLICE_S
    try:
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return dict(done.value)
            if time.monotonic() >= deadline:
                await asyncio.sleep(0)
                deadline = time.monotonic() + WALK_SLICE_S
    except FsError as exc:
        raise from_fs_error(exc) from None
    finally:
        steps.close()


def _ref(ref: PathRef) -> dict[str, Any]:
    return {"base": ref.base, "path": ref.path, "confine": ref.confine}


class FileMethods:
    """The seam's file methods, each one row of the op table and its arguments; a subclass
    says how a row runs (``_run_op``)."""

    async def _run_op(self, op: ops.FileOp[M], args: dict[str, Any]) -> M:
        raise NotImplementedError

    async def stat(self, ref: PathRef) -> FileStat:
        return await self._run_op(ops.STAT, _ref(ref))

    async def read_text(self, ref: PathRef, offset: int | None = None, limit: int | None = None,
                        refuse_above_bytes: int | None = None) -> TextContent:
        return await self._run_op(ops.READ_TEXT, {**_ref(ref), "offset": offset, "limit": limit,
                                                  "refuse_above_bytes": refuse_above_bytes})

    async def read_bytes(self, ref: PathRef, refuse_above_bytes: int | None = None
                         ) -> ByteContent:
        return await self._run_op(ops.READ_BYTES,
                                  {**_ref(ref), "refuse_above_bytes": refuse_above_bytes})

    async def read_page(self, ref: PathRef, page: PageRequest) -> TextPage:
        return await self._run_op(ops.READ_PAGE, {**_ref(ref), **page.model_dump()})

    async def list_dir(self, ref: PathRef, cap: int) -> DirListing:
        return await self._run_op(ops.LIST_DIR, {**_ref(ref), "cap": cap})

    async def write(self, ref: PathRef, data: bytes, keep_bom: bool = False) -> WriteResult:
        return await self._run_op(ops.WRITE, {**_ref(ref), "data": data, "keep_bom": keep_bom})

    async def commit(self, change: ChangeSet) -> CommitResult:
        return await self._run_op(ops.COMMIT, {
            "base": change.base, "confine": change.confine,
            "ops": [op.model_dump() for op in change.ops]})

    async def list_files(self, ref: PathRef, match: GlobMatch | None = None) -> FileListing:
        return await self._run_op(ops.LIST_FILES, {
            **_ref(ref), "match": match.regex if match else None,
            "match_basename": match.basename if match else False,
            "name_suffix": match.name_suffix if match else None})

    async def grep(self, ref: PathRef, pattern: str, include: GlobMatch | None = None,
                   deadline_ms: int | None = None) -> GrepListing:
        return await self._run_op(ops.GREP_FILES, {
            **_ref(ref), "pattern": pattern, "include": include.regex if include else None,
            "include_basename": include.basename if include else True,
            "deadline_ms": deadline_ms})


class LocalFiles(FileMethods):
    """The agent's file code, called directly: no channel, no copy, no serialisation.

    Small results are validated (pydantic-core builds a three-field model faster than
    ``model_construct``'s Python loop). Listings are built with ``model_construct``: our own
    code made them in this process, and re-validating 20 000 paths would cost more than the
    walk's bookkeeping. Searches are the exception: they go to the session's agent.
    """

    def __init__(self, agent: Callable[[], Awaitable[AgentChannel]]) -> None:
        self._agent = agent

    async def _run_op(self, op: ops.FileOp[M], args: dict[str, Any]) -> M:
        if op.in_process == "call":
            try:
                return op.result.model_validate(op.function(**args))
            except FsError as exc:
                raise from_fs_error(exc) from None
        if op.in_process == "walk":
            return op.result.model_construct(**await _walk_on_loop(op.steps(**args)))
        channel = await self._agent()
        return await AgentFiles(lambda: channel)._run_op(op, args)


def _encode(value: Any) -> Any:
    """Bytes, at any depth, as base64 under ``<key>_b64`` (the agent decodes them back)."""
    if isinstance(value, dict):
        return {(f"{k}_b64" if isinstance(v, bytes) else k):
                (base64.b64encode(v).decode("ascii") if isinstance(v, bytes) else _encode(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return value


class AgentFiles(FileMethods):
    """The same file operations, served by the agent inside the sandbox."""

    def __init__(self, channel: Callable[[], AgentChannel]) -> None:
        self._channel = channel

    async def _run_op(self, op: ops.FileOp[M], args: dict[str, Any]) -> M:
        raw = await self._channel().call(op.name, args=_encode(args))
        for key in [k for k in raw if k.endswith("_b64")]:
            raw[key[:-4]] = base64.b64decode(raw.pop(key))
        return op.result.model_validate(raw)
