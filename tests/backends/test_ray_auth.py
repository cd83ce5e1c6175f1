"""Ray's token authentication in front of toolseam's node actors (issue 39, part 9): a
cluster started with ``RAY_AUTH_MODE=token`` runs toolseam sessions for a driver holding the
token, and refuses a driver without it — a ``ConfigurationError`` naming the address and what
to set, never a session."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

# Not marked ray: its cluster is its own, in a process of its own, and so are its drivers, so
# it runs beside the main run's other tests instead of in the one-process Ray run after them

SUPPORT = Path(__file__).resolve().parents[1] / "support"
DRIVER = """
import asyncio, sys
from toolseam import Toolkit
from toolseam.ray import RayBackend
async def main():
    try:
        async with Toolkit(RayBackend(address=sys.argv[1]), raise_could_not_run=True) as tk:
            print("OK", (await tk.call("bash", {"command": "echo reached"})).output.strip())
    except Exception as exc:
        print("ERR", type(exc).__name__, exc)
asyncio.run(main())
"""


@pytest.fixture(scope="module")
def token_cluster() -> Iterator[tuple[str, str]]:
    token = secrets.token_hex(32)
    head = subprocess.Popen([sys.executable, str(SUPPORT / "ray_token_head.py"), token],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert head.stdout is not None
        address = head.stdout.readline().strip()
        assert address.startswith("127.0.0.1:"), address
        yield address, token
    finally:
        assert head.stdin is not None
        head.stdin.close()
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        if head.stdout is not None:
            head.stdout.close()


def drive(address: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    done = subprocess.run([sys.executable, "-c", DRIVER, address], capture_output=True,
                          text=True, timeout=120,
                          env={**clean, "PYTHONPATH": os.getcwd(), **env})
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]


def test_a_driver_with_the_token_runs_sessions(token_cluster: tuple[str, str]) -> None:
    address, token = token_cluster
    assert drive(address, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token) == "OK reached"


def test_a_driver_without_the_token_is_refused_naming_what_to_set(
        token_cluster: tuple[str, str]) -> None:
    address, _ = token_cluster
    # side by side: Ray's own client retries a refused driver for 20 s before it gives up
    without, wrong = ({}, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)})
    with ThreadPoolExecutor(2) as both:
        answers = list(both.map(lambda env: drive(address, **env), (without, wrong)))
    for answer in answers:
        assert answer.startswith("ERR ConfigurationError"), answer
        assert address in answer and "RAY_AUTH_MODE=token" in answer
