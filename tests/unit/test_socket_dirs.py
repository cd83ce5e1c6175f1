"""Bind mode's socket directories on the host do not pile up: the janitor removes those no agent
listens in (a killed client's, a durable session's after its orphan timeout), and spares a live
one and one too young to have its socket yet."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path

from toolseam.backends.containers.janitor import sweep_socket_dirs
from toolseam.backends.containers.labels import SOCKET_DIR_PREFIX
from toolseam.backends.staging import user_dir


def _made(name: str, age_s: float) -> Path:
    directory = Path(tempfile.mkdtemp(prefix=f"{SOCKET_DIR_PREFIX}{name}-", dir=user_dir("sockets")))
    old = time.time() - age_s
    os.utime(directory, (old, old))
    return directory


def test_only_directories_no_agent_listens_in_are_removed() -> None:
    stale = _made("stale", 600)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(stale / "agent.sock"))
    dead.close()  # the file stays, nobody listens: what an agent that ended leaves
    os.utime(stale, (time.time() - 600, time.time() - 600))
    empty = _made("empty", 600)
    young = _made("young", 1)
    live = _made("live", 600)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(live / "agent.sock"))
    server.listen(1)
    os.utime(live, (time.time() - 600, time.time() - 600))
    try:
        removed = sweep_socket_dirs()
        assert str(stale) in removed and str(empty) in removed
        assert not stale.exists() and not empty.exists()
        assert young.exists() and live.exists()
    finally:
        server.close()
        for directory in (young, live):
            for entry in directory.iterdir():
                entry.unlink()
            directory.rmdir()
