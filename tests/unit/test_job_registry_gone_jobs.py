"""A job the sandbox no longer knows (it ended and was forgotten there) is gone, as a kill or a
close wants: ``JobRegistry`` says so instead of raising (issue 45)."""

from __future__ import annotations

import pytest

from toolseam.policy.jobs import JobRegistry
from toolseam.seam.errors import UnknownJobError
from toolseam.testing.fake import FakeBackend


async def test_a_job_the_sandbox_forgot_is_gone_for_kill_and_close() -> None:
    backend = FakeBackend()
    with pytest.raises(UnknownJobError):  # the fake answers as the agent does
        await backend.kill("forgotten-1")
    table = JobRegistry(backend, max_jobs=4)  # type: ignore[arg-type]
    job = table.take_over("forgotten-1", "sleep 1", pid=4242, started=0.0)
    assert await table.kill(job) is None
    assert job.state == "exited"  # it ended on its own; nothing killed it
    again = table.take_over("forgotten-2", "sleep 1", pid=4243, started=0.0)
    await table.close()  # raised UnknownJobError from the kill before the fix
    assert again.state == "exited"
