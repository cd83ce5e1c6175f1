"""The session's accounting (``SessionReport``): counted as calls end, so closing adds one
sample of the sandbox's usage and nothing else. No clock, lock or allocation beyond a counter
on a call's path."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from ..builtins import CallContext
from ..seam.capabilities import SandboxUsage
from ..seam.models import JobStatus
from .outcomes import Outcome
from .report import EgressTotals, SessionReport


@dataclass
class _Egress:
    connections: int = 0
    bytes: int = 0
    refused: int = 0


class SessionMeter:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self.calls: Counter[str] = Counter()
        self.bytes_written = 0
        self._job_cpu: dict[str, float] = {}  # backend job id → its CPU once it ended
        self.job_peak: int | None = None
        self.egress: dict[str, _Egress] = {}

    def record(self, outcome: Outcome, ctx: CallContext | None) -> None:
        self.calls[outcome] += 1
        if ctx is None or not ctx.extra:
            return
        self.bytes_written += ctx.extra.get("bytes_written", 0)
        job: JobStatus | None = ctx.extra.get("job")
        if job is not None:
            self.note_job(job)

    def note_job(self, job: JobStatus) -> None:
        if job.cpu_seconds is not None:
            self._job_cpu[job.job] = job.cpu_seconds  # a job seen twice is counted once
        if job.memory_peak_bytes is not None:
            self.job_peak = max(self.job_peak or 0, job.memory_peak_bytes)

    def note_egress(self, host: str, allowed: bool, moved: int) -> None:
        totals = self.egress.setdefault(host, _Egress())
        totals.connections += 1
        totals.bytes += moved
        totals.refused += not allowed

    @property
    def jobs_cpu(self) -> float | None:
        return sum(self._job_cpu.values()) if self._job_cpu else None

    def report(self, session_id: str, backend: str, usage: SandboxUsage) -> SessionReport:
        cpu = usage.cpu_seconds if usage.cpu_seconds is not None else self.jobs_cpu
        peak = usage.memory_peak_bytes if usage.memory_peak_bytes is not None else self.job_peak
        return SessionReport(
            session_id=session_id, backend=backend,
            wall_seconds=round(time.monotonic() - self.started, 6), calls=dict(self.calls),
            cpu_seconds=cpu, memory_peak_bytes=peak, bytes_written=self.bytes_written,
            egress={host: EgressTotals(connections=t.connections, bytes=t.bytes,
                                       refused=t.refused) for host, t in self.egress.items()})
