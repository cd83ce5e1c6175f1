"""Detached jobs of one session: ids the model sees, lifetimes, and the ``max_jobs`` limit.

The sandbox owns the processes and enforces each job's ``job_max_ms`` ceiling itself (it is the
job's deadline), so a job dies at its ceiling even if this process is gone. This registry
decides the other lifetimes: end of turn (unless kept), session close, and eviction.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from ..seam.errors import CouldNotRunError
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
    def __init__(self, backend: BuiltinExec, max_jobs: int) -> None:
        self._backend = backend
        self.max_jobs = max_jobs
        self._jobs: dict[int, TrackedJob] = {}
        self._next = 0

    def get(self, job_id: int) -> TrackedJob | None:
        return self._jobs.get(job_id)

    def all(self) -> list[TrackedJob]:
        return list(self._jobs.values())

    async def adopt(self, status: JobStatus, command: str, keep: bool
                    ) -> tuple[TrackedJob, TrackedJob | None]:
        """Track a job the default timeout detached; evict the oldest if over ``max_jobs``."""
        self._next += 1
        job = TrackedJob(self._next, status.job, command, status.pid, status.started, keep)
        evicted = None
        await self.refresh()  # a job that ended on its own no longer counts against max_jobs
        running = [j for j in self._jobs.values() if j.state == "running"]
        if len(running) >= self.max_jobs:
            unkept = [j for j in running if not j.keep]
            evicted = (unkept or running)[0]  # oldest first: dicts keep insertion order
            await self.kill(evicted)
        self._jobs[job.id] = job
        return job, evicted

    def mark(self, job: TrackedJob, status: JobStatus) -> None:
        if status.state == "exited" and job.state == "running":
            job.state = "killed" if status.killed else "exited"

    async def kill(self, job: TrackedJob) -> JobStatus | None:
        try:
            status = await self._backend.kill(job.backend_job)
        except CouldNotRunError:
            job.state = "killed"
            return None
        job.state = "killed"
        return status

    async def refresh(self) -> None:
        """Learn which running jobs ended on their own."""
        for job in self._jobs.values():
            if job.state == "running":
                with contextlib.suppress(CouldNotRunError):
                    self.mark(job, await self._backend.wait(job.backend_job, 0))

    async def end_turn(self) -> list[TrackedJob]:
        """Kill every running job not kept; returns them."""
        doomed = [j for j in self._jobs.values() if j.state == "running" and not j.keep]
        await asyncio.gather(*(self.kill(j) for j in doomed))
        return doomed

    async def close(self) -> None:
        doomed = [j for j in self._jobs.values() if j.state == "running"]
        await asyncio.gather(*(self.kill(j) for j in doomed))
        for job in self._jobs.values():
            with contextlib.suppress(CouldNotRunError):
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
