"""The agent's ``pty_*`` ops on the wire, in each way it learns of a child's exit (pidfd,
SIGCHLD, pidfds running out): an exit code is reported, no zombie is left, a job ending beside
a terminal leaves it alone, and malformed requests are answered, never fatal."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolseam_agent.reaper import MODE_VAR

REPO = Path(__file__).resolve().parents[2]
_EXHAUSTED = """
import errno, os
real, calls = os.pidfd_open, []
def pidfd_open(pid, flags=0):
    calls.append(pid)
    if len(calls) > 1:
        raise OSError(errno.EMFILE, "Too many open files")
    return real(pid, flags)
os.pidfd_open = pidfd_open
from toolseam_agent.main import main; main()
"""


class Agent:
    """An agent process on a socketpair, and a blocking client of its wire."""

    def __init__(self, mode: str) -> None:
        self._sock, theirs = socket.socketpair()
        env = {"PATH": os.defpath, "PYTHONPATH": str(REPO)}
        if mode == "sigchld":
            env[MODE_VAR] = "sigchld"
        code = _EXHAUSTED if mode == "pidfd-exhausted" else \
            "from toolseam_agent.main import main; main()"
        self.process = subprocess.Popen([sys.executable, "-S", "-B", "-c", code],
                                        stdin=theirs.fileno(), stdout=theirs.fileno(), env=env,
                                        cwd="/")
        theirs.close()
        self._answers = self._sock.makefile("rb")
        self._ids = iter(range(1, 1 << 30))

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        rid = next(self._ids)
        self._sock.sendall((json.dumps({"id": rid, "op": op, **fields}) + "\n").encode())
        while True:
            message = json.loads(self._answers.readline())
            if message.get("id") == rid:
                return dict(message)

    def ok(self, op: str, **fields: Any) -> dict[str, Any]:
        answer = self.call(op, **fields)
        assert answer["ok"], answer
        return dict(answer["result"])

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

    def zombies(self) -> list[int]:
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[1]) == self.process.pid and fields[0] == "Z":
                    out.append(int(entry.name))
        return out

    def close(self) -> None:
        self._answers.close()
        self._sock.close()
        self.process.wait(10)


@pytest.fixture(params=["pidfd", "sigchld", "pidfd-exhausted"])
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
    rid = next(agent._ids)
    agent._sock.sendall((json.dumps({"id": rid, "op": "start", "job": "j1", "spec": job,
                                     "forget": True}) + "\n").encode())
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
