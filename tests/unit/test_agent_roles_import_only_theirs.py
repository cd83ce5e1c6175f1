"""The staged agent's snapshot roles (``--layer-pack``, ``--layer-apply``) run as the sandbox's
root once or twice per snapshot and restore: their start is on that path, so they must not
import the agent's server, relay or durable socket (toolseam_agent/main.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVING = {"toolseam_agent.server", "toolseam_agent.relay", "toolseam_agent.session_socket",
           "toolseam_agent.userns"}
PROBE = """
import json, sys
from toolseam_agent.main import main
try:
    main(sys.argv[1:])
except BaseException:  # the missing file: only what was imported counts
    pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith("toolseam_agent"))))
"""


@pytest.mark.parametrize("role", ["--layer-pack", "--layer-apply"])
def test_a_snapshot_role_imports_none_of_the_serving_agent(role: str, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-file")  # the role fails on it at once: only its imports count
    done = subprocess.run([sys.executable, "-S", "-c", PROBE, role, missing, missing],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
                          env={"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    imported = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert f"toolseam_agent.{'pack' if role == '--layer-pack' else 'layer'}" in imported
    assert not imported & SERVING, sorted(imported & SERVING)
