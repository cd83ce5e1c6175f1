"""Detached jobs of one session: ids the model sees, lifetimes, and the ``max_jobs`` limit.

The sandbox owns the processes and enforces each job's ``job_max_ms`` ceiling itself (it is the
job's deadline), so a job dies at its ceiling even if this process is gone. This registry
decides the other lifetimes: end of turn (unless kept), session close, and eviction.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from ..seam.errors import CouldNotRunError, UnknownJobError
from ..seam.models import JobStatus
from ..seam.protocol import BuiltinExec


@dataclass
class TrackedJob:
    id: int  # what the model passes to {wait}/{kill}
    backend_job: str
    command: str
    pid: int
    started: float
    keep: bool
    state: str = "running"  # running | exited | killed


class JobRegistry:
    """The table of detached jobs. Every change to it happens under one ``asyncio.Lock``: calls
    that detach at once, waits, kills, the end of a turn and close interleave at each ``await``
    on the backend, and without the lock two adoptions could both see room under ``max_jobs``,
    or a walk over the table could meet a job added mid-walk (issue 19)."""

    def __init__(self, backend: BuiltinExec, max_jobs: int) -> None:
        self._backend = backend
        self.max_jobs = max_jobs
        self._jobs: dict[int, TrackedJob] = {}
        self._next = 0
        self._lock = asyncio.Lock()
        self._closed = False

    def get(self, job_id: int) -> TrackedJob | None:
        return self._jobs.get(job_id)

    def all(self) -> list[TrackedJob]:
        return list(self._jobs.values())

    def running(self) -> list[TrackedJob]:
        return [j for j in self._jobs.values() if j.state == "running"]

    async def adopt(self, status: JobStatus, command: str, keep: bool
                    ) -> tuple[TrackedJob, TrackedJob | None]:
        """Track a job the default timeout detached; evict the oldest if over ``max_jobs``.

        Shielded: a caller cancelled while waiting for the lock must not leave a running job
        the table never heard of (it would outlive the end of the turn). After ``close`` the
        job is killed at once and this raises ``CouldNotRunError``."""
        adopted = await asyncio.shield(self._adopt(status, command, keep))
        if adopted is None:
            raise CouldNotRunError("the session was closed while the command was starting; "
                                   "it was stopped", retryable=False)
        return adopted

    async def _adopt(self, status: JobStatus, command: str, keep: bool
                     ) -> tuple[TrackedJob, TrackedJob | None] | None:
        async with self._lock:
            if self._closed:
                with contextlib.suppress(CouldNotRunError):
                    await self._backend.kill(status.job)
                    await self._backend.release(status.job)
                return None
            self._next += 1
            job = TrackedJob(self._next, status.job, command, status.pid, status.started, keep)
            evicted = None
            await self._refresh()  # a job that ended on its own no longer counts against max_jobs
            running = self.running()
            if len(running) >= self.max_jobs:
                unkept = [j for j in running if not j.keep]
                evicted = (unkept or running)[0]  # oldest first: dicts keep insertion order
                await self._kill(evicted)
            self._jobs[job.id] = job
            return job, evicted

    # --- a session that outlives its client (durable.py) ---------------------------------
    def saved(self) -> dict[str, Any]:
        return {"jobs": [dataclasses.asdict(j) for j in self._jobs.values()], "next": self._next}

    def restore(self, saved: dict[str, Any]) -> None:
        self._next = int(saved["next"])
        self._jobs = {int(raw["id"]): TrackedJob(**raw) for raw in saved["jobs"]}

    def take_over(self, backend_job: str, command: str, pid: int, started: float) -> TrackedJob:
        """A job the sandbox runs that this table never tracked (its call was in flight when the
        client died): tracked now as a kept job, over ``max_jobs`` if need be."""
        self._next += 1
        job = TrackedJob(self._next, backend_job, command, pid, started, keep=True)
        self._jobs[job.id] = job
        return job

    def mark(self, job: TrackedJob, status: JobStatus) -> None:
        if status.state == "exited" and job.state == "running":
            job.state = "killed" if status.killed else "exited"

    async def kill(self, job: TrackedJob) -> JobStatus | None:
        async with self._lock:
            return await self._kill(job)

    async def _kill(self, job: TrackedJob) -> JobStatus | None:
        try:
            status = await self._backend.kill(job.backend_job)
        except UnknownJobError:  # the sandbox no longer knows it: it is gone, as asked
            if job.state == "running":
                job.state = "exited"
            return None
        except CouldNotRunError:
            job.state = "killed"
            return None
        job.state = "killed"
        return status

    async def refresh(self) -> None:
        """Learn which running jobs ended on their own."""
        async with self._lock:
            await self._refresh()

    async def _refresh(self) -> None:
        for job in self.running():
            with contextlib.suppress(CouldNotRunError):
                self.mark(job, await self._backend.wait(job.backend_job, 0))

    async def end_turn(self) -> list[TrackedJob]:
        """Kill every running job not kept; returns them."""
        async with self._lock:
            doomed = [j for j in self.running() if not j.keep]
            await asyncio.gather(*(self._kill(j) for j in doomed))
            return doomed

    async def close(self) -> None:
        """Kill every job and forget them all; a job that detaches later is killed at once."""
        self._closed = True  # before the lock: an adoption queued behind it must not slip in
        async with self._lock:
            await asyncio.gather(*(self._kill(j) for j in self.running()))
            for job in self.all():
                with contextlib.suppress(CouldNotRunError, UnknownJobError):
                    await self._backend.release(job.backend_job)


def describe_age(started: float) -> str:
    return format_duration(int((time.time() - started) * 1000))


def format_duration(ms: int) -> str:
    """600000 -> '10 min', 90000 -> '90 s', 1500 -> '1500 ms'."""
    if ms % 60_000 == 0 and ms >= 60_000:
        return f"{ms // 60_000} min"
    if ms % 1000 == 0 and ms >= 1000:
        return f"{ms // 1000} s"
    return f"{ms} ms"
