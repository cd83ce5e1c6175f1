"""A durable agent's socket file appears only once it listens (toolseam_agent/session_socket.py).

The host starts a durable agent and connects as soon as the socket path exists. The agent bound
the path and then listened: a client in between was refused ("no session is listening ... it
ended"), which the suite met under load. The agent is run here with ``listen`` slowed down, the
stand-in for being preempted between the two calls.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from toolseam_agent.attach_auth import KEY_VAR, agent_key
from toolseam_agent.session_socket import ORPHAN_VAR

REPO = Path(__file__).resolve().parents[2]
_SLOW_LISTEN = """
import socket, sys, time
listen = socket.socket.listen
def slow(self, *args):
    time.sleep(0.3)
    return listen(self, *args)
socket.socket.listen = slow
from toolseam_agent.main import main
main(["--durable", sys.argv[1]])
"""


def test_the_socket_path_appears_only_when_it_listens(tmp_path: Path) -> None:
    path = str(tmp_path / "agent.sock")
    env = {"PATH": os.defpath, "PYTHONPATH": str(REPO), ORPHAN_VAR: "1",
           KEY_VAR: agent_key("s" * 32).hex()}
    agent = subprocess.Popen([sys.executable, "-c", _SLOW_LISTEN, path], env=env)
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(path):
            assert time.monotonic() < deadline, "the agent never listened"
            time.sleep(0.001)
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(path)  # refused before: the path existed 0.3 s before the listen
        client.close()
        assert agent.wait(10) == 0  # nobody attached: its orphan timeout (1 s) ends it
    finally:
        agent.kill()
        agent.wait(10)
    assert not os.path.exists(path)  # the agent removes its socket file (the renamed one)
    assert os.listdir(tmp_path) == []
