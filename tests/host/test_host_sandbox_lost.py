"""The host backend's sandbox is its agent: killed (SIGKILL) or told to stop (SIGTERM) from
outside while a command runs, the call says ``cause == "sandbox_lost"`` — not "exited with
code -15" (issue 49)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import psutil
import pytest

from toolseam import CouldNotRunError, Toolkit


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
async def test_agent_killed_under_a_call_is_sandbox_lost(tmp_path: Path, sig: int) -> None:
    async with Toolkit("host", base_dir=str(tmp_path), raise_could_not_run=True) as tk:
        launcher = tk.backend.agent.launcher_pid  # type: ignore[attr-defined]  # unshare
        agent = psutil.Process(launcher).children()[0]
        call = asyncio.ensure_future(tk.call("bash", {"command": ": > started; sleep 30"}))
        while not (tmp_path / "started").exists():
            await asyncio.sleep(0.01)
        agent.send_signal(sig)
        with pytest.raises(CouldNotRunError) as caught:
            await asyncio.wait_for(call, 20)
        assert caught.value.cause == "sandbox_lost", caught.value.reason
        assert not caught.value.retryable
        with pytest.raises(CouldNotRunError) as again:
            await tk.call("bash", {"command": "true"})
        assert again.value.cause == "sandbox_lost"


async def test_a_command_killed_by_a_signal_is_still_a_result(tmp_path: Path) -> None:
    """The other side of the line: the command's own death is an ordinary result."""
    async with Toolkit("host", base_dir=str(tmp_path)) as tk:
        result = await tk.call("bash", {"command": "kill -TERM $$"})
    assert "failure" not in result.metadata and result.metadata["exitCode"] == -15
