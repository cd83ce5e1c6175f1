"""The host side of the agent protocol over any asyncio stream pair (pipes or a unix socket).

Also the one place where the agent's error answers become seam exceptions, so every backend
that talks to an agent maps failures the same way.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import itertools
import json
from typing import Any

from ..seam.errors import CouldNotRunError, FileOpError, HostError
from ..seam.models import JobStatus, OutputChunk
from ..seam.protocol import OutputCallback

STREAM_LIMIT = 1 << 30  # one answer may carry 2 MiB of output or a 20 000-path listing


class UnknownJobError(HostError):
    code = "UNKNOWN_JOB"


class AgentChannel:
    """Request/answer correlation by id, plus live output events routed to listeners."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 endpoint: str) -> None:
        self._reader, self._writer = reader, writer
        self.endpoint = endpoint
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._listeners: dict[str, OutputCallback] = {}
        self.death: CouldNotRunError | None = None
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @property
    def alive(self) -> bool:
        return self.death is None

    def listen(self, job: str, callback: OutputCallback) -> None:
        self._listeners[job] = callback

    def unlisten(self, job: str) -> None:
        self._listeners.pop(job, None)

    async def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request; the answer's ``result``, or the mapped exception."""
        if self.death is not None:
            raise self.death
        rid = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            self._writer.write((json.dumps({"id": rid, "op": op, **fields}) + "\n").encode())
            if self._writer.transport.get_write_buffer_size() > 1 << 20:
                await self._writer.drain()
            answer = await future
        except (ConnectionError, RuntimeError) as exc:
            self._die(f"lost the channel to the sandbox agent at {self.endpoint}: {exc}")
            assert self.death is not None
            raise self.death from None
        finally:
            self._pending.pop(rid, None)
        if answer.get("ok"):
            return dict(answer["result"])
        raise map_agent_error(answer.get("error") or {})

    async def _read_loop(self) -> None:
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                message = json.loads(line)
                if "ev" in message:
                    listener = self._listeners.get(message.get("job"))
                    if listener is not None:
                        listener(OutputChunk(stream=message["stream"], text=message["data"]))
                    continue
                future = self._pending.get(message.get("id"))
                if future is not None and not future.done():
                    future.set_result(message)
        except (ConnectionError, ValueError, asyncio.IncompleteReadError) as exc:
            self._die(f"the sandbox agent at {self.endpoint} broke the protocol: {exc}")
        self._die(f"the sandbox agent at {self.endpoint} exited")

    def _die(self, reason: str) -> None:
        if self.death is None:
            self.death = CouldNotRunError(reason, retryable=True)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(self.death)

    async def close(self, drain_s: float = 10.0) -> None:
        """Close our side, then read to the end (the agent finishes killing jobs first)."""
        with contextlib.suppress(ConnectionError, RuntimeError):
            self._writer.close()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), drain_s)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def map_agent_error(error: dict[str, Any]) -> Exception:
    """The agent's error answer as the seam exception it stands for."""
    kind = error.get("kind")
    message = str(error.get("message", ""))
    if kind == "fs":
        return FileOpError(str(error.get("code")), str(error.get("path", "")),
                           str(error.get("detail", "")))
    if kind == "spawn":
        if error.get("in_cwd"):
            return FileOpError("not_found", "", "working directory does not exist")
        transient = error.get("errno") in (errno.EAGAIN, errno.ENOMEM)
        return CouldNotRunError(f"could not start the command: {message}", retryable=transient)
    if kind == "unknown_job":
        return UnknownJobError(message)
    return CouldNotRunError(f"sandbox agent fault: {message}", retryable=True)


def job_status(raw: dict[str, Any]) -> JobStatus:
    """An agent status answer as the seam model."""
    fields = dict(raw)
    fields["chunks"] = [{"stream": s, "text": t} for s, t in raw["chunks"]]
    return JobStatus.model_validate(fields)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
