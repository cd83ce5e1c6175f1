"""The agent's ``pty_*`` ops on the wire, in each way it learns of a child's exit (pidfd,
SIGCHLD, pidfds running out): an exit code is reported, no zombie is left, a job ending beside
a terminal leaves it alone, and malformed requests are answered, never fatal."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ..support.agent_process import MODES, AgentProcess


class Agent(AgentProcess):
    """An agent process on a socketpair, and the terminal ops of its wire."""

    def pty(self, argv: list[str], **spec: Any) -> int:
        full = {"argv": argv, "cwd": "/", "env": {"PATH": os.defpath}, **spec}
        return int(self.ok("pty_start", spec=full)["pty"])

    def read_all(self, pty: int) -> tuple[bytes, dict[str, Any]]:
        seen = b""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got = self.ok("pty_read", pty=pty, yield_ms=500)
            seen += base64.b64decode(got["data_b64"])
            if got["exited"]:
                return seen, got
        raise AssertionError(f"no exit: {seen!r}")


@pytest.fixture(params=MODES)
def agent(request: pytest.FixtureRequest) -> Iterator[Agent]:
    raw = Agent(request.param)
    yield raw
    raw.close()


def test_an_exit_is_reported_and_reaped(agent: Agent) -> None:
    for tty in (True, False):
        pty = agent.pty(["/bin/sh", "-c", "echo out; exit 4"], tty=tty)
        seen, last = agent.read_all(pty)
        assert b"out" in seen and last["exit_code"] == 4
        assert agent.call("pty_read", pty=pty, yield_ms=0)["error"]["kind"] == "unknown_job"
    assert agent.zombies() == []


def test_a_job_ending_beside_a_terminal_leaves_it_alone(agent: Agent) -> None:
    job = {"argv": ["/bin/sh", "-c", "sleep 0.3"], "cwd": "/", "deadline_ms": 10_000,
           "grace_ms": 200, "env": {"PATH": os.defpath}}
    agent.send("start", job="j1", spec=job, forget=True)
    pty = agent.pty(["/bin/cat"])
    time.sleep(0.6)  # the job has ended (its answer waits in the socket)
    agent.ok("pty_write", pty=pty, data_b64=base64.b64encode(b"still\n").decode())
    seen = b""
    while seen.count(b"still") < 2:
        seen += base64.b64decode(agent.ok("pty_read", pty=pty, yield_ms=2000)["data_b64"])
    assert "exit_code" in agent.ok("pty_terminate", pty=pty)


def test_malformed_requests_are_answered(agent: Agent) -> None:
    assert agent.call("pty_start", spec={})["error"]["kind"] == "protocol"
    assert agent.call("pty_start", spec={"argv": []})["error"]["kind"] == "protocol"
    before = len(os.listdir(f"/proc/{agent.process.pid}/fd"))
    for rows in (0, 1 << 16, -3):
        refused = agent.call("pty_start", spec={"argv": ["/bin/true"], "rows": rows})
        assert refused["error"]["kind"] == "protocol"
    assert len(os.listdir(f"/proc/{agent.process.pid}/fd")) == before  # no terminal leaked
    assert agent.call("pty_read", pty="x")["error"]["kind"] == "unknown_job"
    assert agent.call("pty_resize", pty=1, rows=0, cols=5)["error"]["kind"] == "protocol"
    assert agent.call("pty_start", spec={"argv": ["/no/such"], "cwd": "/"})["error"]["kind"] \
        == "spawn"
    piped = agent.pty(["/bin/cat"], tty=False)
    assert agent.call("pty_resize", pty=piped, rows=5, cols=5)["error"]["kind"] == "protocol"
    assert agent.ok("hello")["pid"] > 0  # still serving
