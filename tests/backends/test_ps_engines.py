"""``toolseam ps --kill`` on podman and docker (issue 49): the engine removes the session's
container, and its owner — in another process, in the middle of ``sleep 30`` — sees
``sandbox_lost`` at once; ps lists the session with its image before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..host.test_ps import Held
from ..support.cli import run

pytestmark = pytest.mark.engines


@pytest.mark.parametrize("engine", ["podman", "docker"])  # rootless: the same SDK call
def test_ps_kill_ends_a_container_session(engine: str, workspace: Path) -> None:
    held = Held(workspace, engine)
    try:
        rows = {r["id"]: r for r in json.loads(run("ps", "--json").stdout)}
        row = rows[held.session_id]
        assert row["backend"] == engine and row["image"]
        assert row["cpu_seconds"] is not None and row["memory_bytes"]
        killed = run("ps", "--kill", held.session_id)
        assert killed.returncode == 0, killed.stderr
        # not {"result": "ran"}: the 30 s command did not end by itself
        assert held.outcome(timeout=60) == {"cause": "sandbox_lost"}
    finally:
        held.stop()
