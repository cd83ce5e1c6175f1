"""``toolseam ps`` (issue 49): every live session of this user on this machine, ``--json``
with the documented fields, ``--kill`` ending one so that its owner sees ``sandbox_lost`` at
once (never a hang), and nothing for another local user."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolseam.observability.live import live_dir

from ..support.cli import run

REPO = Path(__file__).resolve().parents[2]


class Held:
    def __init__(self, base_dir: Path, engine: str = "host") -> None:
        self.base_dir = base_dir
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.live_session", str(base_dir), engine],
            cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.session_id = self.process.stdout.readline().strip()
        deadline = time.monotonic() + 60
        while not (base_dir / "started").exists():
            assert time.monotonic() < deadline and self.process.poll() is None
            time.sleep(0.05)

    def outcome(self, timeout: float) -> dict[str, object]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        self.process.wait(timeout)
        return json.loads(line)  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Held]:
    session = Held(tmp_path)
    yield session
    session.stop()


def test_ps_lists_the_session_and_kill_ends_it(held: Held) -> None:
    listed = run("ps", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    row = rows[held.session_id]
    assert set(row) >= {"id", "backend", "image", "started", "owner_pid", "durable", "calls",
                        "cpu_seconds", "memory_bytes"}
    assert row["backend"] == "host" and row["owner_pid"] == held.process.pid
    assert row["durable"] is False and row["calls"] == 0  # the call is still running
    assert row["cpu_seconds"] is not None and row["memory_bytes"] > 0
    table = run("ps")
    assert held.session_id in table.stdout and "BACKEND" in table.stdout
    killed = run("ps", "--kill", held.session_id)
    assert killed.returncode == 0, killed.stderr
    # not {"result": "ran"}: the 30 s command did not end by itself, its sandbox was ended
    assert held.outcome(timeout=60) == {"cause": "sandbox_lost"}
    assert held.session_id not in {r["id"] for r in json.loads(run("ps", "--json").stdout)}


def test_kill_of_an_unknown_session_is_refused_naming_it() -> None:
    done = run("ps", "--kill", "nosuch01")
    assert done.returncode == 2 and "no live session 'nosuch01'" in done.stderr


def test_another_user_reaches_no_session(held: Held) -> None:
    """The sockets live in this user's 0700 directory: nobody can neither list nor connect."""
    directory = live_dir()
    assert (directory.stat().st_mode & 0o777) == 0o700
    sockets = list(directory.glob("*.sock"))
    assert sockets and all((s.stat().st_mode & 0o777) == 0o600 for s in sockets)
    probe = ("import socket,sys\n"
             "s=socket.socket(socket.AF_UNIX)\n"
             "try:\n    s.connect(sys.argv[1]); print('connected')\n"
             "except OSError as e:\n    print(type(e).__name__)\n")
    done = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                           sys.executable, "-I", "-c", probe, str(sockets[0])],
                          capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"]})
    assert done.stdout.strip() == "PermissionError", (done.stdout, done.stderr)
