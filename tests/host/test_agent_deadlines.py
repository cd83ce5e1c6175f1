"""The agent's job deadlines share one loop timer (toolseam_agent/jobs.py).

A job almost always ends long before its deadline; with a timer per job, cancelled at the end,
every job that ended while an earlier live timer sat at the top of the loop's heap left its dead
timer there until its own deadline (the second test: 200 of them, before).
"""

from __future__ import annotations

import os
import time
from typing import Any

from toolseam_agent import jobs
from toolseam_agent.jobroot import Roots
from toolseam_agent.loop import Loop
from toolseam_agent.reaper import Reaper


class _Stub:
    def __init__(self, name: str, fired: list[str]) -> None:
        self.name, self._fired = name, fired

    def _on_deadline(self) -> None:
        self._fired.append(self.name)


def _run(loop: Loop, seconds: float) -> None:
    loop.running = True
    loop.call_later(seconds, lambda: setattr(loop, "running", False))
    loop.run()


def test_deadlines_fire_earliest_first_and_a_finished_job_never() -> None:
    loop, fired = Loop(), list[str]()
    deadlines = jobs._deadlines(loop)
    now = time.monotonic()
    late, early, finished = (_Stub(n, fired) for n in ("late", "early", "finished"))
    deadlines.add(late, now + 0.30)  # type: ignore[arg-type]
    deadlines.add(early, now + 0.05)  # type: ignore[arg-type]  # earlier, added later
    deadlines.add(finished, now + 0.10)  # type: ignore[arg-type]
    deadlines.discard(finished)  # type: ignore[arg-type]
    _run(loop, 0.15)
    assert fired == ["early"]
    _run(loop, 0.25)
    assert fired == ["early", "late"]


def test_finished_jobs_leave_no_timers_behind() -> None:
    """200 short jobs with a two-minute deadline: the loop holds one timer, not 200."""
    loop = Loop()
    done: list[Any] = []
    roots = Roots(loop, Reaper(loop, lambda _pid, _status: None, signals=False))

    def reap() -> None:  # each job's exit comes from its root (jobroot.py) on the loop
        if len(done) < 200:
            loop.call_later(0.001, reap)
        else:
            loop.running = False

    spec = {"argv": ["/bin/sh", "-c", "true"], "cwd": "/", "deadline_ms": 120_000}
    env = {"PATH": os.defpath}
    for number in range(200):
        jobs.Job(loop, f"j{number}", spec, env, roots, lambda _event: None, done.append)
    loop.call_later(0, reap)
    loop.run()
    assert len(done) == 200
    assert all(job.exit_status == 0 and not job.timed_out for job in done)
    # one timer for all the deadlines, plus the few drain timers of jobs whose pipes outlived
    # their leader by a moment; before, every job's cancelled deadline timer (200)
    assert len(loop._timers) < 20, len(loop._timers)
