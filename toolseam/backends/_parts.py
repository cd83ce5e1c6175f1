"""The parts every backend is composed of.

``AgentExec`` is the exec part for any backend whose processes an agent owns (all of them: the
host runs the agent in a private pid namespace, containers run it inside the sandbox).
``LocalFiles`` runs the agent's file code in-process (host backend); ``AgentFiles`` sends the
same operations over the channel (container backends). ``ComposedBackend`` forwards the seam's
methods to one of each.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from ..seam.errors import CouldNotRunError, FileOpError, SessionClosedError
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
    TextContent,
    TextPage,
    WriteResult,
)
from ..seam.protocol import ExecRequest, OutputCallback
from ._channel import AgentChannel, b64, job_status
from .agent import files as agent_files
from .agent import walk as agent_walk
from .agent import wire
from .agent.errors import FsError

T = TypeVar("T")
P = ParamSpec("P")


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
        if isinstance(request, ExecRequest):  # the raw exec API's fields (agent/spawn_as.py)
            if request.stdin_file is not None:
                spec["stdin_file"] = request.stdin_file
            if request.user is not None:
                spec["user"], spec["env_given"] = request.user, request.env_given
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
        except FileOpError as exc:
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


def _seam_error(exc: FsError) -> FileOpError:
    """The agent's file error as the seam's: the one mapping for in-process file code."""
    return FileOpError(exc.code, exc.path, exc.detail)


def _local(func: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """Run agent file code in-process, its FsError raised as the seam's."""

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return func(*args, **kwargs)
        except FsError as exc:
            raise _seam_error(exc) from None

    return call


_stat = _local(agent_files.stat_path)
_read_text = _local(agent_files.read_text)
_read_bytes = _local(agent_files.read_bytes)
_read_page = _local(agent_files.read_page)
_list_dir = _local(agent_files.list_dir)
_write = _local(agent_files.write_file)
_commit = _local(agent_files.commit)

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
        raise _seam_error(exc) from None
    finally:
        steps.close()


class LocalFiles:
    """The agent's file code, called directly: no channel, no copy, no serialisation.

    Small results are validated (pydantic-core builds a three-field model faster than
    ``model_construct``'s Python loop). Listings are built with ``model_construct``: our own
    code made them in this process, and re-validating 20 000 paths would cost more than the
    walk's bookkeeping. Searches are the exception: they go to the session's agent.
    """

    def __init__(self, agent: Callable[[], Awaitable[AgentChannel]]) -> None:
        self._agent = agent

    async def stat(self, ref: PathRef) -> FileStat:
        return FileStat.model_validate(_stat(ref.base, ref.path, ref.confine))

    async def read_text(self, ref: PathRef, offset: int | None = None, limit: int | None = None,
                        refuse_above_bytes: int | None = None) -> TextContent:
        return TextContent.model_validate(
            _read_text(ref.base, ref.path, ref.confine, offset, limit, refuse_above_bytes))

    async def read_bytes(self, ref: PathRef, refuse_above_bytes: int | None = None
                         ) -> ByteContent:
        return ByteContent.model_validate(
            _read_bytes(ref.base, ref.path, ref.confine, refuse_above_bytes))

    async def read_page(self, ref: PathRef, page: PageRequest) -> TextPage:
        return TextPage.model_validate(_read_page(ref.base, ref.path, ref.confine, **page.model_dump()))

    async def list_dir(self, ref: PathRef, cap: int) -> DirListing:
        return DirListing.model_validate(_list_dir(ref.base, ref.path, ref.confine, cap))

    async def write(self, ref: PathRef, data: bytes, keep_bom: bool = False) -> WriteResult:
        return WriteResult.model_validate(_write(ref.base, ref.path, ref.confine, data, keep_bom))

    async def commit(self, change: ChangeSet) -> CommitResult:
        ops = [op.model_dump() for op in change.ops]
        return CommitResult.model_validate(_commit(change.base, change.confine, ops))

    async def list_files(self, ref: PathRef, match: GlobMatch | None = None) -> FileListing:
        raw = await _walk_on_loop(agent_walk.list_files_steps(
            ref.base, ref.path, ref.confine, match.regex if match else None,
            match.basename if match else False, match.name_suffix if match else None))
        return FileListing.model_construct(**raw)

    async def grep(self, ref: PathRef, pattern: str, include: GlobMatch | None = None,
                   deadline_ms: int | None = None) -> GrepListing:
        """Not in this process: a regex can backtrack for hours holding the interpreter lock,
        which would freeze the event loop — the agent searches in a process it can kill."""
        channel = await self._agent()
        return await AgentFiles(lambda: channel).grep(ref, pattern, include, deadline_ms)


class AgentFiles:
    """The same file operations, served by the agent inside the sandbox."""

    def __init__(self, channel: Callable[[], AgentChannel]) -> None:
        self._channel = channel

    async def _call(self, op: str, **args: Any) -> dict[str, Any]:
        return await self._channel().call(op, args=args)

    async def stat(self, ref: PathRef) -> FileStat:
        return FileStat.model_validate(await self._call("stat", **ref.model_dump()))

    async def read_text(self, ref: PathRef, offset: int | None = None, limit: int | None = None,
                        refuse_above_bytes: int | None = None) -> TextContent:
        raw = await self._call("read_text", **ref.model_dump(), offset=offset, limit=limit,
                               refuse_above_bytes=refuse_above_bytes)
        return TextContent.model_validate(raw)

    async def read_bytes(self, ref: PathRef, refuse_above_bytes: int | None = None
                         ) -> ByteContent:
        raw = await self._call("read_bytes", **ref.model_dump(),
                               refuse_above_bytes=refuse_above_bytes)
        raw["data"] = base64.b64decode(raw.pop("data_b64"))
        return ByteContent.model_validate(raw)

    async def read_page(self, ref: PathRef, page: PageRequest) -> TextPage:
        return TextPage.model_validate(
            await self._call("read_page", **ref.model_dump(), **page.model_dump()))

    async def list_dir(self, ref: PathRef, cap: int) -> DirListing:
        return DirListing.model_validate(await self._call("list_dir", **ref.model_dump(), cap=cap))

    async def write(self, ref: PathRef, data: bytes, keep_bom: bool = False) -> WriteResult:
        return WriteResult.model_validate(
            await self._call("write", **ref.model_dump(), data_b64=b64(data), keep_bom=keep_bom))

    async def commit(self, change: ChangeSet) -> CommitResult:
        ops = []
        for op in change.ops:
            fields = op.model_dump()
            if "data" in fields:
                fields["data_b64"] = b64(fields.pop("data"))
            ops.append(fields)
        return CommitResult.model_validate(
            await self._call("commit", base=change.base, confine=change.confine, ops=ops))

    async def list_files(self, ref: PathRef, match: GlobMatch | None = None) -> FileListing:
        raw = await self._call("list_files", **ref.model_dump(),
                               match=match.regex if match else None,
                               match_basename=match.basename if match else False,
                               name_suffix=match.name_suffix if match else None)
        return FileListing.model_validate(raw)

    async def grep(self, ref: PathRef, pattern: str, include: GlobMatch | None = None,
                   deadline_ms: int | None = None) -> GrepListing:
        raw = await self._call(wire.GREP, **ref.model_dump(), pattern=pattern,
                               include=include.regex if include else None,
                               include_basename=include.basename if include else True,
                               deadline_ms=deadline_ms)
        return GrepListing.model_validate(raw)


class ComposedBackend:
    """Forwards the seam to a file part and an exec part; subclasses bring them up and down."""

    name = "composed"

    def __init__(self, files: LocalFiles | AgentFiles, exec_part: AgentExec) -> None:
        self._files = files
        self._exec = exec_part
        self._info: SandboxInfo | None = None
        self._closed = False
        self._over: CouldNotRunError | None = None  # the sandbox died: every call says so

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError(f"the {self.name} backend was closed")

    async def open(self) -> SandboxInfo:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    @property
    def info(self) -> SandboxInfo | None:
        return self._info

    async def _explain(self, failure: CouldNotRunError) -> CouldNotRunError:
        """A container backend replaces "the channel closed" with what the engine says."""
        return failure

    def _session_over(self, why: CouldNotRunError) -> CouldNotRunError:
        """The sandbox is gone for good (killed, OOM, its agent crashed): no call of this
        session can succeed again, so every one says so, not retryable — a host starts a new
        session (on the same workspace) rather than retrying into a dead one."""
        if self._over is None:
            self._over = CouldNotRunError(
                f"{why.reason}; this session is over (its sandbox is gone): start a new one",
                retryable=False)
        return self._over

    def _sandbox_gone(self) -> bool:
        """Whether the sandbox's agent is gone (its channel closed)."""
        return False

    def _check_sandbox(self) -> None:
        """A backend's cheap check before each call (raises CouldNotRunError)."""

    async def _reconnect(self) -> None:
        """Before each call: a backend whose channel can drop without its sandbox dying (an
        engine over the network) gets it back here; a failure raises, the session lives."""

    async def _run(self, call: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        self._check_open()
        if self._over is not None:
            raise self._over
        try:
            self._check_sandbox()
        except CouldNotRunError as why:
            raise self._session_over(why) from None
        await self._reconnect()
        try:
            return await call(*args, **kwargs)
        except CouldNotRunError as failure:
            explained = await self._explain(failure)
            if self._sandbox_gone():
                raise self._session_over(explained) from None
            raise explained from None

    async def start(self, request: SpawnRequest, on_output: OutputCallback | None = None
                    ) -> JobStatus:
        self._check_open()
        await self.open()
        return await self._run(self._exec.start, request, on_output)

    async def wait(self, job: str, wait_ms: int | None) -> JobStatus:
        return await self._run(self._exec.wait, job, wait_ms)

    async def kill(self, job: str) -> JobStatus:
        return await self._run(self._exec.kill, job)

    async def release(self, job: str) -> None:
        if not self._closed:
            await self._run(self._exec.release, job)

    async def stat(self, ref: PathRef) -> FileStat:
        return await self._run(self._files.stat, ref)

    async def read_text(self, ref: PathRef, offset: int | None = None, limit: int | None = None,
                        refuse_above_bytes: int | None = None) -> TextContent:
        return await self._run(self._files.read_text, ref, offset, limit, refuse_above_bytes)

    async def read_bytes(self, ref: PathRef, refuse_above_bytes: int | None = None
                         ) -> ByteContent:
        return await self._run(self._files.read_bytes, ref, refuse_above_bytes)

    async def read_page(self, ref: PathRef, page: PageRequest) -> TextPage:
        return await self._run(self._files.read_page, ref, page)

    async def list_dir(self, ref: PathRef, cap: int) -> DirListing:
        return await self._run(self._files.list_dir, ref, cap)

    async def write(self, ref: PathRef, data: bytes, keep_bom: bool = False) -> WriteResult:
        return await self._run(self._files.write, ref, data, keep_bom)

    async def commit(self, change: ChangeSet) -> CommitResult:
        return await self._run(self._files.commit, change)

    async def list_files(self, ref: PathRef, match: GlobMatch | None = None) -> FileListing:
        return await self._run(self._files.list_files, ref, match)

    async def grep(self, ref: PathRef, pattern: str, include: GlobMatch | None = None,
                   deadline_ms: int | None = None) -> GrepListing:
        return await self._run(self._files.grep, ref, pattern, include, deadline_ms)
