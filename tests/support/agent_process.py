"""The sandbox agent as a process on a socketpair, started as a container's pid 1 starts it, and
a blocking client of its wire (tests that speak the agent's ops directly)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from toolseam_agent.reaper import MODE_VAR

REPO = Path(__file__).resolve().parents[2]
START = "from toolseam_agent.main import main; main()"
# How the agent learns of a child's exit: pidfds, SIGCHLD, or pidfds that work at the start and
# then cannot be had (out of descriptors, say): each job finds its leader's exit itself.
MODES = ["pidfd", "sigchld", "pidfd-exhausted"]
_EXHAUSTED = """
import errno, os
real, calls = os.pidfd_open, []
def pidfd_open(pid, flags=0):
    calls.append(pid)
    if len(calls) > 1:
        raise OSError(errno.EMFILE, "Too many open files")
    return real(pid, flags)
os.pidfd_open = pidfd_open
""" + START


class AgentProcess:
    """One agent process; ``code`` replaces how it is started (a test pinning its clock)."""

    def __init__(self, mode: str = "pidfd", code: str | None = None) -> None:
        self._sock, theirs = socket.socketpair()
        env = {"PATH": os.defpath, "PYTHONPATH": str(REPO)}
        if mode == "sigchld":
            env[MODE_VAR] = "sigchld"
        code = code or (_EXHAUSTED if mode == "pidfd-exhausted" else START)
        self.process = subprocess.Popen([sys.executable, "-S", "-B", "-c", code],
                                        stdin=theirs.fileno(), stdout=theirs.fileno(), env=env,
                                        cwd="/")
        theirs.close()
        self._answers = self._sock.makefile("rb")
        self._ids = iter(range(1, 1 << 30))
        self.pending: dict[int, dict[str, Any]] = {}

    def send(self, op: str, **fields: Any) -> int:
        rid = next(self._ids)
        self._sock.sendall((json.dumps({"id": rid, "op": op, **fields}) + "\n").encode())
        return rid

    def answer(self, rid: int) -> dict[str, Any]:
        while rid not in self.pending:
            message = json.loads(self._answers.readline())
            if "id" in message:
                self.pending[message["id"]] = message
        return self.pending.pop(rid)

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        return self.answer(self.send(op, **fields))

    def ok(self, op: str, **fields: Any) -> dict[str, Any]:
        answer = self.call(op, **fields)
        assert answer["ok"], answer
        return dict(answer["result"])

    def zombies(self) -> list[int]:
        """The agent's children that exited and were never reaped."""
        out = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
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

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)
        self._answers.close()
        self._sock.close()
