"""What a ``keep_detached`` exec leaves running is no later command's leftover: a command that
starts in the same clock tick as such a process must not take it for its own orphan and kill
it when it ends. The clock is pinned here (every job "starts" at tick 0), so the same-tick case
the tick's 10 ms make rare is the only case."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
_PINNED_CLOCK = """
from toolseam_agent import procscan
procscan.now_ticks = lambda: 0
from toolseam_agent.main import main; main()
"""


def _call(sock: socket.socket, answers: Any, rid: int, op: str, **fields: Any) -> dict[str, Any]:
    sock.sendall((json.dumps({"id": rid, "op": op, **fields}) + "\n").encode())
    while True:
        message = json.loads(answers.readline())
        if message.get("id") == rid:
            return dict(message)


def test_a_later_command_leaves_a_detached_process_alone(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    agent = subprocess.Popen([sys.executable, "-S", "-B", "-c", _PINNED_CLOCK],
                             stdin=theirs.fileno(), stdout=theirs.fileno(), cwd="/",
                             env={"PATH": os.defpath, "PYTHONPATH": str(REPO)})
    theirs.close()
    answers = ours.makefile("rb")
    pid_file = tmp_path / "kept.pid"
    env = {"PATH": os.defpath}
    try:
        kept = {"argv": ["/bin/sh", "-c", f"setsid sleep 60 >/dev/null 2>&1 & echo $! > {pid_file}"],
                "cwd": "/", "env": env, "keep_detached": True, "deadline_ms": 10_000}
        first = _call(ours, answers, 1, "start", job="kept", spec=kept, wait_ms=10_000)
        assert first["result"]["state"] == "exited", first
        sleeper = int(pid_file.read_text())
        later = {"argv": ["/bin/true"], "cwd": "/", "env": env, "deadline_ms": 10_000}
        second = _call(ours, answers, 2, "start", job="later", spec=later, wait_ms=10_000)
        assert second["result"]["state"] == "exited", second
        time.sleep(0.3)
        os.kill(sleeper, 0)  # still there: the later command did not take it for its leftover
    finally:
        agent.kill()
        agent.wait()
        ours.close()
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
