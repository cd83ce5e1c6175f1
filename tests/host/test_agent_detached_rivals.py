"""What a ``keep_detached`` exec leaves running is no later command's leftover: a command that
starts in the same clock tick as such a process must not take it for its own orphan and kill
it when it ends. The clock is pinned here (every job "starts" at tick 0), so the same-tick case
the tick's 10 ms made rare for the old start-time attribution is the only case; with a root per
job (decision 345) the kept process is under the first job's root, never the later one's."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from ..support.agent_process import START, AgentProcess

_PINNED_CLOCK = """
from toolseam_agent import procscan
procscan.now_ticks = lambda: 0
""" + START


def test_a_later_command_leaves_a_detached_process_alone(tmp_path: Path) -> None:
    agent = AgentProcess(code=_PINNED_CLOCK)
    pid_file = tmp_path / "kept.pid"
    env = {"PATH": os.defpath}
    try:
        kept = {"argv": ["/bin/sh", "-c", f"setsid sleep 60 >/dev/null 2>&1 & echo $! > {pid_file}"],
                "cwd": "/", "env": env, "keep_detached": True, "deadline_ms": 10_000}
        first = agent.call("start", job="kept", spec=kept, wait_ms=10_000)
        assert first["result"]["state"] == "exited", first
        sleeper = int(pid_file.read_text())
        later = {"argv": ["/bin/true"], "cwd": "/", "env": env, "deadline_ms": 10_000}
        second = agent.call("start", job="later", spec=later, wait_ms=10_000)
        assert second["result"]["state"] == "exited", second
        time.sleep(0.3)
        os.kill(sleeper, 0)  # still there: the later command did not take it for its leftover
    finally:
        agent.kill()
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
